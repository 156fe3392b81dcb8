#!/usr/bin/env bash
# The setup step: installs every pinned dependency the build, the tests and the samples need, once, from PyPI.
# test.sh runs it first; nothing is installed anywhere else (no test installs or downloads anything).
#
#   scripts/setup.sh [--check] [GROUP ...]      GROUP: cu13 cu12 zig k8s frameworks containers busybox
#                                               valgrind kubectl
#                                               (default: all)
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
#   k8s   kubernetes-validate (the Kubernetes schemas bundled) and its dependencies, for the examples/kubernetes
#         test
#   frameworks  the framework suite's wheels (tests/frameworks/requirements.txt, every one with its sha256:
#         PyTorch 2.15 for CUDA 13.2 and its nvidia-* libraries, CuPy, cuda-python, nvidia-ml-py, pytest) in a
#         Python 3.11 virtual environment; ~3 GB to download once, 4.7 GB on disk
#   containers  podman and runc from Debian's apt (as root only: the DRA plugin's end-to-end test, dra/tests/podman.rs,
#         runs as root); a no-op when both are installed or when not root
#   busybox  Debian's busybox-static (`apt-get download`, unpacked: .deps/busybox/busybox), the shell and tools
#         of the cuquota image (scripts/image.sh); installed as root only (the image test's user), unless named
#   valgrind  Debian's valgrind (apt, as root), for the hot-path gate (bench/tests/hot_path.rs: callgrind counts);
#         a no-op when installed; not root and missing: fails, naming the package
#   kubectl  Debian's kubectl (apt, as root; a no-op when installed): `kubectl kustomize deploy/` in
#         dra/tests/manifests.rs
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"

pins() { # group -> its pinned requirements, one per line
    case "$1" in
        cu13) printf '%s\n' nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
            nvidia-cuda-runtime==13.0.96 nvidia-nvml-dev==13.0.87 ;;
        cu12) printf '%s\n' nvidia-cuda-runtime-cu12==12.9.79 ;;
        zig) printf '%s\n' cargo-zigbuild==0.24.0 ziglang==0.17.0 ;;
        k8s) printf '%s\n' kubernetes-validate==1.37.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
            referencing==0.37.0 rpds-py==2026.9.1 attrs==26.1.0 pyyaml==6.0.3 packaging==26.3 \
            importlib-resources==7.1.0 typing-extensions==4.16.0 ;;
        frameworks) cat "$ROOT/tests/frameworks/requirements.txt" ;;
        containers) printf '%s\n' podman runc ;; # Debian packages, not pins: see ready_containers
        busybox) printf '%s\n' busybox-static ;; # a Debian package: the version apt offers
        valgrind) printf '%s\n' valgrind ;; # a Debian package: the version apt offers
        kubectl) printf '%s\n' kubectl ;; # a Debian package: the version apt offers
        *) echo "setup.sh: unknown group '$1' (groups: ${ALL[*]})" >&2; exit 2 ;;
    esac
}
ALL=(cu13 cu12 zig k8s frameworks containers busybox valgrind kubectl)

CHECK=0
GROUPS_WANTED=()
for a in "$@"; do
    case "$a" in
        --check) CHECK=1 ;;
        -h|--help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) pins "$a" >/dev/null; GROUPS_WANTED+=("$a") ;;
    esac
done
NAMED=${#GROUPS_WANTED[@]}
[ ${#GROUPS_WANTED[@]} -gt 0 ] || GROUPS_WANTED=("${ALL[@]}")

CACHE="${CUQUOTA_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cuquota-deps}"
mkdir -p "$ROOT/.deps"

# A folder holds a group when its .stamp lists the group's pins (compared word by word: older stamps put them on
# one line).
words() { tr -s ' \n' '\n\n' | sed '/^$/d'; }
holds() { [ -f "$1/.stamp" ] && [ "$(words <"$1/.stamp")" = "$(pins "$2" | words)" ]; }
ready() {
    if [ "$1" = valgrind ]; then command -v valgrind >/dev/null; return; fi
    if [ "$1" = containers ]; then
        # Only root runs the container test; elsewhere there is nothing to install.
        [ "$(id -u)" != 0 ] || { command -v podman && command -v runc; } >/dev/null
        return
    fi
    if [ "$1" = kubectl ]; then
        command -v kubectl >/dev/null || [ "$(id -u)" != 0 ]
        return
    fi
    # The image (and its test) is built as root only, like the container tests.
    if [ "$1" = busybox ] && [ "$(id -u)" != 0 ] && [ "$NAMED" = 0 ]; then return 0; fi
    holds "$ROOT/.deps/$1" "$1"
}

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

install() { # group
    local g="$1" want hash dir
    if [ "$g" = valgrind ]; then
        if [ "$(id -u)" != 0 ]; then
            echo "setup.sh: valgrind is missing (the hot-path gate, bench/tests/hot_path.rs, counts instructions" \
                "with callgrind): install it as root (apt-get install valgrind, or scripts/setup.sh valgrind)" >&2
            exit 1
        fi
        echo "setup.sh: installing valgrind (apt)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y valgrind >&2
        return
    fi
    if [ "$g" = containers ]; then
        echo "setup.sh: installing containers: podman runc (apt)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y podman runc >&2
        return
    fi
    if [ "$g" = kubectl ]; then
        echo "setup.sh: installing kubectl (apt)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y kubectl >&2
        return
    fi
    want="$(pins "$g")"
    hash="$(printf '%s' "$want" | sha256sum | cut -c1-12)"
    dir="$CACHE/$g-$hash"
    if ! mkdir -p "$CACHE" 2>/dev/null; then dir="$ROOT/.deps/$g.d"; fi
    if ! holds "$dir" "$g"; then
        rm -rf "$dir.tmp.$$"
        if [ "$g" = busybox ]; then
            echo "setup.sh: installing busybox: busybox-static (apt-get download)" >&2
            mkdir -p "$dir.tmp.$$/deb"
            (cd "$dir.tmp.$$/deb" && apt-get download -q busybox-static >&2)
            dpkg-deb -x "$dir.tmp.$$"/deb/busybox-static_*.deb "$dir.tmp.$$/deb/x"
            mv "$dir.tmp.$$/deb/x/bin/busybox" "$dir.tmp.$$/busybox"
            rm -rf "$dir.tmp.$$/deb"
        elif [ "$g" = frameworks ]; then
            echo "setup.sh: installing frameworks: the $(grep -c '==' <<<"$want") wheels of tests/frameworks/requirements.txt (~3 GB)" >&2
            install_frameworks "$dir.tmp.$$"
        else
            echo "setup.sh: installing $g: $(echo "$want" | tr '\n' ' ')" >&2
            # shellcheck disable=SC2086
            PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install --quiet --disable-pip-version-check --no-deps \
                --no-warn-script-location --target "$dir.tmp.$$" $want >&2
        fi
        echo "$want" >"$dir.tmp.$$/.stamp"
        # Other checkouts may be using a stale or partial folder: move it aside (rename is atomic) rather than
        # delete it under them; a racing installer of the same pins may have finished first.
        if [ -e "$dir" ] && ! holds "$dir" "$g"; then mv "$dir" "$dir.stale.$$"; fi
        mv -T "$dir.tmp.$$" "$dir" 2>/dev/null || rm -rf "$dir.tmp.$$"
    fi
    # Replace whatever .deps/<group> was (an older layout's folder, or a link) by a link to the cache.
    rm -rf "$ROOT/.deps/$g.new.$$"
    ln -s "$dir" "$ROOT/.deps/$g.new.$$"
    rm -rf "$ROOT/.deps/$g"
    mv -T "$ROOT/.deps/$g.new.$$" "$ROOT/.deps/$g"
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
