#!/usr/bin/env bash
# The cuquota image (scripts/image.sh) built and run with podman: needs root, podman and runc (test.sh runs it
# as root where podman is installed; elsewhere it says SKIPPED and why, and exits 0). Built from the debug
# binaries and dist/libcuquota.so under a test tag, it must: hold the name the manifests pull; run `cuquota
# --help` (the entrypoint) and `cuquota-dra-plugin --help`; list the simulated GPU from inside through NVML
# as the plugin's ResourceSlice and in the agent's report (one UUID, the same in both); and run the plugin's
# init container (dra/deploy/plugin.yaml, read from the manifest) so that the node gets the image's library,
# byte for byte.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ] || ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
    echo "tests/image.sh: SKIPPED: needs root, podman and runc (scripts/setup.sh containers, as root)"
    exit 0
fi
fail() { echo "tests/image.sh: FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
tag="localhost/cuquota-test:$$"
trap 'podman rmi -f "$tag" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
# The recipe's runtime settings (docs/kubernetes.md; ../shared/notes/containers-here.md): runc, ulimits.
printf '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=1024:1024"]\n[engine]\nruntime = "runc"\n' \
    >"$tmp/containers.conf"
export CONTAINERS_CONF="$tmp/containers.conf"

version=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
default=$(scripts/image.sh --print-tag)
[ "$default" = "registry.example.com/cuquota:$version" ] || fail "default tag $default"
for m in dra/deploy/plugin.yaml examples/kubernetes/agent.yaml; do
    other=$(grep -o 'image: registry.example.com/cuquota:.*' "$m" | sort -u | grep -vx "image: $default" || true)
    [ -z "$other" ] || fail "$m pulls $other, not $default"
done
[ -f dist/libcuquota.so ] || scripts/build-portable.sh
scripts/image.sh --bins target/debug --library dist/libcuquota.so --tag "$tag"

out=$(podman run --rm "$tag" --help) || fail "cuquota --help: $out"
grep -q '^Usage: cuquota ' <<<"$out" || fail "the entrypoint is not cuquota: $out"
out=$(podman run --rm --entrypoint cuquota-dra-plugin "$tag" --help) || fail "cuquota-dra-plugin --help: $out"
grep -q '^Usage: cuquota-dra-plugin ' <<<"$out" || fail "cuquota-dra-plugin --help: $out"

# The simulator as the node's NVML (what the NVIDIA runtime mounts on a real node).
touch "$tmp/sim.state"
sim=(-v "$PWD/target/debug/libcudasim.so:/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1:ro"
    -v "$tmp/sim.state:/var/run/cudasim/state:rw" -e CUDASIM_STATE=/var/run/cudasim/state)
slice=$(podman run --rm "${sim[@]}" --entrypoint cuquota-dra-plugin "$tag" --node node-1 --print-resource-slice) ||
    fail "the plugin's slice from NVML: $slice"
report=$(podman run --rm "${sim[@]}" "$tag" agent --containers /tmp --once --json) || fail "the agent: $report"
uuids() { grep -o 'GPU-[0-9a-f-]*' | sort -u; }
[ "$(uuids <<<"$slice" | wc -l)" = 1 ] || fail "the slice does not list one GPU: $slice"
[ "$(uuids <<<"$slice")" = "$(uuids <<<"$report")" ] || fail "the agent's GPUs differ from the plugin's: $report"

# The plugin's init container, as the manifest says, on a node directory.
mkdir -p "$tmp/node"
PYTHONPATH=.deps/k8s python3 -c '
import sys, yaml
for d in yaml.safe_load_all(open("dra/deploy/plugin.yaml")):
    if d and d["kind"] == "DaemonSet":
        print(d["spec"]["template"]["spec"]["initContainers"][0]["command"][2])' >"$tmp/init.sh"
out=$(podman run --rm -v "$tmp/node:/var/lib/cuquota:rw" -v "$tmp/init.sh:/init.sh:ro" --entrypoint /bin/sh \
    "$tag" /init.sh 2>&1) || fail "the plugin's init container: $out"
cmp dist/libcuquota.so "$tmp/node/lib/libcuquota.so" || fail "the node did not get the image's library"
echo "tests/image.sh: $tag: cuquota and cuquota-dra-plugin run, $(uuids <<<"$slice") seen by both," \
    "the init container installs the library"
