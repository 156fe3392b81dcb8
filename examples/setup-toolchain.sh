#!/usr/bin/env bash
# Installs the pinned CUDA toolchains for the samples from PyPI into .deps/ (gitignored). Idempotent and quiet:
# a stamp file records what was installed, so a second run does nothing.
#
#   examples/setup-toolchain.sh [13|12|all]     (default: all)
#
# CUDA 13: nvcc, cicc/nvvm, crt headers and the static runtime, all 13.0.
# CUDA 12: PyPI's cu12 nvcc wheels hold only ptxas, so CUDA 12 programs are compiled by the 13.0 nvcc front end
#          against the 12.9 runtime's headers and linked with the 12.9 static runtime (see docs/examples.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPS="$ROOT/.deps"
PY="${PYTHON:-python3}"

CU13_PINS=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96
           nvidia-nvml-dev==13.0.87)
CU12_PINS=(nvidia-cuda-runtime-cu12==12.9.79)

install() { # dir pins...
    local dir="$1"; shift
    local want="$*"
    if [[ -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$want" ]]; then
        return 0
    fi
    rm -rf "$dir.tmp"
    echo "setup-toolchain: installing $want into ${dir#"$ROOT"/}" >&2
    "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --no-warn-script-location --root-user-action=ignore \
        --target "$dir.tmp" "$@" >&2
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
    echo "$want" > "$dir/.stamp"
}

what="${1:-all}"
mkdir -p "$DEPS"
case "$what" in
    13) install "$DEPS/cu13" "${CU13_PINS[@]}" ;;
    12) install "$DEPS/cu13" "${CU13_PINS[@]}"; install "$DEPS/cu12" "${CU12_PINS[@]}" ;;
    all) install "$DEPS/cu13" "${CU13_PINS[@]}"; install "$DEPS/cu12" "${CU12_PINS[@]}" ;;
    *) echo "usage: $0 [13|12|all]" >&2; exit 2 ;;
esac
