#!/usr/bin/env bash
# Validation runner: builds the CUDA samples in examples/ and runs each one without and with cuquota, under a set
# of memory caps and SM limits, then prints one table row per expectation. Exits non-zero on any FAIL.
#
#   ./validate.sh [--cuda 13|12] [--caps "1g 4g"] [--sms "30 100"] [--quick] [--only "vector_add oom_probe"]
#                 [--profile release|debug] [--no-cargo] [--prebuilt] [--shim PATH] [--sim PATH] [--seconds 2]
#                 [--frameworks]
#
# On a machine with an NVIDIA driver (libcuda.so.1 in ldconfig, or /dev/nvidiactl) the samples run on the GPU.
# Anywhere else they run on the simulated GPU (libcudasim.so answering as libcuda.so.1 / libnvidia-ml.so.1), with a
# fresh CUDASIM_STATE and CUQUOTA_USAGE_FILE per run. --quick runs only the functional samples, once without and
# once with cuquota. --frameworks also runs the framework suite (PyTorch, CuPy, cuda-python, pynvml; needs
# `scripts/setup.sh frameworks` once) on the same device, with its no-cuquota baseline. --prebuilt builds nothing
# (no cargo, no nvcc): the samples must already be in $CARGO_TARGET_DIR/examples/cu<ver>, as on a GPU machine
# without the toolchains (bench/real_gpu.sh stages them). See docs/examples.md.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")" && pwd)"

CUDA=13 CAPS="1g 4g" SMS="30 100" QUICK=0 ONLY="" PROFILE=release BUILD=1 SAMPLES_BUILD=1 SHIM="" SIM="" SECONDS_LOOP=2 FRAMEWORKS=0
while [ $# -gt 0 ]; do
    case "$1" in
        --cuda) CUDA="$2"; shift 2 ;;
        --caps) CAPS="$2"; shift 2 ;;
        --sms) SMS="$2"; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --only) ONLY="$2"; shift 2 ;;
        --profile) PROFILE="$2"; shift 2 ;;
        --no-cargo) BUILD=0; shift ;;
        --prebuilt) BUILD=0; SAMPLES_BUILD=0; shift ;;
        --shim) SHIM="$2"; shift 2 ;;
        --sim) SIM="$2"; shift 2 ;;
        --seconds) SECONDS_LOOP="$2"; shift 2 ;;
        --frameworks) FRAMEWORKS=1; shift ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "validate.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

log() { echo "validate.sh: $*" >&2; }

REAL=0
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' || [ -e /dev/nvidiactl ]; then REAL=1; fi

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
SHIM="${SHIM:-$TARGET/$PROFILE/libcuquota.so}"
SIM="${SIM:-$TARGET/$PROFILE/libcudasim.so}"
if [ "$BUILD" = 1 ]; then
    flags=(); [ "$PROFILE" = release ] && flags=(--release)
    pkgs=(-p cuquota); [ "$REAL" = 1 ] || pkgs+=(-p cuquota-sim)
    (cd "$ROOT" && cargo build --quiet "${flags[@]}" "${pkgs[@]}") || { log "cargo build failed"; exit 2; }
fi
[ -f "$SHIM" ] || { log "no $SHIM"; exit 2; }
[ "$REAL" = 1 ] || [ -f "$SIM" ] || { log "no $SIM"; exit 2; }

BIN="$TARGET/examples/cu$CUDA"
if [ "$SAMPLES_BUILD" = 1 ]; then
    "$ROOT/examples/build.sh" --cuda "$CUDA" --out "$BIN" >/dev/null || { log "building the samples failed"; exit 2; }
fi
[ -x "$BIN/vector_add" ] || { log "no samples in $BIN"; exit 2; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/cuquota-validate.XXXXXX")"
BG_PID=""
cleanup() { [ -z "$BG_PID" ] || kill "$BG_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

# The simulated GPU: 16 GiB, 132 SMs, 256 MiB per context (as the DESIGN defaults).
SIM_MEMORY=16g
if [ "$REAL" = 0 ]; then
    mkdir -p "$WORK/lib"
    ln -s "$SIM" "$WORK/lib/libcuda.so.1"
    ln -s "$SIM" "$WORK/lib/libnvidia-ml.so.1"
    # Reads the simulated device's timeline: the ground truth for GPU-time shares.
    OBSERVER="$WORK/sim_observer"
    cc -O2 "$ROOT/shim-tests/c/sim_observer.c" -o "$OBSERVER" -L"$WORK/lib" -l:libcuda.so.1 \
        || { log "cannot compile shim-tests/c/sim_observer.c"; exit 2; }
fi

bytes() { # 1g -> bytes
    local v="${1%[kKmMgGtT]}" u="${1: -1}"
    case "$u" in k|K) echo $((v << 10)) ;; m|M) echo $((v << 20)) ;; g|G) echo $((v << 30)) ;; t|T) echo $((v << 40)) ;;
        *) echo "$1" ;; esac
}
human() { awk -v b="$1" 'BEGIN { if (b == "") { print "?"; exit } if (b >= 2^30) printf "%.2fg", b / 2^30; else printf "%.0fm", b / 2^20 }'; }

RUN_N=0
# run_env CAP SM STATE: prints the env assignments of one run (CAP/SM "-" = without cuquota).
run_env() {
    local cap="$1" sm="$2" state="$3"
    local e=()
    if [ "$REAL" = 0 ]; then
        e+=(LD_LIBRARY_PATH="$WORK/lib" CUDASIM_STATE="$WORK/state.$state" CUDASIM_MEMORY="$SIM_MEMORY"
            CUDASIM_CTX_OVERHEAD=256m CQ_SAMPLES_SIMULATED=1)
    fi
    if [ "$cap" != "-" ] || [ "$sm" != "-" ]; then
        e+=(LD_PRELOAD="$SHIM" CUQUOTA_USAGE_FILE="$WORK/usage.$state")
        [ "$cap" = "-" ] || e+=(CUDA_DEVICE_MEMORY_LIMIT="$cap")
        [ "$sm" = "-" ] || e+=(CUDA_DEVICE_SM_LIMIT="${sm%/*}")
        case "$sm" in */hard) e+=(GPU_CORE_UTILIZATION_POLICY=FORCE) ;; esac
    fi
    # Nothing at all without cuquota on a GPU: an empty line would reach env as a command named ''.
    [ ${#e[@]} -eq 0 ] || printf '%s\n' "${e[@]}"
}

# run SAMPLE CAP SM [ARGS...]: runs one sample, output in $OUTF, exit status in $RC.
run() {
    local s="$1" cap="$2" sm="$3"; shift 3
    RUN_N=$((RUN_N + 1))
    OUTF="$WORK/out.$RUN_N.$s"
    local envs=()
    mapfile -t envs < <(run_env "$cap" "$sm" "$RUN_N")
    env "${envs[@]}" timeout 300 "$BIN/$s" "$@" >"$OUTF" 2>&1
    RC=$?
}

metric() { sed -n "s/^metric $1=//p" "$2" | tail -1; }
# rate_of OUTPUT: how fast the sample's kernels ran. On the simulated GPU: its share of the device over its launch
# window, read from the simulator's timeline (exact device time, not the sample's own clock, so a busy CPU
# cannot skew it); on a GPU: the sample's kernels/s. Either way rows compare it with the unlimited run's.
rate_of() {
    if [ "$REAL" = 1 ]; then metric kernels_per_s "$1"; return; fi
    local pid t0 t1 busy
    pid=$(metric pid "$1"); t0=$(metric t0_mono_ns "$1"); t1=$(metric t1_mono_ns "$1")
    [ -n "$pid" ] && [ -n "$t0" ] && [ -n "$t1" ] || return 0
    busy=$(env LD_LIBRARY_PATH="$WORK/lib" CUDASIM_STATE="$WORK/state.$RUN_N" "$OBSERVER" 0 "$pid" "$t0" "$t1" \
        | sed -n 's/^busy=//p')
    awk -v b="${busy:-0}" -v t0="$t0" -v t1="$t1" 'BEGIN { if (t1 > t0) printf "%.4f", b / (t1 - t0) }'
}
checks() { # summary of a sample's own checks
    local ok fail first
    ok=$(grep -c '^check .* OK$' "$1")
    fail=$(grep -c '^check .* FAIL$' "$1")
    first=$(grep -m1 '^check .* FAIL$' "$1" | sed 's/^check \([^:]*\):.*/\1/')
    if [ "$fail" = 0 ] && [ "$RC" = 0 ]; then echo "$ok/$ok checks OK"
    elif [ "$fail" = 0 ]; then echo "exit $RC: $(tail -1 "$1" | cut -c1-60)"
    else echo "$fail/$((ok + fail)) FAIL, first: $first"; fi
}

ROWS=() NFAIL=0 NOK=0
row() { # sample cap sm expected observed verdict
    ROWS+=("$1|$2|$3|$4|$5|$6")
    case "$6" in OK) NOK=$((NOK + 1)) ;; FAIL) NFAIL=$((NFAIL + 1)); FAILED_LOGS+=("$OUTF") ;; esac
}
FAILED_LOGS=()
verdict() { if "$@"; then echo OK; else echo FAIL; fi; }
in_range() { awk -v x="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(x != "" && x + 0 >= lo && x + 0 <= hi) }'; }

want() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }

# Memory the device offers without cuquota: the simulated size, or what the GPU reports.
DEVICE_MEM=""
if [ "$REAL" = 0 ]; then DEVICE_MEM=$(bytes "$SIM_MEMORY"); fi

if [ "$QUICK" = 1 ]; then CAP_LIST=(4g); else read -r -a CAP_LIST <<<"$CAPS"; fi
read -r -a SM_LIST <<<"$SMS"
# Context + module overhead and chunk rounding: how far below the cap an out-of-memory may come.
if [ "$REAL" = 0 ]; then SLACK=$((512 << 20)); else SLACK=$((1536 << 20)); fi

# --- functional samples -----------------------------------------------------------------------------------
for s in vector_add matmul multi_stream graph_loop mempool_async vmm; do
    want "$s" || continue
    for cap in - "${CAP_LIST[@]}"; do
        run "$s" "$cap" -
        row "$s" "$cap" - "exit 0, all checks OK" "$(checks "$OUTF")" "$(verdict [ "$RC" = 0 ])"
        if [ "$s" = vector_add ]; then
            if [ "$cap" = "-" ]; then
                rt=$(metric runtime_version "$OUTF")
                row "$s" - - "CUDA runtime $CUDA.x (static)" "${rt:-?}" \
                    "$(verdict in_range "${rt:-0}" $((CUDA * 1000)) $((CUDA * 1000 + 999)))"
            fi
            total=$(metric mem_total "$OUTF")
            if [ "$cap" = "-" ]; then
                [ -n "$DEVICE_MEM" ] || DEVICE_MEM="$total"
                exp="$DEVICE_MEM"
            else
                exp=$(bytes "$cap")
            fi
            row "$s" "$cap" - "cudaMemGetInfo total = $(human "$exp")" "$(human "$total")" "$(verdict [ "$total" = "$exp" ])"
        fi
    done
done

# --- out-of-memory probe ----------------------------------------------------------------------------------
APIS="cudaMalloc cudaMallocPitch cudaMallocManaged cudaMallocAsync cudaMallocFromPoolAsync cuMemCreate
cudaMallocArray cudaMalloc3DArray cudaMallocMipmappedArray"
if want oom_probe && [ "$QUICK" = 0 ]; then
    for cap in - "${CAP_LIST[@]}"; do
        run oom_probe "$cap" -
        if [ "$cap" = "-" ]; then
            hi=$(metric mem_free_start "$OUTF")
            [ -n "$hi" ] || hi=0
        else
            hi=$(bytes "$cap")
        fi
        lo=$((hi - SLACK))
        for api in $APIS; do
            at=$(metric "$api.stopped_at_bytes" "$OUTF")
            why=$(metric "$api.error" "$OUTF")
            obs="$(human "$at") (${why:-no result})"
            ok=FAIL exp="OOM in [$(human "$lo"), $(human "$hi")]"
            if [ "$why" = cudaErrorMemoryAllocation ] && in_range "$at" "$lo" "$hi"; then ok=OK; fi
            # A GPU's driver oversubscribes managed memory: without cuquota the probe stops at the device's size.
            if [ "$REAL" = 1 ] && [ "$cap" = "-" ] && [ "$api" = cudaMallocManaged ]; then
                exp="OOM, or oversubscribed to the device's size"
                if [ "$why" = limit ] || { [ "$why" = cudaErrorMemoryAllocation ] && in_range "$at" "$lo" "$hi"; }; then
                    ok=OK
                fi
            fi
            row "oom_probe:$api" "$cap" - "$exp" "$obs" "$ok"
        done
        [ "$RC" = 0 ] || row oom_probe "$cap" - "exit 0" "$(checks "$OUTF")" FAIL
    done
fi

# --- SM limits --------------------------------------------------------------------------------------------
if want compute_loop && [ "$QUICK" = 0 ]; then
    run compute_loop - - "$SECONDS_LOOP"
    base=$(rate_of "$OUTF")
    unit="kernels/s"; [ "$REAL" = 1 ] || unit="of the device"
    row compute_loop - - "runs, kernels take time" "$(checks "$OUTF"); $(printf '%.3g' "${base:-0}") $unit" \
        "$(verdict [ "$RC" = 0 ])"
    # Policy "hard" (GPU_CORE_UTILIZATION_POLICY=FORCE): the share is a ceiling. The default policy is work-conserving:
    # alone on the device the program may use idle time beyond its share, but never gets less than it.
    # On a GPU a limited run is judged by its kernel rate relative to the unlimited run's. On the simulator the
    # timeline gives each run's exact share of the device, so a limited run is judged by that share itself: a
    # busy CPU can only lower a share, and dividing by an unlimited run that the CPU happened to slow would
    # inflate it (the upper bound is the throttle's promise; the lower bound is wider).
    for sm in "${SM_LIST[@]}"; do
        for pol in hard default; do
            [ "$sm" -lt 100 ] || [ "$pol" = hard ] || continue
            run compute_loop - "$sm/$pol" "$SECONDS_LOOP"
            rate=$(rate_of "$OUTF")
            if [ "$REAL" = 0 ] && [ "$sm" -lt 100 ]; then
                what="share of the device in"
                share=$(awk -v r="${rate:-0}" 'BEGIN { printf "%.2f", r }')
                lo=$(awk -v s="$sm" 'BEGIN { printf "%.2f", s / 100 - 0.15 }')
            else
                what="rate/unlimited in"
                share=$(awk -v r="${rate:-0}" -v b="${base:-0}" 'BEGIN { if (b > 0) printf "%.2f", r / b; else print "" }')
                lo=$(awk -v s="$sm" 'BEGIN { printf "%.2f", s / 100 - 0.10 }')
            fi
            if [ "$sm" -ge 100 ]; then lo=0.85 hi=1.15
            else
                hi=$(awk -v s="$sm" 'BEGIN { printf "%.2f", s / 100 + 0.10 }')
                [ "$pol" = hard ] || hi=1.15
            fi
            ok=FAIL
            if [ "$RC" = 0 ] && in_range "$share" "$lo" "$hi"; then ok=OK; fi
            row compute_loop - "$sm/$pol" "$what [$lo, $hi]" \
                "${share:-?} ($(printf '%.3g' "${rate:-0}") $unit)" "$ok"
        done
    done
fi

# --- NVML view --------------------------------------------------------------------------------------------
if want mini_smi; then
    for cap in - "${CAP_LIST[@]}"; do
        RUN_N=$((RUN_N + 1))
        state="smi.$RUN_N"
        mapfile -t envs < <(run_env "$cap" - "$state")
        # A CUDA process to list: compute_loop in the background, sharing the simulated GPU and the usage file.
        env "${envs[@]}" timeout 60 "$BIN/compute_loop" 3 >"$WORK/bg.$RUN_N" 2>&1 &
        BG_PID=$!
        sleep 1.5
        OUTF="$WORK/out.$RUN_N.mini_smi"
        env "${envs[@]}" timeout 60 "$BIN/mini_smi" 1 >"$OUTF" 2>&1
        RC=$?
        wait "$BG_PID" 2>/dev/null
        BG_PID=""
        row mini_smi "$cap" - "exit 0, sees >=1 process" "$(checks "$OUTF")" "$(verdict [ "$RC" = 0 ])"
        total=$(metric gpu0.memory_total "$OUTF")
        if [ "$cap" = "-" ]; then
            if [ "$REAL" = 0 ]; then
                row mini_smi "$cap" - "NVML total = $(human "$DEVICE_MEM")" "$(human "$total")" \
                    "$(verdict [ "$total" = "$DEVICE_MEM" ])"
            fi
        else
            exp=$(bytes "$cap")
            row mini_smi "$cap" - "NVML total = $(human "$exp")" "$(human "$total")" "$(verdict [ "$total" = "$exp" ])"
        fi
    done
fi

# --- frameworks -------------------------------------------------------------------------------------------
if [ "$FRAMEWORKS" = 1 ]; then
    RUN_N=$((RUN_N + 1))
    OUTF="$WORK/out.$RUN_N.frameworks"
    flags=(--no-build)
    [ "$BUILD" = 1 ] && flags=()
    env CUQUOTA_TEST_PROFILE="$PROFILE" CUQUOTA_TEST_SHIM="$SHIM" "$ROOT/tests/frameworks/run.sh" "${flags[@]}" \
        >"$OUTF" 2>&1
    RC=$?
    summary=$(grep -E '^=+ .*(passed|failed|error).* =+$' "$OUTF" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
    row frameworks - - "pytest: all pass (xfail allowed)" "${summary:-exit $RC}" "$(verdict [ "$RC" = 0 ])"
    log "framework suite log: target/frameworks-results.txt"
fi

# --- report -----------------------------------------------------------------------------------------------
where="simulated GPU ($(human "$(bytes "$SIM_MEMORY")"))"
[ "$REAL" = 0 ] || where="real GPU"
echo "cuquota validation: CUDA $CUDA samples on the $where; cuquota = $(basename "$SHIM")"
{
    echo "sample|cap|sm|expected|observed|result"
    printf '%s\n' "${ROWS[@]}"
} | awk -F'|' '
    { for (i = 1; i <= NF; i++) { cell[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) } n = NR }
    END {
        for (r = 1; r <= n; r++) {
            line = ""
            for (i = 1; i <= 6; i++) line = line (i < 6 ? sprintf("%-" w[i] "s | ", cell[r, i]) : cell[r, i])
            print line
            if (r == 1) { sep = ""; for (i = 1; i <= 6; i++) { s = ""; for (k = 0; k < w[i]; k++) s = s "-"; sep = sep s (i < 6 ? "-|-" : "") } print sep }
        }
    }'
echo "$NOK OK, $NFAIL FAIL"
if [ "$NFAIL" -gt 0 ]; then
    for f in $(printf '%s\n' "${FAILED_LOGS[@]}" | sort -u | head -5); do
        echo "--- $(basename "$f") (last lines)"
        tail -8 "$f"
    done
    exit 1
fi
exit 0
