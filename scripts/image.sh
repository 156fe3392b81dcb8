#!/usr/bin/env bash
# Builds the cuquota image with podman, without pulling anything (no registry is reachable here): a root
# filesystem of the portable library, the `cuquota` CLI and agent, `cuquota-dra-plugin`, the glibc files they
# load (copied from this machine) and busybox (the init containers' shell: scripts/setup.sh busybox), imported
# with `podman import`. The manifests (dra/deploy/plugin.yaml, examples/kubernetes/agent.yaml) name the
# default tag; push it to your registry under the name your cluster pulls.
#
#   scripts/image.sh [--bins DIR] [--library FILE] [--tag NAME] [--print-tag]
#
# Layout: /usr/local/bin/{cuquota,cuquota-dra-plugin}, /opt/cuquota/libcuquota.so, /bin/sh (busybox);
# entrypoint /usr/local/bin/cuquota. Default: release builds of the binaries and dist/libcuquota.so
# (scripts/build-portable.sh), built here; --bins/--library take what is already built instead (tests/image.sh:
# the debug binaries) and run no build. Default tag: registry.example.com/cuquota:VERSION (Cargo.toml), which
# --print-tag prints.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
BINS="" LIB="" TAG="registry.example.com/cuquota:$version"
while [ $# -gt 0 ]; do
    case "$1" in
        --bins) BINS="$2"; shift ;;
        --library) LIB="$2"; shift ;;
        --tag) TAG="$2"; shift ;;
        --print-tag) echo "$TAG"; exit 0 ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "image.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
scripts/setup.sh --check busybox
command -v podman >/dev/null || { echo "image.sh: needs podman (scripts/setup.sh containers, as root)" >&2; exit 1; }
if [ -z "$BINS" ]; then
    cargo build --quiet --release -p cuquota-cli -p cuquota-dra --bins
    BINS=target/release
fi
if [ -z "$LIB" ]; then
    [ -f dist/libcuquota.so ] || scripts/build-portable.sh
    LIB=dist/libcuquota.so
fi

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/local/bin" "$root/opt/cuquota" "$root/bin" "$root/tmp" "$root/etc"
chmod 1777 "$root/tmp"
for b in cuquota cuquota-dra-plugin; do objcopy --strip-debug "$BINS/$b" "$root/usr/local/bin/$b"; done
cp "$LIB" "$root/opt/cuquota/libcuquota.so"
# Every library the binaries and the preload library load, where this machine's loader finds them (the
# library's glibc >= 2.17 is met by the binaries' newer one).
for f in "$root/usr/local/bin/cuquota" "$root/usr/local/bin/cuquota-dra-plugin" "$LIB"; do
    ldd "$f" | sed -n 's/.*=> \(\/[^ ]*\).*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (0x.*/\1/p'
done | sort -u | while read -r l; do
    mkdir -p "$root$(dirname "$l")"
    cp -L "$l" "$root$l"
done
cp .deps/busybox/busybox "$root/bin/busybox"
for a in $("$root/bin/busybox" --list); do [ -e "$root/bin/$a" ] || ln -s busybox "$root/bin/$a"; done
printf 'root:x:0:0:root:/:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
tar -C "$root" --owner=0 --group=0 --numeric-owner -c . |
    podman import -q --change 'ENTRYPOINT ["/usr/local/bin/cuquota"]' --change 'ENV PATH=/usr/local/bin:/bin' \
        --message "cuquota $version" - "$TAG" >/dev/null
echo "$TAG: $(podman image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.1f MB", $1 / 1e6}')"
