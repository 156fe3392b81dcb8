#!/usr/bin/env bash
# Builds the CUDA samples with nvcc from the pinned PyPI wheels (no GPU needed), statically linked with the CUDA
# runtime (nvcc's default, `-cudart static`).
#
#   examples/build.sh [--cuda 13|12] [--out DIR] [sample ...]
#
# Default output: target/examples/cu<ver>/. Samples: the *.cu and *.c files in examples/ (names without suffix).
# CUDA_ARCHS (default "80 90") selects the SASS built; PTX for the last one is embedded too.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EX="$ROOT/examples"
CUDA=13
OUT=""
SAMPLES=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --cuda) CUDA="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) SAMPLES+=("$1"); shift ;;
    esac
done
[[ "$CUDA" == 13 || "$CUDA" == 12 ]] || { echo "build.sh: --cuda must be 13 or 12" >&2; exit 2; }
OUT="${OUT:-$ROOT/target/examples/cu$CUDA}"
mkdir -p "$OUT"
if [[ "$CUDA" == 13 ]]; then groups=(cu13); else groups=(cu13 cu12); fi
"$ROOT/scripts/setup.sh" --check "${groups[@]}" || exit 2

T13="$ROOT/.deps/cu13/nvidia/cu13"
NVCC="$T13/bin/nvcc"
GENCODE=()
archs=(${CUDA_ARCHS:-80 90})
for a in "${archs[@]}"; do GENCODE+=("-gencode" "arch=compute_$a,code=sm_$a"); done
last="${archs[-1]}"
GENCODE+=("-gencode" "arch=compute_$last,code=compute_$last")

if [[ "$CUDA" == 13 ]]; then
    RT_INC=(); RT_LIB=(-cudart static "-L$T13/lib")
else
    # 12.9 runtime headers first (crt/ comes from the 13.0 nvcc, as cu12 wheels ship no nvcc), 12.9 static runtime.
    R12="$ROOT/.deps/cu12/nvidia/cuda_runtime"
    RT_INC=("-I$R12/include"); RT_LIB=(-cudart none "$R12/lib/libcudart_static.a" -ldl -lpthread -lrt)
fi
NVML_INC="$T13/include"   # nvml.h (nvidia-nvml-dev), installed next to the 13.0 headers

if [[ ${#SAMPLES[@]} -eq 0 ]]; then
    for f in "$EX"/*.cu "$EX"/*.c; do b="$(basename "$f")"; SAMPLES+=("${b%.*}"); done
fi
# A sample is rebuilt when its source, common.h or this script is newer than the binary.
up_to_date() { # out src
    [[ -x "$1" && "$1" -nt "$2" && "$1" -nt "$EX/common.h" && "$1" -nt "$EX/build.sh" ]]
}
fail=0
for s in "${SAMPLES[@]}"; do
    src="$EX/$s.cu"; [[ -f "$src" ]] || src="$EX/$s.c"
    if [[ -f "$src" ]] && up_to_date "$OUT/$s" "$src"; then
        echo "up to date $OUT/$s"; continue
    fi
    if [[ -f "$EX/$s.cu" ]]; then
        cmd=("$NVCC" -O2 -std=c++17 "${GENCODE[@]}" "${RT_INC[@]}" -I"$EX" -o "$OUT/$s" "$EX/$s.cu" "${RT_LIB[@]}")
    elif [[ -f "$EX/$s.c" ]]; then
        cmd=(cc -O2 -Wall -I"$NVML_INC" -o "$OUT/$s" "$EX/$s.c" -ldl)
    else
        echo "build.sh: no sample $s" >&2; fail=1; continue
    fi
    if ! log="$("${cmd[@]}" 2>&1)"; then
        echo "build.sh: $s FAILED:" >&2; echo "$log" >&2; fail=1
    else
        echo "built $OUT/$s"
    fi
done
exit $fail
