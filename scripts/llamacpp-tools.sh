#!/usr/bin/env bash
# Builds llama.cpp's own command-line tools (llama-server, llama-batched-bench, llama-bench,
# llama-cli, llama-speculative, llama-lookup, llama-tokenize, llama-quantize, ...) from the llama.cpp sources
# that the llama-cpp-python 0.3.36 sdist vendors, for side-by-side benchmarks.
# Usage: bash scripts/llamacpp-tools.sh [OUT_DIR]   (default ~/.cache/llamacpp-tools)
# Prints the bin directory on its last line. Idempotent. About 10-20 minutes on 2 cores.
# AMX is left out on purpose: the AMX build of this version crashed (SIGSEGV) on the first
# evaluation of a Q4_1 model on an Intel Xeon here.
# AVX-VNNI and the AVX-512 extensions are named only where the CPU has them: a build that names
# one the CPU lacks dies with SIGILL (AVX-VNNI on AMD Zen 4, AVX-512 on Zen 3).
set -euo pipefail
OUT="${1:-$HOME/.cache/llamacpp-tools}"
VERSION=0.3.36
mkdir -p "$OUT"
if [ -x "$OUT/bin/llama-server" ] && [ -x "$OUT/bin/llama-quantize" ]; then echo "$OUT/bin"; exit 0; fi
if [ ! -d "$OUT/venv" ]; then
  python3 -m venv "$OUT/venv"
  "$OUT/venv/bin/pip" install -q scikit-build-core cmake ninja
fi
if [ ! -d "$OUT/src" ]; then
  # The sdist's metadata step only needs cmake to be findable; nothing is compiled here.
  "$OUT/venv/bin/pip" download -q --no-deps --no-binary :all: --no-build-isolation \
    "llama-cpp-python==$VERSION" -d "$OUT/dl"
  mkdir -p "$OUT/src" && tar xzf "$OUT/dl/llama_cpp_python-$VERSION.tar.gz" -C "$OUT/src" --strip-components=1
fi
SRC="$OUT/src/vendor/llama.cpp"
# -DFLAG=ON when the CPU has the feature, else -DFLAG=OFF: a flag named without the feature
# makes the whole CPU backend use those instructions (SIGILL on AVX2-only CPUs such as Zen 3).
has() { if grep -qw "$1" /proc/cpuinfo; then echo "-D$2=ON"; else echo "-D$2=OFF"; fi; }
"$OUT/venv/bin/cmake" -S "$SRC" -B "$OUT/build" -G Ninja -DCMAKE_MAKE_PROGRAM="$OUT/venv/bin/ninja" \
  -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DGGML_NATIVE=OFF \
  -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON $(has avx_vnni GGML_AVX_VNNI) \
  $(has avx512f GGML_AVX512) $(has avx512_vnni GGML_AVX512_VNNI) $(has avx512_bf16 GGML_AVX512_BF16) \
  $(has avx512vbmi GGML_AVX512_VBMI) >/dev/null
"$OUT/venv/bin/cmake" --build "$OUT/build" -j "$(nproc)" --target \
  llama-server llama-batched-bench llama-bench llama-cli llama-speculative llama-lookup llama-tokenize llama-quantize >/dev/null
mkdir -p "$OUT/bin" && cp "$OUT/build/bin/"llama-* "$OUT/bin/"
echo "$OUT/bin"
