#!/usr/bin/env bash
# Run a CUDA program under cuquota.
#
#   ./run.sh [--memory 4g] [--sm 30] [--devices N] [--gpu-memory 16g] -- PROGRAM [ARGS...]
#   ./run.sh --memory 1g -- shim-tests/c/alloc_probe.c      # a .c file is compiled first (against .deps headers)
#
# On a machine with an NVIDIA driver, PROGRAM runs with LD_PRELOAD=libcuquota.so and the limits in its env.
# Without one, it runs on the simulated GPU (libcudasim.so): --devices and --gpu-memory describe that GPU.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")" && pwd)"

usage() {
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-2}"
}

MEMORY="" SM="" DEVICES=1 GPU_MEMORY=16g
while [ $# -gt 0 ]; do
    case "$1" in
        --memory) MEMORY="${2:?--memory needs a value}"; shift 2 ;;
        --memory=*) MEMORY="${1#*=}"; shift ;;
        --sm) SM="${2:?--sm needs a value}"; shift 2 ;;
        --sm=*) SM="${1#*=}"; shift ;;
        --devices) DEVICES="${2:?--devices needs a value}"; shift 2 ;;
        --devices=*) DEVICES="${1#*=}"; shift ;;
        --gpu-memory) GPU_MEMORY="${2:?--gpu-memory needs a value}"; shift 2 ;;
        --gpu-memory=*) GPU_MEMORY="${1#*=}"; shift ;;
        -h|--help) usage 0 ;;
        --) shift; break ;;
        *) echo "run.sh: unknown option $1" >&2; usage ;;
    esac
done
[ $# -gt 0 ] || { echo "run.sh: no program given" >&2; usage; }

log() { echo "run.sh: $*" >&2; }

ensure_headers() { # NVIDIA's headers: the setup step's cu13 group (installs once, then a no-op)
    "$ROOT/scripts/setup.sh" cu13
}

REAL_DRIVER=0
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' || [ -e /dev/nvidiactl ]; then
    REAL_DRIVER=1
fi

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
SHIM="$TARGET/release/libcuquota.so"
SIM="$TARGET/release/libcudasim.so"
PKGS=(-p cuquota)
[ "$REAL_DRIVER" = 1 ] || PKGS+=(-p cuquota-sim)
(cd "$ROOT" && cargo build --quiet --release "${PKGS[@]}")

WORK="$(mktemp -d "${TMPDIR:-/tmp}/cuquota-run.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

PROG="$1"; shift
if [[ "$PROG" == *.c ]]; then
    ensure_headers
    [ -f "$PROG" ] || { echo "run.sh: $PROG not found" >&2; exit 2; }
    mkdir -p "$WORK/link"
    if [ "$REAL_DRIVER" = 1 ]; then
        LINK=(-lcuda -lnvidia-ml -ldl -lpthread)
    else
        # link against the simulator (soname libcuda.so.1) and an NVML stub carrying libnvidia-ml.so.1
        ln -s "$SIM" "$WORK/link/libcuda.so"   # soname libcuda.so.1
        cc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 "$ROOT/shim-tests/c/nvml_stub.c" -o "$WORK/link/libnvidia-ml.so"
        LINK=(-L"$WORK/link" -Wl,--as-needed -lcuda -lnvidia-ml -ldl -lpthread)
    fi
    BIN="$WORK/$(basename "${PROG%.c}")"
    cc -O1 -I"$ROOT/.deps/cu13/nvidia/cu13/include" -I"$ROOT/shim-tests/c" "$PROG" -o "$BIN" "${LINK[@]}"
    PROG="$BIN"
fi

ENV=(LD_PRELOAD="$SHIM")
[ -z "$MEMORY" ] || ENV+=(CUDA_DEVICE_MEMORY_LIMIT="$MEMORY")
[ -z "$SM" ] || ENV+=(CUDA_DEVICE_SM_LIMIT="$SM")

if [ "$REAL_DRIVER" = 1 ]; then
    set +e
    env "${ENV[@]}" "$PROG" "$@"
    exit $?
fi

mkdir -p "$WORK/lib"
for n in libcuda.so.1 libcuda.so libnvidia-ml.so.1 libnvidia-ml.so; do ln -s "$SIM" "$WORK/lib/$n"; done
ENV+=(
    LD_LIBRARY_PATH="$WORK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    CUDASIM_STATE="$WORK/sim.state" CUDASIM_DEVICES="$DEVICES" CUDASIM_MEMORY="$GPU_MEMORY"
    CUQUOTA_USAGE_FILE="$WORK/usage"
)
echo "run.sh: no NVIDIA driver found: running on the simulated GPU (libcudasim.so: $DEVICES device(s) of $GPU_MEMORY)" \
    "with memory limit ${MEMORY:-none}, SM limit ${SM:-none}" >&2
set +e
env "${ENV[@]}" "$PROG" "$@"
exit $?
