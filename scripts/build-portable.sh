#!/usr/bin/env bash
# Builds the deployable libcuquota.so against glibc 2.17 (loads in CUDA images based on old distributions:
# CentOS 7, Ubuntu 18.04+), strips it, and checks that no newer glibc symbol version slipped in.
# Output: dist/libcuquota.so. Tools: cargo-zigbuild and zig, pinned, installed by scripts/setup.sh into .deps/zig.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --check zig
export PATH="$PWD/.deps/zig/bin:$PATH" PYTHONPATH="$PWD/.deps/zig${PYTHONPATH:+:$PYTHONPATH}"
target="$(uname -m)-unknown-linux-gnu"
cargo zigbuild --release -q -p cuquota --target "$target.2.17"
mkdir -p dist
# Debug info goes into its own file, linked by name and checksum, so the library every CUDA process maps stays
# small and a crash can still be symbolised (gdb and eu-stack find dist/libcuquota.so.debug beside it).
objcopy --only-keep-debug "target/$target/release/libcuquota.so" dist/libcuquota.so.debug
objcopy --strip-debug --add-gnu-debuglink=dist/libcuquota.so.debug "target/$target/release/libcuquota.so" \
    dist/libcuquota.so
newest=$(objdump -T dist/libcuquota.so | grep -oE 'GLIBC_[0-9.]+' | sort -uV | tail -1)
case "$newest" in
  GLIBC_2.1[0-7]|GLIBC_2.[0-9]|GLIBC_2.[0-9].*) ;;
  *) echo "build-portable: dist/libcuquota.so needs $newest (> GLIBC_2.17)" >&2; exit 1 ;;
esac
echo "dist/libcuquota.so: $(du -h dist/libcuquota.so | cut -f1), needs glibc >= ${newest#GLIBC_};" \
    "debug info: dist/libcuquota.so.debug ($(du -h dist/libcuquota.so.debug | cut -f1))"
