#!/usr/bin/env bash
# Makes build-llama/llama-src.tar.xz (git-ignored): llama.cpp's source at the commit the CUDA
# issues compare against, trimmed to what `llama-bench` with the CUDA backend needs (~1.5 MB
# compressed), for `tools/cuda_check.sh llama` to build on the GPU machine. Never committed.
#   tools/llama_src.sh GIT_DIR   (GIT_DIR: the `fetch github:kmbandy/llama.cpp` mirror)
# The device call carries the tracked tree, build-dev/ and this file in 64 MiB: keep it small.
set -euo pipefail
cd "$(dirname "$0")/.."
GIT_DIR=${1:?usage: tools/llama_src.sh LLAMA_GIT_DIR}
COMMIT=${LLAMA_COMMIT:-0253fb21}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# (The mirror lacks the large model files; naming the folders keeps git archive off them.)
git --git-dir="$GIT_DIR" archive "$COMMIT" -- src include ggml common tools vendor cmake \
  CMakeLists.txt CMakePresets.json licenses LICENSE 2>/dev/null | tar -C "$T" -x
[ -f "$T/tools/llama-bench/llama-bench.cpp" ] || { echo "llama_src: archive incomplete" >&2; exit 1; }
for b in vulkan sycl metal opencl cann musa webgpu hexagon zdnn; do rm -rf "$T/ggml/src/ggml-$b"; done
rm -rf "$T/vendor/miniaudio" "$T/vendor/stb"
find "$T/tools" -mindepth 1 -maxdepth 1 ! -name llama-bench ! -name CMakeLists.txt -exec rm -rf {} +
# tools/CMakeLists.txt adds every tool: keep only llama-bench.
sed -i -E '/add_subdirectory\(llama-bench\)/! s/^(\s*)add_subdirectory\(/\1# add_subdirectory(/' \
  "$T/tools/CMakeLists.txt"
mkdir -p build-llama
XZ_OPT=-9 tar -C "$T" -cJf build-llama/llama-src.tar.xz .
ls -la build-llama/llama-src.tar.xz
