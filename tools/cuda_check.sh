#!/usr/bin/env bash
# Runs on the GPU machine (a device call carrying build-dev/ made by tools/cuda_pack.sh):
# unpacks the binaries, then runs what is asked:
#   new     the tests of kernels not yet run on a GPU (NEW_FILTER), each alone, then under
#           compute-sanitizer memcheck and racecheck (a crash there leaves the rest of the
#           call's sections their GPU): run it before tests
#   tests   every CUDA kernel test, and the model and engine tests on the CUDA backend
#           (KILN_TEST_DEVICE=cuda), under the paths the binaries were built with
#   bench   kiln bench on random-weight Llama-shaped files made there (kiln make-model)
#   kbench  the matmul and attention kernel benchmarks
#   ab      tg128 with each of AB_VARS (default KILN_CUDA_MATVEC KILN_CUDA_PDL) set to each of
#           AB_VALUES (default 1 0), then with each build-dev/kiln-*.xz (another build)
#   graphs  tg128 with and without CUDA graphs
#   serve   kiln serve under kiln bench http (SERVE_FLAGS: more serve flags; SERVE_BATCH: the
#           step's token flags, default --max-batch-tokens 2048 --step-prompt-tokens 0;
#           SERVE_BENCH_FLAGS: more bench http flags, e.g. --temperature 0.8);
#           profile: ncu over decode steps (PROFILE_BENCH: other kiln bench flags, e.g. a
#           prefill's; NCU_SKIP / NCU_COUNT: the launches skipped and profiled)
#   prefill pp512 and pp4096 with each of AB_VAR (default KILN_CUDA_F16_WEIGHTS
#           KILN_CUDA_ATTN_EXP2 KILN_CUDA_DEQUANT_ROWS) set to each of AB_VALUES (default 1 0),
#           alternated over two rounds, on the first bench model
#   det     --deterministic: its kernel, model and engine tests on CUDA, then its cost on the 8B
#           Q4_K_M file (batch 1 tg128/pp512 and 16/64 sequences at depth 512, alternated with
#           the default; bench models are made first when missing)
#   moe     the fused MoE decode (KILN_CUDA_MOE_FUSE): its kernel tests, then on a Qwen3-30B-A3B
#           shaped Q4_K_M file made there: tg128 and 8 sequences' decode at 1 and 0,
#           alternated over two rounds, and the roofline of a decode step each way
#   e2e     the node e2e suites against kiln on the GPU (E2E=1 tools/cuda_pack.sh)
#   llama   build llama.cpp (build-llama/llama-src.tar.xz, made by tools/llama_src.sh) in the background; side: kiln and
#           llama-bench on each bench model in turn
# Figures and logs go to $OUT when set. Default: tests bench.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHAT=${*:-tests bench}
D=/tmp/kiln-dev
# KEEP_UNPACKED=1: reuse the binaries a call before unpacked (its background jobs may be using them).
if [ -z "${KEEP_UNPACKED:-}" ] || [ ! -x $D/bin/kiln ]; then
  rm -rf $D && mkdir -p $D && tar -C $D -xJf build-dev/bundle.tar.xz
fi
export LD_LIBRARY_PATH=$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# The tests find fixtures at the source path they were built in and ../shared beside it.
# (An absolute source path the binary holds; grep -a: the GPU machine has no `strings`.)
SRC=$(grep -a -o '/[[:alnum:]_.+-][[:alnum:]_./+-]*/src/kiln/[a-z_/]*\.cpp' $D/bin/test_model |
  grep -v '/\.\./' | head -1 | sed 's|/src/kiln/.*||' || true)
[ -n "$SRC" ] || SRC=$ROOT
mkdir -p "$(dirname "$SRC")"
[ -e "$SRC" ] || ln -s "$ROOT" "$SRC"
if [ ! -e "$(dirname "$SRC")/shared/models/stories260K.gguf" ]; then
  rm -rf "$(dirname "$SRC")/shared"
  ln -s $D/shared "$(dirname "$SRC")/shared"
fi
ls -la "$(dirname "$SRC")/shared/models/" | head -5
OUTDIR=${OUT:-/tmp/kiln-out}
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
$D/bin/kiln doctor
LL=/tmp/llama-build
if [[ " $WHAT " == *" llama "* ]] && [ ! -x $LL/bin/llama-bench ]; then
  # llama.cpp 0253fb21 (a trimmed source tree in build-llama/, made outside the repository from
  # `fetch github:kmbandy/llama.cpp`), built here in the background for the side-by-side runs.
  rm -rf /tmp/llama-src && mkdir -p /tmp/llama-src && tar -C /tmp/llama-src -xJf build-llama/llama-src.tar.xz
  # LLAMA_DETACH=1: in its own process session, so that it goes on after this call returns
  # (the machine stays warm between calls made back to back); `side` waits for it.
  LB="cmake -S /tmp/llama-src -B $LL -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      > /tmp/llama_build.log 2>&1 &&
    timeout ${LLAMA_BUILD_TIMEOUT:-900} ninja -C $LL -j ${LLAMA_JOBS:-14} llama-bench >> /tmp/llama_build.log 2>&1;
    echo \"llama.cpp build rc=\$? \$(date +%T)\" >> /tmp/llama_build.log"
  if [ -n "${LLAMA_DETACH:-}" ]; then
    setsid nohup bash -c "$LB" > /dev/null 2>&1 < /dev/null &
  else
    bash -c "$LB" &
    LLAMA_PID=$!
  fi
  echo "llama.cpp build started $(date +%T)"
fi
if [[ " $WHAT " == *" new "* ]]; then
  export KILN_TEST_LLAMA3_TOKENIZER=$D/tokenizer/llama3
  NF=${NEW_FILTER:-CudaDequant.*:CudaMoeDecode.*:CudaMatmul.MixedTypesInOneLaunchEqualTwoLaunches:CudaMatmul.HalfMatvecLongRows:CudaMatmul.EveryTypeMatchesReference:CudaMatmul.Fp16CopyEqualsDequantizedChunks:CudaMatmul.Fp16CopyTakesBatchedDecodeSteps:CudaAttention.*:CudaMoe.*:CudaMatvecId.*}
  IFS=':' read -ra new_tests <<< "$NF"
  for t in "${new_tests[@]}"; do
    log="$OUTDIR/new_${t//[^A-Za-z0-9_]/_}.log"
    timeout 120 $D/bin/test_cuda --gtest_brief=1 --gtest_filter="$t" > "$log" 2>&1
    echo "test_cuda $t rc=$?"; grep -E "FAILED|PASSED|SKIPPED|Failure|error" "$log" | head -8
  done
  KILN_TEST_DEVICE=cuda timeout 120 $D/bin/test_model --gtest_brief=1 \
    --gtest_filter='MoeDecodeFusion.*' > "$OUTDIR/new_model.log" 2>&1
  echo "test_model MoeDecodeFusion rc=$?"; grep -E "FAILED|PASSED|Failure|fused|CPU|twice|Expected|Which" "$OUTDIR/new_model.log" | head -40
  SF=${SANITIZE_FILTER:-CudaMoeDecode.*:CudaMatmul.MixedTypesInOneLaunchEqualTwoLaunches:CudaMatmul.HalfMatvecLongRows}
  timeout 240 compute-sanitizer --tool memcheck $D/bin/test_cuda --gtest_brief=1 \
    --gtest_filter="$SF" > "$OUTDIR/new_memcheck.log" 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|Invalid|FAILED|PASSED" "$OUTDIR/new_memcheck.log" | head -8
  timeout 240 compute-sanitizer --tool racecheck $D/bin/test_cuda --gtest_brief=1 \
    --gtest_filter="${RACE_FILTER:-CudaMoeDecode.*}" > "$OUTDIR/new_racecheck.log" 2>&1
  echo "racecheck rc=$?"; grep -E "ERROR SUMMARY|hazard|FAILED|PASSED" "$OUTDIR/new_racecheck.log" | head -8
fi
if [[ " $WHAT " == *" tests "* ]]; then
  export KILN_TEST_LLAMA3_TOKENIZER=$D/tokenizer/llama3  # CrossBackend.* (test_model)
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
    [ -n "${MAKE_ONLY:-}" ] && break
    timeout 120 $D/bin/kiln bench -m "$f" --device cuda -p 512 -n 128 -r 3 2>&1 | grep -v "^I " |
      tee -a "$OUTDIR/bench.log"
    timeout 120 $D/bin/kiln bench -m "$f" --device cuda -p 4096 -n 0 -b 4096 -r 3 2>&1 |
      grep -v "^I " | tee -a "$OUTDIR/bench.log"
  done
fi
if [ -n "${LLAMA_PID:-}" ]; then
  wait $LLAMA_PID; tail -3 /tmp/llama_build.log; ls -la $LL/bin/llama-bench
fi
if [[ " $WHAT " == *" side "* ]]; then
  for i in $(seq 1 ${LLAMA_WAIT:-0}); do [ -x $LL/bin/llama-bench ] && break; sleep 1; done
  [ -f /tmp/llama_build.log ] && { tail -2 /tmp/llama_build.log; cp /tmp/llama_build.log "$OUTDIR/"; }
fi
if [[ " $WHAT " == *" side "* ]]; then
  # kiln and llama.cpp on the same files, one file after the other (interleaved), same session.
  for f in ${SIDE_MODELS:-/tmp/kiln-models/*.gguf}; do
    echo "== $(basename $f)"
    timeout 150 $D/bin/kiln bench -m "$f" --device cuda -p 512 -n 128 -r 3 2>&1 | grep -E "^\| llama|by repetition" | tee -a "$OUTDIR/side.log"
    timeout 150 $D/bin/kiln bench -m "$f" --device cuda -p 4096 -n 0 -b 4096 -r 3 2>&1 | grep -E "^\| llama" | tee -a "$OUTDIR/side.log"
    [ -x $LL/bin/llama-bench ] && timeout 240 $LL/bin/llama-bench -m "$f" -ngl 99 -fa 1 -p 512,4096 -n 128 -r 3 2>&1 |
      grep -E "^\| llama|error" | tee -a "$OUTDIR/side.log"
  done
fi
if [[ " $WHAT " == *" kbench "* ]]; then
  # The matmul kernels alone: decode (1, 4, 8 tokens) and prefill shapes per type.
  KILN_CUDA_BENCH=1 timeout ${KBENCH_TIMEOUT:-200} $D/bin/test_cuda \
    --gtest_filter="${KBENCH_FILTER:-CudaMatmulBench.DecodeAndPrefill:CudaMatmulBench.LogitsCopyPerStep}" 2>&1 |
    grep -vE "^\[ |^Note:" | tee "$OUTDIR/kbench.log"
  timeout 200 $D/bin/test_cuda --gtest_also_run_disabled_tests \
    --gtest_filter='CudaAttentionBench.*' 2>&1 | grep -vE "^\[ |^Note:" | tee -a "$OUTDIR/kbench.log"
fi
if [[ " $WHAT " == *" ab "* ]]; then
  # Decode (tg128) with each switch of AB_VARS on and off, on AB_MODEL (default: the first).
  for f in ${AB_MODEL:-/tmp/kiln-models/*.gguf}; do
  for var in ${AB_VARS:-KILN_CUDA_MATVEC KILN_CUDA_PDL}; do
    for v in ${AB_VALUES:-1 0}; do
      echo "$(basename $f) $var=$v"
      env $var=$v timeout 120 $D/bin/kiln bench -m "$f" --device cuda -p 0 -n 128 -r 3 2>&1 |
        grep -E "tg128" | tee -a "$OUTDIR/bench.log"
    done
  done
  # Other builds of kiln carried beside the bundle (a compile-time variant, an older commit):
  # build-dev/kiln-NAME.xz: xz-compressed, stripped.
  for alt in build-dev/kiln-*.xz; do
    [ -f "$alt" ] || continue
    b=$D/bin/$(basename "$alt" .xz)
    [ -x "$b" ] || { xz -dc "$alt" > "$b" && chmod +x "$b"; }
    echo "$(basename $f) $(basename $b)"
    timeout 120 "$b" bench -m "$f" --device cuda -p 0 -n 128 -r 3 2>&1 |
      grep -E "tg128" | tee -a "$OUTDIR/bench.log"
  done
  done
fi
if [[ " $WHAT " == *" prefill "* ]]; then
  f=$(ls /tmp/kiln-models/*.gguf | head -1)
  for var in ${AB_VAR:-KILN_CUDA_F16_WEIGHTS KILN_CUDA_ATTN_EXP2 KILN_CUDA_DEQUANT_ROWS}; do
  for round in 1 2; do
    for v in ${AB_VALUES:-1 0}; do
      echo "== round $round $var=$v $(basename $f)"
      env $var=$v timeout 120 $D/bin/kiln bench -m "$f" \
        --device cuda -p 512 -n 0 -r 3 2>&1 | grep -E "pp512"
      env $var=$v timeout 120 $D/bin/kiln bench -m "$f" \
        --device cuda -p 4096 -n 0 -b 4096 -r 3 2>&1 | grep -E "pp4096"
    done
  done
  done 2>&1 | tee -a "$OUTDIR/prefill.log"
fi
if [[ " $WHAT " == *" moe "* ]]; then
  timeout 120 $D/bin/test_cuda --gtest_brief=1 --gtest_filter='CudaMoe*:CudaMatvecId*' 2>&1 |
    grep -E "FAILED|PASSED|SKIPPED|Failure" | head -20
  MM=/tmp/kiln-moe && mkdir -p $MM
  f=$MM/qwen3-30b-a3b-q4_k_m.gguf
  if [ ! -f "$f" ]; then
    t0=$(date +%s)
    timeout ${MAKE_TIMEOUT:-240} $D/bin/kiln make-model --config $ROOT/tools/bench_configs/qwen3-30b-a3b.json \
      --type q4_k_m --tokenizer $D/tokenizer/llama3 --distinct-rows 256 -o "$f" >/dev/null ||
      { echo "make-model qwen3-30b-a3b failed"; rm -f "$f"; }
    echo "make-model qwen3-30b-a3b: $(( $(date +%s) - t0 )) s"
  fi
  for round in 1 2; do
    for v in ${AB_VALUES:-1 0}; do
      echo "== round $round KILN_CUDA_MOE_FUSE=$v"
      KILN_CUDA_MOE_FUSE=$v timeout 120 $D/bin/kiln bench -m "$f" --device cuda -p 0 -n 128 -r 3 2>&1 |
        grep -E "tg128"
      KILN_CUDA_MOE_FUSE=$v timeout 120 $D/bin/kiln bench -m "$f" --device cuda -p 0 -n 64 \
        --parallel 8 -d 512 -r 2 2>&1 | grep -E "^\| |tok/s" | tail -2
    done
  done 2>&1 | tee -a "$OUTDIR/moe.log"
  for v in 1 0; do
    echo "== roofline KILN_CUDA_MOE_FUSE=$v"
    KILN_CUDA_MOE_FUSE=$v timeout 120 $D/bin/kiln bench -m "$f" --device cuda -p 0 -n 64 -r 1 \
      --roofline 2>&1 | grep -vE "^I " | tail -25
  done 2>&1 | tee -a "$OUTDIR/moe.log"
fi
if [[ " $WHAT " == *" graphs "* ]]; then
  # Decode with and without CUDA graphs on the first bench model.
  f=$(ls /tmp/kiln-models/*.gguf | head -1)
  for g in 1 0; do
    echo "KILN_CUDA_GRAPHS=$g"
    KILN_CUDA_GRAPHS=$g timeout 120 $D/bin/kiln bench -m "$f" --device cuda -p 0 -n 128 -r 3 2>&1 |
      grep -E "tg128|by repetition" | tee -a "$OUTDIR/bench.log"
  done
fi
if [[ " $WHAT " == *" det "* ]]; then
  export KILN_TEST_LLAMA3_TOKENIZER=$D/tokenizer/llama3
  timeout 120 $D/bin/test_cuda --gtest_brief=1 --gtest_filter='CudaMatmul.Deterministic*' \
    > "$OUTDIR/det_cuda.log" 2>&1
  echo "test_cuda deterministic rc=$?"; grep -E "FAILED|PASSED|Failure|Expected|Which" "$OUTDIR/det_cuda.log" | head -20
  KILN_TEST_DEVICE=cuda timeout 120 $D/bin/test_model --gtest_brief=1 \
    --gtest_filter='BatchInvariance.*:HybridState.*' > "$OUTDIR/det_model.log" 2>&1
  echo "test_model(cuda) deterministic rc=$?"; grep -E "FAILED|PASSED|differ|Failure" "$OUTDIR/det_model.log" | head -20
  KILN_TEST_DEVICE=cuda timeout 120 $D/bin/test_engine --gtest_brief=1 \
    --gtest_filter='HybridEngine.*' > "$OUTDIR/det_engine.log" 2>&1
  echo "test_engine(cuda) deterministic rc=$?"; grep -E "FAILED|PASSED|Failure" "$OUTDIR/det_engine.log" | head -10
  f=/tmp/kiln-models/llama-8b-q4_k_m.gguf
  mkdir -p /tmp/kiln-models
  [ -f $f ] || $D/bin/kiln make-model --arch llama --layers 32 --hidden 4096 --heads 32 \
    --kv-heads 8 --ffn 14336 --type q4_k_m --tokenizer $D/tokenizer/llama3 --distinct-rows 256 \
    -o $f > /dev/null
  for round in 1 2; do
    for det in "" --deterministic; do
      echo "== round $round ${det:-default}"
      timeout 90 $D/bin/kiln bench -m $f --device cuda -p 512 -n 128 -r 3 $det 2>&1 | grep -E "pp512|tg128"
      for p in 16 64; do
        timeout 90 $D/bin/kiln bench -m $f --device cuda -p 0 -n 64 --parallel $p -d 512 -r 2 $det 2>&1 |
          grep -E "^\| llama"
      done
    done
  done 2>&1 | tee "$OUTDIR/det_bench.log"
fi
if [[ " $WHAT " == *" serve "* ]]; then
  # kiln serve on the GPU under kiln bench http (~400-token prompts, 256 out).
  f=$(ls /tmp/kiln-models/*.gguf | head -1)
  # One client (this host) opens up to 128 connections: past the per-client default of 64.
  $D/bin/kiln serve -m "$f" --device cuda --port 18080 --ctx 2048 --max-seqs ${SERVE_MAX_SEQS:-64} \
    ${SERVE_BATCH:---max-batch-tokens 2048 --step-prompt-tokens 0} --max-connections-per-client 256 \
    ${SERVE_FLAGS:-} > "$OUTDIR/serve.log" 2>&1 &
  SP=$!
  for i in $(seq 1 60); do curl -sf http://127.0.0.1:18080/health >/dev/null && break; sleep 1; done
  grep -E "memory plan|engine:" "$OUTDIR/serve.log"
  timeout ${SERVE_TIMEOUT:-150} $D/bin/kiln bench http --url http://127.0.0.1:18080 \
    --concurrency ${SERVE_CONC:-1,16,64} --requests ${SERVE_REQS:-64} --prompt-tokens 400 \
    --max-tokens 256 --endpoint completions --server-metrics ${SERVE_BENCH_FLAGS:-} 2>&1 |
    tee -a "$OUTDIR/serve_bench.log"
  kill $SP; wait $SP 2>/dev/null
fi
if [[ " $WHAT " == *" e2e "* ]]; then
  # The node e2e suites against kiln on this machine's default device (the GPU: the suites
  # pass no --device). Needs build-dev/node.tar.xz (E2E=1 tools/cuda_pack.sh).
  N=/tmp/kiln-node && rm -rf $N && mkdir -p $N && tar -C $N -xJf build-dev/node.tar.xz
  rm -rf "$ROOT/node_modules" && ln -s $N/node_modules "$ROOT/node_modules"
  $D/bin/kiln run -m "$(dirname "$SRC")/shared/models/stories260K.gguf" -p "Once" -n 4 2>&1 |
    grep -iE "device|memory plan" | head -3
  for t in ${E2E_TESTS:-serve soak tiny_serve grammar_serve anthropic anthropic_thinking bench}; do
    KILN_BIN=$D/bin/kiln KILN_SHARED="$(dirname "$SRC")/shared" timeout 300 $N/node --test \
      "$ROOT/tests/e2e/${t}_test.mjs" > "$OUTDIR/e2e_$t.log" 2>&1
    echo "e2e $t rc=$? $(grep -E '^# (pass|fail|skipped)' "$OUTDIR/e2e_$t.log" | tr '\n' ' ')"
    grep -E "^not ok|Error|expected|actual" "$OUTDIR/e2e_$t.log" | head -10
  done
fi
if [[ " $WHAT " == *" profile "* ]]; then
  # Where a decode step's time goes: ncu over ~1.5 eager decode steps (after prefill and
  # warm-up), time and DRAM bytes per kernel, summed by kernel name.
  for f in ${PROFILE_MODELS:-$(ls /tmp/kiln-models/*.gguf | head -1)}; do
  echo "== $(basename $f)"
  KILN_CUDA_GRAPHS=0 timeout 240 ncu --clock-control none --launch-skip ${NCU_SKIP:-3000} \
    --launch-count ${NCU_COUNT:-400} --print-units base --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    --csv $D/bin/kiln bench -m "$f" --device cuda ${PROFILE_BENCH:--p 0 -n 64 -r 1} > "$OUTDIR/ncu.csv" 2>/dev/null
  python3 - "$OUTDIR/ncu.csv" <<'PY' | tee -a "$OUTDIR/ncu_summary.txt"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; rows = rows[1:]
ki, mi, vi = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
t = collections.defaultdict(float); b = collections.defaultdict(float); n = collections.Counter()
for r in rows:
    k = r[ki].split("(")[0][:70]
    v = float(r[vi].replace(",", ""))
    if r[mi] == "gpu__time_duration.sum": t[k] += v; n[k] += 1
    elif r[mi] == "dram__bytes_read.sum": b[k] += v
tot = sum(t.values())
print(f"{len(rows)//2} kernels, {tot/1e3:.1f} us total")
for k, v in sorted(t.items(), key=lambda x: -x[1])[:25]:
    print(f"{v/1e3:10.1f} us {100*v/tot:5.1f}% x{n[k]:4d}  {b[k]/max(v,1):7.1f} GB/s  {k}")
PY
  done
fi
