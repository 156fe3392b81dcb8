#!/usr/bin/env bash
# cuquota on a real NVIDIA GPU: the validation samples, the framework suite, and the overhead, SM-limit and
# priority benchmarks, each against a no-cuquota baseline in the same run. Results go to bench/results/ (summary: docs/real-gpu.md).
#
#   bench/real_gpu.sh stage DIR          here (cargo, the pinned nvcc): builds what the GPU machine runs into DIR
#   bench/real_gpu.sh run DIR OUT [S]    on the GPU machine (no toolchains needed): runs everything from DIR,
#                                        writes one log per phase into OUT, ends within S seconds (default 540)
#   bench/real_gpu.sh smoke DIR          on the GPU machine: one sample and one bench run, with and without cuquota
#
# Phases of `run`, in order, each bounded in time so that a hang costs one phase: info, validate (validate.sh
# --prebuilt: samples under caps and SM limits), overhead (bench/alloc_bench.c: ns per alloc/free pair,
# cuMemGetInfo and empty-kernel launch, 1 and 8 threads), sm (compute_loop's kernel rate under hard limits,
# alone and two tenants at once, relative to the unlimited rate), priority (shim-tests/c/priority_tenant.c:
# a latency-critical tenant's burst latency next to a best-effort one), frameworks (tests/frameworks/run.sh with
# the machine's own Python; what time is left).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

stage() {
    local dir="$1"
    mkdir -p "$dir/target/release" "$dir/bin"
    (cd "$ROOT" && cargo build --quiet --release -p cuquota -p cuquota-cli) || exit 2
    for f in libcuquota.so cuquota; do
        objcopy --strip-debug "$ROOT/target/release/$f" "$dir/target/release/$f" || exit 2
    done
    "$ROOT/examples/build.sh" --cuda 13 --out "$dir/target/examples/cu13" >/dev/null || exit 2
    local inc="$ROOT/.deps/cu13/nvidia/cu13/include" tmp
    tmp="$(mktemp -d)"
    # Linked against a stub with the driver's soname: on the GPU machine the real libcuda.so.1 answers.
    cc -O2 -shared -fPIC -fvisibility=hidden -Wl,-soname,libcuda.so.1 -I"$inc" "$ROOT/bench/stub_driver.c" \
        -o "$tmp/libcuda.so.1" || exit 2
    cc -O2 -Wall -I"$inc" "$ROOT/bench/alloc_bench.c" -o "$dir/bin/alloc_bench" -L"$tmp" -l:libcuda.so.1 \
        -lpthread -ldl || exit 2
    cc -O2 -Wall -I"$inc" "$ROOT/shim-tests/c/priority_tenant.c" -o "$dir/bin/priority_tenant" -ldl || exit 2
    rm -rf "$tmp"
    git -C "$ROOT" rev-parse --short HEAD >"$dir/commit"
    du -sh "$dir"
}

# --- on the GPU machine -------------------------------------------------------------------------------------
DIR="" OUT="" SHIM="" CLI="" T="" DEADLINE="${DEADLINE:-0}"
now() { date +%s; }
left() { echo $((DEADLINE - $(now))); }
phase() { # NAME SECONDS: runs one phase (a function below, in a fresh copy of this script) with its log in
    # $OUT/NAME.log, bounded by SECONDS and the deadline
    local name="$1" secs="$2"
    local l; l=$(left)
    [ "$secs" -le "$l" ] || secs=$l
    if [ "$secs" -lt 10 ]; then echo "== $name: skipped, no time left" | tee -a "$OUT/summary.txt"; return; fi
    echo "== $name (up to ${secs} s) $(date -u +%H:%M:%S)"
    local t0; t0=$(now)
    DEADLINE=$DEADLINE timeout -k 5 "$secs" bash "$0" _phase "$name" "$DIR" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $(($(now) - t0)) s" | tee -a "$OUT/summary.txt"
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
# pct P: the P-th percentile (nearest rank) of the numbers on stdin
pct() { sort -g | awk -v p="$1" '{ v[NR] = $1 } END { if (NR) { i = int(NR * p / 100 + 0.999); if (i < 1) i = 1; print v[i] } }'; }
val() { sed -n "s/^$1=//p" "$2" | tail -1; }
mval() { val "metric $1" "$2"; }

# One run of a program, in its own container (usage file), with KEY=VALUE settings; "bare" = without cuquota.
under() { # NAME bare|shim CMD... (environment from the caller)
    local name="$1" how="$2"; shift 2
    if [ "$how" = bare ]; then
        env -u LD_PRELOAD "$@"
    else
        env LD_PRELOAD="$SHIM" CUQUOTA_USAGE_FILE="$T/usage.$name" "$@"
    fi
}

info() {
    date -u '+%Y-%m-%d %H:%M UTC'
    echo "commit $(cat "$DIR/commit" 2>/dev/null)"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    nvidia-smi -q | sed -n '/CUDA Version/p; /Compute Mode/p; /MIG Mode/,+2p; /Persistence Mode/p'
    uname -r; nproc; grep -m1 'model name' /proc/cpuinfo
    python3 -c 'import importlib.metadata as m, sys
for n in ("torch", "cupy-cuda13x", "cuda-bindings", "nvidia-ml-py", "pytest", "pytest-timeout"):
    try:
        print(n, m.version(n))
    except m.PackageNotFoundError:
        print(n, "-")'
    ldconfig -p | grep -E 'libcuda\.so\.1|libnvidia-ml\.so\.1'
}

overhead() {
    local b="$DIR/bin/alloc_bench" reps=3
    printf '%-8s %-8s %8s %12s %12s %12s %10s %7s\n' mode setting threads "bare ns/op" "shim ns/op" "wall ns/op" \
        "added ns" ratio
    for mode in pair info launch; do
        local iters=4000; [ "$mode" = info ] && iters=20000; [ "$mode" = launch ] && iters=20000
        for setting in nolimit cap64g; do
            [ "$mode" = launch ] || [ "$setting" = cap64g ] || continue
            for th in 1 8; do
                local bs=() ss=() ws=()
                for _ in $(seq $reps); do
                    local o; o="$T/o.$mode.$setting.$th"
                    under bench bare "$b" "$mode" "$th" "$iters" >"$o.bare" 2>&1
                    if [ "$setting" = cap64g ]; then
                        under bench shim CUDA_DEVICE_MEMORY_LIMIT=64g "$b" "$mode" "$th" "$iters" >"$o.shim" 2>&1
                    else
                        under bench shim "$b" "$mode" "$th" "$iters" >"$o.shim" 2>&1
                    fi
                    [ "$(val failed "$o.bare")" = 0 ] && [ "$(val failed "$o.shim")" = 0 ] \
                        || { echo "FAILED $mode $setting $th:"; tail -3 "$o.bare" "$o.shim"; continue 2; }
                    bs+=("$(val cpu_ns_per_op "$o.bare")"); ss+=("$(val cpu_ns_per_op "$o.shim")")
                    ws+=("$(val wall_ns_per_op "$o.shim")")
                done
                local mb ms mw
                mb=$(printf '%s\n' "${bs[@]}" | median); ms=$(printf '%s\n' "${ss[@]}" | median)
                mw=$(printf '%s\n' "${ws[@]}" | median)
                awk -v m="$mode" -v s="$setting" -v t="$th" -v b="$mb" -v x="$ms" -v w="$mw" \
                    'BEGIN { printf "%-8s %-8s %8d %12.0f %12.0f %12.0f %10.0f %7.2f\n", m, s, t, b, x, w, x - b, x / b }'
            done
        done
    done
    echo "(cpu ns per op: medians of $reps runs each, bare and shim interleaved; wall = shim's wall ns per op)"
}

sm() {
    local c="$DIR/target/examples/cu13/compute_loop" secs=3
    rate() { mval kernels_per_s "$1"; }
    under base bare "$c" "$secs" >"$T/sm.base" 2>&1
    local base; base=$(rate "$T/sm.base")
    echo "unlimited (no cuquota): $base kernels/s; $(mval kernel_ms "$T/sm.base") ms per kernel (events)"
    grep -E '^metric' "$T/sm.base" | head -20
    printf '%-22s %-8s %14s %10s\n' run limit "kernels/s" "rate/base"
    show() { awk -v n="$1" -v l="$2" -v r="$3" -v b="$base" \
        'BEGIN { printf "%-22s %-8s %14.1f %10.3f\n", n, l, r, (b > 0 ? r / b : 0) }'; }
    for l in 10 25 50 75 90; do
        under "l$l" shim CUDA_DEVICE_SM_LIMIT=$l GPU_CORE_UTILIZATION_POLICY=FORCE "$c" "$secs" >"$T/sm.$l" 2>&1
        show "alone, hard" "$l" "$(rate "$T/sm.$l")"
    done
    under d30 shim CUDA_DEVICE_SM_LIMIT=30 "$c" "$secs" >"$T/sm.d30" 2>&1
    show "alone, default policy" 30 "$(rate "$T/sm.d30")"
    # Long kernels (16x the iterations).
    local blocks=0 # the sample's default, 64 per SM
    under longbase bare "$c" "$secs" "$blocks" 65536 >"$T/sm.lbase" 2>&1
    local lbase; lbase=$(rate "$T/sm.lbase")
    echo "long kernels unlimited: $lbase kernels/s; $(mval kernel_ms "$T/sm.lbase") ms per kernel"
    for l in 25 50; do
        under "ll$l" shim CUDA_DEVICE_SM_LIMIT=$l GPU_CORE_UTILIZATION_POLICY=FORCE "$c" "$secs" "$blocks" 65536 \
            >"$T/sm.l$l" 2>&1
        awk -v l="$l" -v r="$(rate "$T/sm.l$l")" -v b="$lbase" \
            'BEGIN { printf "%-22s %-8s %14.1f %10.3f\n", "alone, hard, long", l, r, (b > 0 ? r / b : 0) }'
    done
    # Two tenants at once: without cuquota (the GPU time-slices them), then at 30/70 hard.
    under p1 bare "$c" "$secs" >"$T/sm.p1" 2>&1 & local a=$!
    under p2 bare "$c" "$secs" >"$T/sm.p2" 2>&1 & local b=$!
    wait $a $b
    show "pair, no cuquota" - "$(rate "$T/sm.p1")"; show "pair, no cuquota" - "$(rate "$T/sm.p2")"
    under t30 shim CUDA_DEVICE_SM_LIMIT=30 GPU_CORE_UTILIZATION_POLICY=FORCE "$c" "$secs" >"$T/sm.t30" 2>&1 & a=$!
    under t70 shim CUDA_DEVICE_SM_LIMIT=70 GPU_CORE_UTILIZATION_POLICY=FORCE "$c" "$secs" >"$T/sm.t70" 2>&1 & b=$!
    wait $a $b
    show "pair, hard" 30 "$(rate "$T/sm.t30")"; show "pair, hard" 70 "$(rate "$T/sm.t70")"
    echo "(rate/base: kernels/s over the unlimited run alone, same kernel; each run ${secs} s)"
}

priority() {
    local p="$DIR/bin/priority_tenant" secs=5 pf="$T/priority"
    # The best-effort tenant synchronises every 8 launches (a training loop's depth); unbounded, a real GPU
    # queues seconds of its work and the run is about that queue, not about latency.
    export PT_BE_DEPTH=8
    "$CLI" priority init "$pf" || { echo "cuquota priority init failed"; return 1; }
    lat() { sed -n 's/^lat_ns=//p' "$1" | tr ',' '\n' | grep -v '^$'; }
    row() { # label hp-output be-output
        local p50 p99 mx n bek
        p50=$(lat "$2" | pct 50); p99=$(lat "$2" | pct 99); mx=$(lat "$2" | pct 100); n=$(lat "$2" | wc -l)
        bek="-"; [ -z "$3" ] || bek=$(awk -v k="$(val busy_ns "$3")" -v s="$secs" 'BEGIN { printf "%.0f%%", k / (s * 1e7) }')
        awk -v l="$1" -v a="${p50:-0}" -v b="${p99:-0}" -v c="${mx:-0}" -v n="$n" -v k="$bek" \
            'BEGIN { printf "%-34s %6d %10.2f %10.2f %10.2f %12s\n", l, n, a / 1e6, b / 1e6, c / 1e6, k }'
    }
    printf '%-34s %6s %10s %10s %10s %12s\n' run bursts "p50 ms" "p99 ms" "max ms" "be busy"
    local hp=(hp "$secs" 20 200000 10000000 40000000 7)
    under hp bare "$p" "${hp[@]}" >"$T/pr.alone" 2>&1
    row "high-priority alone" "$T/pr.alone" ""
    for k in "1000000 2000000"; do
        read -r kmin kmax <<<"$k"
        local be=(be "$secs" "$kmin" "$kmax" 11) start
        for how in bare shim; do
            # START_AT_NS is CLOCK_MONOTONIC
            start=$(($(python3 -c 'import time; print(time.monotonic_ns())') + 1500000000))
            if [ "$how" = bare ]; then
                under hp bare timeout 40 "$p" "${hp[@]}" "$start" >"$T/pr.hp.$how.$kmin" 2>&1 & a=$!
                under be bare timeout 40 "$p" "${be[@]}" "$start" >"$T/pr.be.$how.$kmin" 2>&1 & b=$!
            else
                under hp shim CUDA_TASK_PRIORITY=0 CUQUOTA_PRIORITY_FILE="$pf" timeout 40 "$p" "${hp[@]}" "$start" \
                    >"$T/pr.hp.$how.$kmin" 2>&1 & a=$!
                under be shim CUDA_TASK_PRIORITY=1 CUQUOTA_PRIORITY_FILE="$pf" timeout 40 "$p" "${be[@]}" "$start" \
                    >"$T/pr.be.$how.$kmin" 2>&1 & b=$!
            fi
            wait $a $b
            local label="no cuquota"; [ "$how" = shim ] && label="cuquota priority 0/1"
            row "$label, be $((kmin / 1000000))-$((kmax / 1000000)) ms" "$T/pr.hp.$how.$kmin" "$T/pr.be.$how.$kmin"
            grep -q '^lat_ns=' "$T/pr.hp.$how.$kmin" || tail -n 5 "$T/pr.hp.$how.$kmin" "$T/pr.be.$how.$kmin"
        done
    done
    echo "(high-priority: bursts of 20 x 200 us kernels, 10-40 ms apart, ${secs} s; latency from the first launch to"
    echo " cuStreamSynchronize's return; be busy = the best-effort tenant's kernel time over the window; it"
    echo " synchronises every $PT_BE_DEPTH launches)"
    "$CLI" priority show "$pf" 2>&1 | head -20
}

frameworks() {
    local secs; secs=$(($(left) - 15))
    [ "$secs" -ge 10 ] || { echo "no time left"; return 1; }
    local py="${CUQUOTA_FW_PYTHON:-python3}" opts=""
    # pytest-timeout, where the machine has it: one hung test costs 120 s, not the phase.
    "$py" -c 'import pytest_timeout' 2>/dev/null && opts="--timeout=120"
    PYTEST_ADDOPTS="$opts" CUQUOTA_FW_PYTHON="$py" CARGO_TARGET_DIR="$DIR/target" \
        CUQUOTA_TEST_PROFILE=release CUQUOTA_TEST_SHIM="$SHIM" timeout -k 5 "$secs" \
        "$ROOT/tests/frameworks/run.sh" --no-build ${FW_ARGS:-}
}

setup_run() {
    DIR="$(cd "$1" && pwd)"
    SHIM="$DIR/target/release/libcuquota.so" CLI="$DIR/target/release/cuquota"
    T="$(mktemp -d)"
    chmod +x "$DIR"/bin/* "$DIR"/target/release/cuquota "$DIR"/target/examples/cu13/* 2>/dev/null
}

case "${1:-}" in
stage) [ $# -eq 2 ] || { sed -n '2,16p' "$0"; exit 2; }; stage "$2" ;;
smoke)
    setup_run "$2"
    info
    for how in bare shim; do
        echo "--- vector_add, $how"
        under smoke "$how" CUDA_DEVICE_MEMORY_LIMIT=4g "$DIR/target/examples/cu13/vector_add" 2>&1 | tail -4
        echo "--- alloc_bench launch, $how"
        under smoke "$how" CUDA_DEVICE_MEMORY_LIMIT=4g "$DIR/bin/alloc_bench" launch 1 2000 2>&1 | tail -3
    done
    ;;
run)
    [ $# -ge 3 ] || { sed -n '2,16p' "$0"; exit 2; }
    setup_run "$2"
    OUT="$3"; mkdir -p "$OUT"
    DEADLINE=$(($(now) + ${4:-540}))
    for p in "info 30" "validate 150" "overhead 70" "sm 80" "priority 60" "frameworks 600"; do
        # shellcheck disable=SC2086
        phase $p
    done
    cp "$DIR/target/frameworks-results.txt" "$OUT/frameworks-results.txt" 2>/dev/null
    cat "$OUT/summary.txt"
    ;;
_phase)
    setup_run "$3"
    [ "$DEADLINE" -gt 0 ] || DEADLINE=$(($(now) + 600))
    case "$2" in
    validate) env CARGO_TARGET_DIR="$DIR/target" "$ROOT/validate.sh" --prebuilt --shim "$SHIM" ;;
    *) "$2" ;;
    esac
    ;;
*) sed -n '2,16p' "$0"; exit 2 ;;
esac
