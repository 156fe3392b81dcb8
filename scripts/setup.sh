#!/usr/bin/env bash
# The setup step: installs every pinned dependency the build, the tests and the samples need, once, from PyPI.
# test.sh runs it first; nothing is installed anywhere else (no test installs or downloads anything).
#
#   scripts/setup.sh [--check] [GROUP ...]      GROUP: cu13 cu12 zig frameworks (default: all)
#
# Each group goes to its own folder, keyed by a hash of its pins, under the cache
# ${CUQUOTA_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cuquota-deps}, and .deps/<group> links to it: a fresh
# clone on the same machine reuses it without any download. --check installs nothing and exits 1, naming the
# command to run, when a group is missing.
#
#   cu13  nvcc, cicc/nvvm, crt, the CUDA 13.0 runtime (static) and its headers (cuda.h, cudaTypedefs.h), and
#         nvml.h: the headers every C test program and the signature checks compile against
#   cu12  the CUDA 12.9 runtime (static) for the CUDA 12 samples (compiled by the 13.0 nvcc: PyPI's cu12 nvcc
#         wheels lack cicc)
#   zig   cargo-zigbuild and zig, for the portable glibc-2.17 build (scripts/build-portable.sh)
#   frameworks  the framework suite's wheels (tests/frameworks/requirements.txt, every one with its sha256:
#         PyTorch 2.15 for CUDA 13.2 and its nvidia-* libraries, CuPy, cuda-python, nvidia-ml-py, pytest) in a
#         Python 3.11 virtual environment; ~3 GB to download once, 4.7 GB on disk
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"

pins() { # group -> its pinned requirements, one per line
    case "$1" in
        cu13) printf '%s\n' nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
            nvidia-cuda-runtime==13.0.96 nvidia-nvml-dev==13.0.87 ;;
        cu12) printf '%s\n' nvidia-cuda-runtime-cu12==12.9.79 ;;
        zig) printf '%s\n' cargo-zigbuild==0.24.0 ziglang==0.17.0 ;;
        frameworks) cat "$ROOT/tests/frameworks/requirements.txt" ;;
        *) echo "setup.sh: unknown group '$1' (groups: cu13 cu12 zig frameworks)" >&2; exit 2 ;;
    esac
}
ALL=(cu13 cu12 zig frameworks)

CHECK=0
GROUPS_WANTED=()
for a in "$@"; do
    case "$a" in
        --check) CHECK=1 ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) pins "$a" >/dev/null; GROUPS_WANTED+=("$a") ;;
    esac
done
[ ${#GROUPS_WANTED[@]} -gt 0 ] || GROUPS_WANTED=("${ALL[@]}")

CACHE="${CUQUOTA_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cuquota-deps}"
mkdir -p "$ROOT/.deps"

# A group is ready when .deps/<group> holds a .stamp equal to its pins.
ready() { [ -f "$ROOT/.deps/$1/.stamp" ] && [ "$(cat "$ROOT/.deps/$1/.stamp")" = "$(pins "$1")" ]; }

# --- the framework suite's wheels ---------------------------------------------------------------------------
# A virtual environment rather than --target: CuPy looks for the CUDA headers of its nvidia-* wheels only under
# a site-packages directory. The requirements file is complete and hashed: no resolution, no other download.
install_frameworks() { # dir
    local dir="$1" py="${CUQUOTA_FW_PYTHON:-python3.11}"
    command -v "$py" >/dev/null || py="$PY"
    if [ "$("$py" -c 'import sys; print(sys.version_info[:2] == (3, 11))' 2>/dev/null)" != True ]; then
        echo "setup.sh: frameworks: the pinned wheels are for Python 3.11 and $py is not one (set CUQUOTA_FW_PYTHON)" >&2
        exit 1
    fi
    "$py" -m venv --without-pip "$dir"
    PIP_ROOT_USER_ACTION=ignore "$py" -m pip --python "$dir/bin/python" install --quiet --disable-pip-version-check \
        --no-cache-dir --no-deps --require-hashes --only-binary :all: -r "$ROOT/tests/frameworks/requirements.txt" >&2
}
# ---------------------------------------------------------------------------------------------------------------

install() { # group
    local g="$1" want hash dir
    want="$(pins "$g")"
    hash="$(printf '%s' "$want" | sha256sum | cut -c1-12)"
    dir="$CACHE/$g-$hash"
    if ! mkdir -p "$CACHE" 2>/dev/null; then dir="$ROOT/.deps/$g.d"; fi
    if ! { [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$want" ]; }; then
        if [ "$g" = frameworks ]; then
            echo "setup.sh: installing frameworks: the $(grep -c '==' <<<"$want") wheels of tests/frameworks/requirements.txt (~3 GB)" >&2
        else
            echo "setup.sh: installing $g: $(echo "$want" | tr '\n' ' ')" >&2
        fi
        rm -rf "$dir.tmp.$$"
        if [ "$g" = frameworks ]; then
            install_frameworks "$dir.tmp.$$"
        else
            # shellcheck disable=SC2086
            PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install --quiet --disable-pip-version-check --no-deps \
                --no-warn-script-location --target "$dir.tmp.$$" $want >&2
        fi
        echo "$want" >"$dir.tmp.$$/.stamp"
        rm -rf "$dir"
        mv "$dir.tmp.$$" "$dir"
    fi
    rm -rf "$ROOT/.deps/$g"
    ln -s "$dir" "$ROOT/.deps/$g"
}

missing=()
for g in "${GROUPS_WANTED[@]}"; do
    ready "$g" && continue
    if [ "$CHECK" = 1 ]; then missing+=("$g"); else install "$g"; fi
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup.sh: missing pinned dependencies (${missing[*]}): run scripts/setup.sh" >&2
    exit 1
fi
