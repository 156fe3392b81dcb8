#!/usr/bin/env bash
# The release tarball, as a user gets it: scripts/release.sh --fast (the debug builds of the binaries, the
# portable dist/libcuquota.so), then the tarball's checksum, unpacked, SHA256SUMS (complete, and failing on a
# changed byte), both binaries' --help, and the shipped library loaded under the simulator with a 1 GiB cap
# (cuMemGetInfo says 1024 MiB of the simulated 16 GiB). test.sh runs it after the portable build.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "tests/release.sh: FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

scripts/release.sh --fast --out "$tmp"
tarball=$(ls "$tmp"/cuquota-*.tar.gz)
(cd "$tmp" && sha256sum -c --quiet "$(basename "$tarball").sha256") || fail "the tarball's checksum"
tar -C "$tmp" -xzf "$tarball"
d=${tarball%.tar.gz}
[ -d "$d" ] || fail "$(basename "$tarball") does not unpack into $(basename "$d")/"
(cd "$d" && sha256sum -c --quiet SHA256SUMS) || fail "SHA256SUMS"
diff <(cd "$d" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort) \
    <(awk '{print $2}' "$d/SHA256SUMS" | LC_ALL=C sort) || fail "SHA256SUMS does not list every file"
for f in lib/libcuquota.so bin/cuquota bin/cuquota-dra-plugin deploy/plugin.yaml deploy/deviceclass.yaml \
    deploy/agent.yaml INSTALL.md; do
    [ -s "$d/$f" ] || fail "no $f"
done
cp -r "$d" "$tmp/changed"
printf '#' >>"$tmp/changed/deploy/plugin.yaml"
if (cd "$tmp/changed" && sha256sum -c --quiet SHA256SUMS >/dev/null 2>&1); then
    fail "SHA256SUMS does not catch a changed file"
fi

"$d/bin/cuquota" --help | grep -q '^Usage: cuquota ' || fail "cuquota --help"
"$d/bin/cuquota-dra-plugin" --help | grep -q '^Usage: cuquota-dra-plugin ' || fail "cuquota-dra-plugin --help"
run() { "$d/bin/cuquota" run -q --library "$d/lib/libcuquota.so" --simulator target/debug/libcudasim.so "$@" \
    -- python3 tests/cuda_meminfo.py; }
out=$(run --memory 1g) || fail "the shipped library under the simulator: $out"
[ "$out" = "total_mib=1024" ] || fail "a 1 GiB cap under the shipped library reads '$out'"
out=$(run) || fail "the simulator without a cap: $out"
[ "$out" = "total_mib=16384" ] || fail "no cap reads '$out' (the simulated GPU has 16 GiB)"
echo "tests/release.sh: $(basename "$tarball") ($(du -h "$tarball" | cut -f1)): checksums, --help, library OK"
