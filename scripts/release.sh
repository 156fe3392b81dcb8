#!/usr/bin/env bash
# Builds the release tarball: dist/cuquota-VERSION-ARCH-linux.tar.gz (VERSION from Cargo.toml) holding
#   lib/libcuquota.so (+ .debug)  the portable preload library (scripts/build-portable.sh, glibc >= 2.17)
#   bin/cuquota                   the CLI and node agent
#   bin/cuquota-dra-plugin        the DRA node plugin
#   deploy/                       the DeviceClass, the plugin's DaemonSet and RBAC, a claim template and pod,
#                                 the agent's DaemonSet
#   INSTALL.md                    install steps for a node and for a cluster
#   SHA256SUMS                    every file above (`sha256sum -c SHA256SUMS` in the unpacked folder)
# and dist/cuquota-VERSION-ARCH-linux.tar.gz.sha256 beside it.
#
#   scripts/release.sh [--fast] [--out DIR]
#
# --fast packs the debug builds of the binaries (what `cargo build` made; the tarball's name ends in -debug)
# and dist/libcuquota.so as it is (built if missing): tests/release.sh uses it, since a release build of the
# plugin (kube, tonic, rustls) costs CI minutes for no extra check.
set -euo pipefail
cd "$(dirname "$0")/.."
FAST=0
OUT=dist
while [ $# -gt 0 ]; do
    case "$1" in
        --fast) FAST=1 ;;
        --out) OUT="$2"; shift ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "release.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

version=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
[ -n "$version" ] || { echo "release.sh: no version in Cargo.toml's [workspace.package]" >&2; exit 1; }
name="cuquota-$version-$(uname -m)-linux"
if [ "$FAST" = 1 ]; then
    name="$name-debug"
    cargo build --quiet -p cuquota-cli -p cuquota-dra --bins
    bins=target/debug
    [ -f dist/libcuquota.so ] || scripts/build-portable.sh
else
    scripts/build-portable.sh
    cargo build --quiet --release -p cuquota-cli -p cuquota-dra --bins
    bins=target/release
fi

mkdir -p "$OUT"
stage=$(mktemp -d "$OUT/.release.XXXXXX")
trap 'rm -rf "$stage"' EXIT
d="$stage/$name"
mkdir -p "$d/bin" "$d/lib" "$d/deploy"
cp dist/libcuquota.so dist/libcuquota.so.debug "$d/lib/"
for b in cuquota cuquota-dra-plugin; do
    # Debug info stays in the build; the shipped binaries keep their symbols (backtraces) only.
    objcopy --strip-debug "$bins/$b" "$d/bin/$b"
done
cp dra/deploy/deviceclass.yaml dra/deploy/plugin.yaml dra/deploy/notebook.yaml "$d/deploy/"
cp examples/kubernetes/agent.yaml "$d/deploy/agent.yaml"
cat >"$d/INSTALL.md" <<INSTALL
# cuquota $version: install

Check the files first: \`sha256sum -c SHA256SUMS\` in this folder. The full guide: docs/kubernetes.md
(section Install) in the source. The binaries need glibc >= $(ldd --version | sed -n '1s/.* //p') (the build
machine's); the library, glibc >= 2.17.

## One node, no cluster
    install -D -m 0644 lib/libcuquota.so /var/lib/cuquota/lib/libcuquota.so
    install -D -m 0755 bin/cuquota bin/cuquota-dra-plugin -t /usr/local/bin
    cuquota agent --containers /var/lib/cuquota/containers &
    cuquota-dra-plugin --node \$(hostname) --claims-dir /etc/cuquota/claims --agent-dir /var/lib/cuquota/containers
The container runtime must read CDI specs from /var/run/cdi (containerd 1.7+ with enable_cdi, CRI-O, podman).

## A cluster (Kubernetes 1.34+, 1.36+ for consumable capacity by default)
Build the image on a machine with podman (scripts/image.sh in the source), push it to your registry, and set
that name in deploy/plugin.yaml and deploy/agent.yaml (they say registry.example.com/cuquota:$version). Then:
    kubectl apply -f deploy/agent.yaml -f deploy/deviceclass.yaml -f deploy/plugin.yaml
Pods claim GPUs as deploy/notebook.yaml does.
INSTALL
(cd "$d" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
# Reproducible order and owners; the files' times are the build's.
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner -czf "$stage/$name.tar.gz" "$name"
mv "$stage/$name.tar.gz" "$OUT/$name.tar.gz"
(cd "$OUT" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")
echo "$OUT/$name.tar.gz: $(du -h "$OUT/$name.tar.gz" | cut -f1) ($(wc -l <"$d/SHA256SUMS") files, version $version)"
