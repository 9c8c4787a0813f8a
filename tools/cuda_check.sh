#!/usr/bin/env bash
# Runs on the GPU machine (a device call carrying build-dev/ made by tools/cuda_pack.sh):
# unpacks the binaries, then runs what is asked:
#   tests   every CUDA kernel test, and the model and engine tests on the CUDA backend
#           (KILN_TEST_DEVICE=cuda), under the paths the binaries were built with
#   bench   kiln bench on random-weight Llama-shaped files made there (kiln make-model)
# Figures and logs go to $OUT when set. Default: tests bench.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHAT=${*:-tests bench}
D=/tmp/kiln-dev
rm -rf $D && mkdir -p $D && tar -C $D -xJf build-dev/bundle.tar.xz
export LD_LIBRARY_PATH=$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# The tests find fixtures at the source path they were built in and ../shared beside it.
SRC=$(strings $D/bin/test_model | grep -m1 -o '/[^ ]*/tests/fixtures' | sed 's|/tests/fixtures||' || true)
if [ -n "$SRC" ] && [ "$SRC" != "$ROOT" ]; then
  mkdir -p "$(dirname "$SRC")"
  [ -e "$SRC" ] || ln -s "$ROOT" "$SRC"
  [ -e "$(dirname "$SRC")/shared" ] || ln -s $D/shared "$(dirname "$SRC")/shared"
fi
OUTDIR=${OUT:-/tmp/kiln-out}
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
$D/bin/kiln doctor
if [[ " $WHAT " == *" tests "* ]]; then
  timeout 240 $D/bin/test_cuda --gtest_brief=1 > "$OUTDIR/test_cuda.log" 2>&1
  echo "test_cuda rc=$?"; grep -E "FAILED|PASSED|SKIPPED|tests ran" "$OUTDIR/test_cuda.log" | head -30
  KILN_TEST_DEVICE=cuda timeout 240 $D/bin/test_model --gtest_brief=1 > "$OUTDIR/test_model_cuda.log" 2>&1
  echo "test_model(cuda) rc=$?"; grep -E "FAILED|PASSED|SKIPPED|tests ran|Failure|Expected|Which is|fast |max " "$OUTDIR/test_model_cuda.log" | head -40
  KILN_TEST_DEVICE=cuda timeout 180 $D/bin/test_engine --gtest_brief=1 > "$OUTDIR/test_engine_cuda.log" 2>&1
  echo "test_engine(cuda) rc=$?"; grep -E "FAILED|PASSED|SKIPPED|tests ran|Failure" "$OUTDIR/test_engine_cuda.log" | head -30
fi
if [[ " $WHAT " == *" bench "* ]]; then
  M=/tmp/kiln-models && mkdir -p $M
  # Llama-3.2-1B and Llama-3-8B shapes with the Llama 3 tokenizer (128256 rows).
  L1B="--layers 16 --hidden 2048 --heads 32 --kv-heads 8 --ffn 8192 --tied"
  L8B="--layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ffn 14336"
  IFS='|' read -ra specs <<< "${BENCH_MODELS:-1b q4_k_m}"
  for spec in "${specs[@]}"; do
    set -- $spec
    f=$M/llama-$1-$2.gguf
    dims=$L1B; [ "$1" = 8b ] && dims=$L8B
    if [ ! -f "$f" ]; then
      t0=$(date +%s)
      timeout ${MAKE_TIMEOUT:-240} $D/bin/kiln make-model --arch llama $dims --type "$2" \
        --tokenizer $D/tokenizer/llama3 -o "$f" >/dev/null || { echo "make-model $1 $2 failed"; rm -f "$f"; }
      echo "make-model $1 $2: $(( $(date +%s) - t0 )) s"
    fi
  done
  for f in $M/*.gguf; do
    timeout 120 $D/bin/kiln bench -m "$f" --device cuda -p 512 -n 128 -r 3 2>&1 | grep -v "^I " |
      tee -a "$OUTDIR/bench.log"
    timeout 120 $D/bin/kiln bench -m "$f" --device cuda -p 4096 -n 0 -b 4096 -r 3 2>&1 |
      grep -v "^I " | tee -a "$OUTDIR/bench.log"
  done
fi
