#!/bin/bash
# Device run for the CUDA attention branch (h/cuda-attn): tests, benchmark, sanitizers, ncu.
# Carry build-dev-attn (this script and test_cuda copied there) and build-devlibs; run from the
# repository root on the device machine: bash build-dev-attn/run.sh [test binary].
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/build-devlibs:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
B=${1:-build-dev-attn/test_cuda}  # or build-dev-attn/test_cuda_v2
nvidia-smi -L
echo "== tests"
timeout 40 $B --gtest_filter='*Attention*:*Kv*:CudaDevice*' > $OUT/tests.log 2>&1; echo "tests rc=$?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |worst|Failure|assert| tests? ran" $OUT/tests.log | head -30
grep -B2 -A3 "Failure" $OUT/tests.log | head -40
echo "== bench"
timeout 30 $B --gtest_filter='CudaAttentionBench.*' --gtest_also_run_disabled_tests > $OUT/bench.log 2>&1; echo "bench rc=$?"
grep -v "^\[" $OUT/bench.log | grep -v "^Running\|^Note" | head -30
echo "== memcheck"
timeout 50 compute-sanitizer --tool memcheck $B --gtest_filter='*Attention*:*Kv*' > $OUT/memcheck.log 2>&1; echo "memcheck rc=$?"
grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | head -5; grep -m3 -A4 "Invalid" $OUT/memcheck.log
echo "== racecheck"
timeout 40 compute-sanitizer --tool racecheck $B --gtest_filter='CudaAttention.Other*:CudaAttention.Long*' > $OUT/racecheck.log 2>&1; echo "racecheck rc=$?"
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" $OUT/racecheck.log | head -5; grep -m4 -A3 "hazard" $OUT/racecheck.log
echo "== ncu"
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats"
timeout 30 ncu --clock-control none -k regex:decode_kernel --launch-skip 136 -c 1 $S $B --gtest_filter='CudaAttentionBench.*' --gtest_also_run_disabled_tests > $OUT/ncu_decode.log 2>&1; echo "ncu rc=$?"
timeout 30 ncu --clock-control none -k regex:prefill_kernel --launch-skip 2 -c 1 $S $B --gtest_filter='CudaAttentionBench.*' --gtest_also_run_disabled_tests > $OUT/ncu_prefill.log 2>&1; echo "ncu rc=$?"
for f in $OUT/ncu_decode.log $OUT/ncu_prefill.log; do grep -E "decode_kernel|prefill_kernel|Memory Throughput|DRAM Throughput|Compute \(SM\)|Duration|Achieved Occupancy|Theoretical Occupancy|Block Limit (Reg|Shared)|Registers Per|Stall" $f | head -16; done
