// Rope over one prefill step of a Qwen3-0.6B-shaped model (512 tokens, 28 layers, 16 q and 8 kv
// heads of 128): the scalar reference rope() (pow + sincos per token, head and pair, for Q and
// K of every layer, as the forward did) against the forward's path now (rope_angles once per
// step, rope_apply per layer). Reported per step.
//
//   ./build/bench_rope_bench
#include <benchmark/benchmark.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "kiln/backend/cpu/ops.h"

namespace {

namespace cpu = kiln::backend::cpu;

constexpr int64_t kTokens = 512;
constexpr int kLayers = 28;
constexpr int32_t kHeads = 16, kKvHeads = 8, kHeadDim = 128;
constexpr float kBase = 1e6f;

struct Step {
  std::vector<int32_t> positions = std::vector<int32_t>(kTokens);
  std::vector<float> q = std::vector<float>(kTokens * kHeads * kHeadDim, 0.5f);
  std::vector<float> k = std::vector<float>(kTokens * kKvHeads * kHeadDim, 0.25f);
  Step() { std::iota(positions.begin(), positions.end(), 1000); }
};

void BM_RopeScalarPerLayer(benchmark::State& state) {
  Step s;
  for (auto _ : state) {
    for (int l = 0; l < kLayers; ++l) {
      cpu::rope(s.q.data(), s.positions.data(), kTokens, kHeads, kHeadDim, kHeadDim, kBase, true);
      cpu::rope(s.k.data(), s.positions.data(), kTokens, kKvHeads, kHeadDim, kHeadDim, kBase, true);
    }
    benchmark::DoNotOptimize(s.q.data());
  }
}
BENCHMARK(BM_RopeScalarPerLayer)->Unit(benchmark::kMillisecond);

void BM_RopeAnglesOncePerStep(benchmark::State& state) {
  Step s;
  constexpr int32_t half = kHeadDim / 2;
  std::vector<double> inv(half);
  for (int32_t i = 0; i < half; ++i) inv[i] = std::pow(double{kBase}, -2.0 * i / kHeadDim);
  std::vector<float> cs(kTokens * half), sn(kTokens * half);
  for (auto _ : state) {
    cpu::rope_angles(inv.data(), half, s.positions.data(), kTokens, 1.0f, cs.data(), sn.data());
    for (int l = 0; l < kLayers; ++l) {
      cpu::rope_apply(s.q.data(), kTokens, kHeads, kHeadDim, half, true, cs.data(), sn.data());
      cpu::rope_apply(s.k.data(), kTokens, kKvHeads, kHeadDim, half, true, cs.data(), sn.data());
    }
    benchmark::DoNotOptimize(s.q.data());
  }
}
BENCHMARK(BM_RopeAnglesOncePerStep)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
