#!/usr/bin/env bash
# cuquota on a real NVIDIA GPU: the validation samples, the framework suite, and the overhead, SM-limit and
# priority benchmarks, each against a no-cuquota baseline in the same run. Results go to bench/results/ (summary: docs/real-gpu.md).
#
#   bench/real_gpu.sh stage DIR          here (cargo, the pinned nvcc): builds what the GPU machine runs into DIR
#   bench/real_gpu.sh run DIR OUT [S]    on the GPU machine (no toolchains needed): runs everything from DIR,
#                                        writes one log per phase into OUT, ends within S seconds (default 540)
#   bench/real_gpu.sh smoke DIR          on the GPU machine: one sample and one bench run, with and without cuquota
#   bench/real_gpu.sh goals DIR OUT [S]  on the GPU machine: the goals of issue 36 item 3 (tenants sharing the GPU),
#                                        each row with its no-cuquota baseline, one table (goals.log); about 4 min
#   bench/real_gpu.sh facts DIR OUT      on the GPU machine: the phases facts and elastic alone (about 2 min)
#
# Phases of `run`, in order, each bounded in time so that a hang costs one phase: facts (bench/driver_facts.c:
# the driver facts elastic memory rests on, one table), info, elastic (bench/evict_restore.c: evict/restore by
# hand against plain pinned copies), validate (validate.sh
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
    # The driver-facts probe and the evict/restore bench (elastic memory, issue 39), linked against a stub of
    # exactly the driver names they call, made from their undefined symbols.
    mkdir -p "$tmp/facts"
    for p in driver_facts evict_restore; do
        cc -O2 -Wall -I"$inc" -c "$ROOT/bench/$p.c" -o "$tmp/$p.o" || exit 2
    done
    nm -u "$tmp/driver_facts.o" "$tmp/evict_restore.o" | awk '$2 ~ /^cu/ { print "void " $2 "(void) {}" }' \
        | sort -u >"$tmp/facts/stub.c"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 "$tmp/facts/stub.c" -o "$tmp/facts/libcuda.so.1" || exit 2
    for p in driver_facts evict_restore; do
        cc "$tmp/$p.o" -o "$dir/bin/$p" -L"$tmp/facts" -l:libcuda.so.1 -ldl || exit 2
    done
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

mono() { python3 -c 'import time; print(time.monotonic_ns())'; } # CLOCK_MONOTONIC ns
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

# prio_file NODE NAME high|low: a container's own priority file as the agent sets it up (docs/priority.md):
# NODE/NAME.ROLE, seen by the container at $T/prio.NAME/priority with the node directory beside it (priority.d)
prio_file() {
    local node="$1" view="$T/prio.$2" f="$1/$2.$3"
    mkdir -p "$node" "$view"
    "$CLI" priority init "$f" >/dev/null || { echo "cuquota priority init $f failed" >&2; return 1; }
    ln -f "$f" "$view/priority" && ln -sfn "$node" "$view/priority.d" && echo "$view/priority"
}

priority() {
    local p="$DIR/bin/priority_tenant" secs=5 hpf bef
    # The best-effort tenant synchronises every 8 launches (a training loop's depth); unbounded, a real GPU
    # queues seconds of its work and the run is about that queue, not about latency.
    export PT_BE_DEPTH=8
    hpf=$(prio_file "$T/prio.node" hp high) && bef=$(prio_file "$T/prio.node" be low) || return 1
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
                under hp shim CUDA_TASK_PRIORITY=0 CUQUOTA_PRIORITY_FILE="$hpf" timeout 40 "$p" "${hp[@]}" "$start" \
                    >"$T/pr.hp.$how.$kmin" 2>&1 & a=$!
                under be shim CUDA_TASK_PRIORITY=1 CUQUOTA_PRIORITY_FILE="$bef" timeout 40 "$p" "${be[@]}" "$start" \
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
    "$CLI" priority show "$hpf" 2>&1 | head -20
}

# The goals of issue 36 item 3 that a GPU can run (the simulator's table: `throttle-bench --goals`). Tenants are
# compute_loop processes started together (START_AT), each in its own container; a figure is a tenant's launch
# rate after 0.5 s of warm-up (GOALS_SECONDS, default 5, per run) over the same kernel's unlimited rate alone;
# T = the row's tenants together without cuquota. Kernel lengths: iterations scaled from the default kernel's
# measured length.
goals() {
    local c="$DIR/target/examples/cu13/compute_loop" secs="${GOALS_SECONDS:-5}"
    under cal bare "$c" 2 >"$T/g.cal" 2>&1
    local cal; cal=$(mval steady_kernels_per_s "$T/g.cal")
    [ -n "$cal" ] || { echo "compute_loop did not run:"; tail -5 "$T/g.cal"; return 1; }
    echo "default kernel: $(awk -v r="$cal" 'BEGIN { printf "%.3f", 1000 / r }') ms (1 / rate alone), $(mval kernel_ms "$T/g.cal") ms (events)"
    iters() { awk -v us="$1" -v r="$cal" 'BEGIN { i = int(4096 * us / 1000 * r / 1000 + 0.5); print (i < 1 ? 1 : i) }'; }
    declare -A alone=()
    ROW=0
    # runset TAG SPEC...: SPEC = KERNEL_US:bare|free|hard:L|burst:L:W; prints each tenant's rate / alone
    runset() {
        local tag="$1"; shift
        local start=$(($(mono) + 2000000000)) i=0 pids=() spec us how l w
        for spec in "$@"; do
            IFS=: read -r us how l w <<<"$spec"
            # each tenant its own container (usage file), new for every run
            local args=("$c" "$secs" 0 "$(iters "$us")" "$start") o="$T/g.$tag.$i" n="g.$tag.$i"
            case "$how" in
            bare) under "$n" bare timeout 60 "${args[@]}" >"$o" 2>&1 & ;;
            free) under "$n" shim timeout 60 "${args[@]}" >"$o" 2>&1 & ;;
            hard) under "$n" shim CUDA_DEVICE_SM_LIMIT="$l" CUQUOTA_POLICY=hard timeout 60 "${args[@]}" >"$o" 2>&1 & ;;
            burst) under "$n" shim CUDA_DEVICE_SM_LIMIT="$l" CUQUOTA_POLICY=burst CUQUOTA_WEIGHT="$w" \
                timeout 60 "${args[@]}" >"$o" 2>&1 & ;;
            esac
            pids+=($!); i=$((i + 1))
        done
        wait "${pids[@]}"
        i=0
        for spec in "$@"; do
            local r; r=$(mval steady_kernels_per_s "$T/g.$tag.$i")
            [ -n "$r" ] || { echo "FAILED $tag $spec:" >&2; tail -3 "$T/g.$tag.$i" >&2; r=0; }
            awk -v r="$r" -v a="${alone[${spec%%:*}]:-$r}" 'BEGIN { printf "%.4f ", (a > 0 ? r / a : 0) }'
            i=$((i + 1))
        done
    }
    for us in 50 400 5000; do
        alone[$us]=$(runset "alone$us" "$us:bare" >/dev/null; mval steady_kernels_per_s "$T/g.alone$us.0")
    done
    echo "unlimited alone, kernels/s: 50 us ${alone[50]}, 0.4 ms ${alone[400]}, 5 ms ${alone[5000]}"
    printf '\n| goal | kernels | no cuquota (T) | cuquota (sum) | target | result |\n|---|---|---|---|---|---|\n'
    # goal_row NAME KERNELS GOAL SPEC...: GOAL share|burst|alone (bands as in bench-throttle/src/goals.rs)
    goal_row() {
        local name="$1" kern="$2" goal="$3"; shift 3
        local base="1" got bare=() spec
        for spec in "$@"; do bare+=("${spec%%:*}:bare"); done
        ROW=$((ROW + 1))
        [ "$goal" = alone ] || base=$(runset "b$ROW" "${bare[@]}")
        got=$(runset "c$ROW" "$@")
        awk -v name="$name" -v kern="$kern" -v goal="$goal" -v base="$base" -v got="$got" -v specs="$*" '
        function f3(a, n,   s, i) { s = ""; for (i = 1; i <= n; i++) s = s (i > 1 ? " + " : "") sprintf("%.3f", a[i]); return s }
        BEGIN {
            nb = split(base, b, " "); n = split(got, x, " "); split(specs, sp, " ")
            T = 0; for (i = 1; i <= nb; i++) T += b[i]
            S = 0; for (i = 1; i <= n; i++) S += x[i]
            SL = 0; free = 0; W = 0
            for (i = 1; i <= n; i++) {
                m = split(sp[i], p, ":"); how[i] = p[2]; L[i] = (m > 2 ? p[3] / 100 : -1); w[i] = (m > 3 ? p[4] : 0)
                if (L[i] >= 0) SL += L[i]; else free = 1
                W += w[i]
            }
            miss = ""; tgt = ""
            if (goal == "share") {
                tot = free ? 1 : SL
                for (i = 1; i <= n; i++) {
                    if (L[i] < 0) { tgt = tgt (i > 1 ? " + " : "") "-"; continue }
                    lo = L[i] / tot * T - 0.015; hi = L[i] + 0.01
                    tgt = tgt (i > 1 ? " + " : "") sprintf("[%.3f, %.3f]", lo, hi)
                    if (x[i] < lo) miss = miss sprintf("%d %%: %.1f points under; ", L[i] * 100, (lo - x[i]) * 100)
                    if (x[i] > hi) miss = miss sprintf("%d %%: %.1f points over; ", L[i] * 100, (x[i] - hi) * 100)
                }
                if (!free) { tgt = tgt sprintf("; sum >= %.3f", 0.97 * T)
                    if (S < 0.97 * T) miss = miss sprintf("sum %.1f points under; ", (0.97 * T - S) * 100) }
            } else if (goal == "burst") {
                spare = S - SL
                for (i = 1; i <= n; i++) {
                    want = L[i] + spare * w[i] / W
                    tgt = tgt (i > 1 ? " + " : "") sprintf("%.3f", want)
                    if (x[i] < L[i]) miss = miss sprintf("%d %%: under its limit by %.1f points; ", L[i] * 100, (L[i] - x[i]) * 100)
                    d = x[i] - want; if (d < 0) d = -d
                    if (d > 0.03) miss = miss sprintf("%d %%: %.1f points from its part of the spare; ", L[i] * 100, d * 100)
                }
                tgt = sprintf("each >= its limit; split of the spare %.3f: %s (+- 0.03)", spare, tgt)
            } else {
                d = x[1] - L[1]; if (d < 0) d = -d
                tgt = sprintf("[%.3f, %.3f]", L[1] - 0.01, L[1] + 0.01)
                if (d > 0.01) miss = sprintf("%.1f points from the limit; ", d * 100)
            }
            printf "| %s | %s | %s (%.3f) | %s (%.3f) | %s | %s |\n", name, kern, (goal == "alone" ? "1 (alone)" : f3(b, nb)),
                T, f3(x, n), S, tgt, (miss == "" ? "PASS" : "**FAIL** (" substr(miss, 1, length(miss) - 2) ")")
        }'
    }
    goal_row "hard 30 + 70, 0.4 ms kernels" "0.4 ms" share 400:hard:30 400:hard:70
    goal_row "hard 30 + 70, 50 us kernels" "50 us" share 50:hard:30 50:hard:70
    goal_row "hard 30 + 70, 5 ms kernels" "5 ms" share 5000:hard:30 5000:hard:70
    goal_row "hard 30 (50 us) + 70 (5 ms)" "50 us / 5 ms" share 50:hard:30 5000:hard:70
    goal_row "hard 30 (5 ms) + 70 (50 us)" "5 ms / 50 us" share 5000:hard:30 50:hard:70
    goal_row "hard 20 / 30 / 50, 0.4 ms" "0.4 ms" share 400:hard:20 400:hard:30 400:hard:50
    goal_row "burst 25 + 25, weights 1 : 3, 0.4 ms" "0.4 ms" burst 400:burst:25:100 400:burst:25:300
    goal_row "hard 30 + an uncapped container, 0.4 ms" "0.4 ms" share 400:hard:30 400:free
    goal_row "hard 30 alone, 0.4 ms" "0.4 ms" alone 400:hard:30
    goal_row "hard 70 alone, 0.4 ms" "0.4 ms" alone 400:hard:70
    goals_priority
    echo "(rate = kernels launched per second after 0.5 s over ${secs} s runs, over the same kernel's rate alone)"
}

# The priority goal: high-priority p99 <= alone + one best-effort kernel + one quantum (taken as 2 ms, the
# simulator's calibrated slice), best effort >= 85 % of the time the high-priority tenant leaves idle.
goals_priority() {
    local p="$DIR/bin/priority_tenant" secs="${GOALS_SECONDS:-5}" hpf bef
    hpf=$(prio_file "$T/gprio.node" ghp high) && bef=$(prio_file "$T/gprio.node" gbe low) || return 1
    local hp=(hp "$secs" 20 200000 10000000 40000000 7) be=(be "$secs" 1000000 2000000 11)
    lat() { sed -n 's/^lat_ns=//p' "$1" | tr ',' '\n' | grep -v '^$'; }
    pair() { # bare|shim: the two tenants together, outputs $T/gp.hp.$1 and $T/gp.be.$1
        local start=$(($(mono) + 1500000000)) a b
        if [ "$1" = bare ]; then
            under hp bare timeout 40 "$p" "${hp[@]}" "$start" >"$T/gp.hp.$1" 2>&1 & a=$!
            under be bare env PT_BE_DEPTH=8 timeout 40 "$p" "${be[@]}" "$start" >"$T/gp.be.$1" 2>&1 & b=$!
        else
            under hp shim CUDA_TASK_PRIORITY=0 CUQUOTA_PRIORITY_FILE="$hpf" timeout 40 "$p" "${hp[@]}" "$start" \
                >"$T/gp.hp.$1" 2>&1 & a=$!
            under be shim CUDA_TASK_PRIORITY=1 CUQUOTA_PRIORITY_FILE="$bef" PT_BE_DEPTH=8 timeout 40 "$p" "${be[@]}" \
                "$start" >"$T/gp.be.$1" 2>&1 & b=$!
        fi
        wait $a $b
    }
    under hp bare timeout 40 "$p" "${hp[@]}" >"$T/gp.alone" 2>&1
    pair bare; pair shim
    # best effort's share of idle: its device time over the window less the high-priority tenant's
    idle() { awk -v b="$(val busy_ns "$T/gp.be.$1")" -v h="$(val busy_ns "$T/gp.hp.$1")" -v s="$secs" \
        'BEGIN { printf "%.1f", (s * 1e9 - h > 0 ? 100 * b / (s * 1e9 - h) : 0) }'; }
    local a99 b99 s99
    a99=$(lat "$T/gp.alone" | pct 99); b99=$(lat "$T/gp.hp.bare" | pct 99); s99=$(lat "$T/gp.hp.shim" | pct 99)
    awk -v a="${a99:-0}" -v b="${b99:-0}" -v s="${s99:-0}" -v ib="$(idle bare)" -v is="$(idle shim)" 'BEGIN {
        g = a + 2000000 + 2000000; miss = ""
        if (s > g || s == 0) miss = miss sprintf("p99 %.2f ms over; ", (s - g) / 1e6)
        if (is < 85) miss = miss sprintf("share %.1f points under; ", 85 - is)
        printf "| priority, best effort 1-2 ms kernels, synchronising every 8 | 20 x 200 us bursts | p99 %.2f ms, best effort %.1f %% of idle (alone: p99 %.2f ms) | p99 %.2f ms, best effort %.1f %% of idle | p99 <= %.2f ms; >= 85 %% of idle | %s |\n",
            b / 1e6, ib, a / 1e6, s / 1e6, is, g / 1e6, (miss == "" ? "PASS" : "**FAIL** (" substr(miss, 1, length(miss) - 2) ")") }'
}

# The driver facts elastic memory rests on (bench/driver_facts.c): one table, each answer with how it was measured.
facts() {
    "$DIR/bin/driver_facts"
}

# Elastic memory's evict/restore done by hand (bench/evict_restore.c), as ratios against a plain pinned copy of
# the same size in the same run (issue 39 item 5: restore >= 0.80 of host-to-device, evict >= 0.80 of
# device-to-host, mapping cost included); host memory "fresh" (created per eviction) or "pool" (one kept).
elastic() {
    printf '| size | host memory | evict GB/s | plain D2H GB/s | evict / plain | restore GB/s | plain H2D GB/s | restore / plain | evict steps ms | restore steps ms |\n'
    printf '| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n'
    for mib in 64 256 1024; do
        for how in fresh pool; do
            local o="$T/er.$mib.$how" arg=""
            [ "$how" = pool ] && arg=pool
            # shellcheck disable=SC2086
            "$DIR/bin/evict_restore" "$mib" 5 $arg >"$o" 2>&1 || { echo "FAILED $mib MiB $how:"; tail -3 "$o"; continue; }
            awk -F= -v mib="$mib" -v how="$how" '{ v[$1] = $2 } END {
                b = v["bytes"]
                split(v["evict_steps_ns"], e, ","); split(v["restore_steps_ns"], r, ",")
                es = sprintf("%.1f / %.1f / %.1f / %.1f / %.1f", e[1] / 1e6, e[2] / 1e6, e[3] / 1e6, e[4] / 1e6, e[5] / 1e6)
                rs = sprintf("%.1f / %.1f / %.1f / %.1f / %.1f", r[1] / 1e6, r[2] / 1e6, r[3] / 1e6, r[4] / 1e6, r[5] / 1e6)
                printf "| %d MiB | %s | %.2f | %.2f | %.3f | %.2f | %.2f | %.3f | %s | %s |\n", mib, how, b / v["evict_ns"],
                    b / v["plain_d2h_wall_ns"], v["plain_d2h_wall_ns"] / v["evict_ns"], b / v["restore_ns"],
                    b / v["plain_h2d_wall_ns"], v["plain_h2d_wall_ns"] / v["restore_ns"], es, rs }' "$o"
            grep -q '^intact=1' "$o" || echo "**CONTENT DIFFERED** at $mib MiB, $how"
        done
    done
    echo "(medians of 5 cycles, wall clock; steps: create / map + access / copy / unmap + release / remap + access)"
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
stage) [ $# -eq 2 ] || { sed -n '2,20p' "$0"; exit 2; }; stage "$2" ;;
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
goals)
    [ $# -ge 3 ] || { sed -n '2,20p' "$0"; exit 2; }
    setup_run "$2"
    OUT="$3"; mkdir -p "$OUT"
    DEADLINE=$(($(now) + ${4:-360}))
    phase info 30
    phase goals $((${4:-360} - 40))
    cat "$OUT/goals.log"
    ;;
facts)
    [ $# -ge 3 ] || { sed -n '2,20p' "$0"; exit 2; }
    setup_run "$2"
    OUT="$3"; mkdir -p "$OUT"
    DEADLINE=$(($(now) + 240))
    phase facts 120
    phase elastic 110
    cat "$OUT/facts.log" "$OUT/elastic.log"
    ;;
run)
    [ $# -ge 3 ] || { sed -n '2,20p' "$0"; exit 2; }
    setup_run "$2"
    OUT="$3"; mkdir -p "$OUT"
    DEADLINE=$(($(now) + ${4:-540}))
    for p in "facts 120" "info 30" "elastic 90" "validate 150" "overhead 70" "sm 80" "priority 60" "frameworks 600"; do
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
*) sed -n '2,20p' "$0"; exit 2 ;;
esac
