#!/usr/bin/env bash
# The test command: installs NVIDIA's headers (pinned pip wheels) into .deps/, builds the workspace, runs every
# test. Needs cargo (rustup), a C compiler (cc) and python3 with pip. See docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")"

CUDA_RT_VERSION=13.0.96
NVML_DEV_VERSION=13.0.87
DEPS=.deps

have_wheel() { # name version
    [ -f "$DEPS/$1-$2.dist-info/METADATA" ]
}

if have_wheel nvidia_cuda_runtime "$CUDA_RT_VERSION" && have_wheel nvidia_nvml_dev "$NVML_DEV_VERSION" \
    && [ -f "$DEPS/nvidia/cu13/include/cuda.h" ] && [ -f "$DEPS/nvidia/cu13/include/nvml.h" ]; then
    :
else
    echo "test.sh: installing NVIDIA headers into $DEPS/ (nvidia-cuda-runtime==$CUDA_RT_VERSION, nvidia-nvml-dev==$NVML_DEV_VERSION)"
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
        --target "$DEPS" \
        "nvidia-cuda-runtime==$CUDA_RT_VERSION" "nvidia-nvml-dev==$NVML_DEV_VERSION"
fi

export CARGO_TERM_QUIET=true
cargo build --workspace
cargo test --workspace --no-fail-fast

# The deployable library (glibc 2.17, built with zig) must build, load and enforce the same limits.
./scripts/build-portable.sh
CUQUOTA_TEST_SHIM="$PWD/dist/libcuquota.so" cargo test -p shim-tests \
    --test memory_apis --test loading_styles --test multiprocess --test throttle
