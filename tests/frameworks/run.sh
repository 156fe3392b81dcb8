#!/usr/bin/env bash
# Runs the framework suite (PyTorch, CuPy, cuda-python, pynvml under cuquota; see docs/testing.md).
#
#   tests/frameworks/run.sh [--no-build] [PYTEST ARGS...]      e.g.  tests/frameworks/run.sh -k cupy
#
# Builds the shim, simulator and CLI in $CUQUOTA_TEST_PROFILE (default debug, where the shim and the simulator are
# optimised; unless --no-build), then runs pytest from .deps/frameworks (the
# pinned wheels, installed by `scripts/setup.sh frameworks`; this script never installs), or with the Python that
# $CUQUOTA_FW_PYTHON names (a GPU machine's own frameworks; the log's header gives their versions). On a machine with an NVIDIA driver the suite uses
# the real GPU, with its no-cuquota baseline in the same run. The log, headed by date, device and commit, is
# written to target/frameworks-results.txt.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
BUILD=1
if [ "${1:-}" = --no-build ]; then BUILD=0; shift; fi

PYTHON="${CUQUOTA_FW_PYTHON:-}"
if [ -z "$PYTHON" ]; then scripts/setup.sh --check frameworks; PYTHON=.deps/frameworks/bin/python; fi
if [ "$BUILD" = 1 ]; then
    profile=(); [ "${CUQUOTA_TEST_PROFILE:-debug}" = debug ] || profile=(--profile "$CUQUOTA_TEST_PROFILE")
    cargo build --quiet "${profile[@]}" -p cuquota -p cuquota-sim -p cuquota-cli
fi

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
mkdir -p "$TARGET"
OUT="$TARGET/frameworks-results.txt"
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' || [ -e /dev/nvidiactl ]; then
    device="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo 'NVIDIA GPU')"
else
    device="simulated GPU (libcudasim.so), $(nproc) CPU cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
fi
{
    echo "cuquota framework suite — $(date -u '+%Y-%m-%d %H:%M UTC') — $device"
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (modified)')"
    "$PYTHON" -c 'import importlib.metadata as m, sys
def v(n):
    try:
        return m.version(n)
    except m.PackageNotFoundError:
        return "-"
print("python", sys.version.split()[0], "".join(f"; {n} {v(n)}" for n in ("torch", "cupy-cuda13x", "cuda-bindings", "nvidia-ml-py", "pytest")))'
} | tee "$OUT"
start=$(date +%s)
set +e
"$PYTHON" -m pytest tests/frameworks -v -s -p no:cacheprovider "$@" 2>&1 | tee -a "$OUT"
rc=${PIPESTATUS[0]}
set -e
echo "framework suite: $(($(date +%s) - start)) s, exit $rc" | tee -a "$OUT"
exit "$rc"
