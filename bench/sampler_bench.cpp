// Sampling time per token (microseconds) for Llama-2 (32k), Llama-3 (128k) and Qwen2/3 (152k)
// vocabularies: greedy, top-k 40, top-p 0.9, and the full chain with penalties and logprobs.
// Logits are normal(0, 1) * 3 plus a few peaked tokens, a rough stand-in for a real model's.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "kiln/engine/sampler.h"

namespace {

using kiln::engine::Rng;
using kiln::engine::Sampler;
using kiln::engine::SamplingParams;

// peaked: normal(0, 2) with a few tokens 12-18 above (a confident model: the nucleus at 0.9
// holds a handful of tokens). flat: normal(0, 3), no peaks (the worst case for top-p: the
// nucleus is most of the vocabulary).
std::vector<float> make_logits(int32_t n_vocab, bool peaked) {
  Rng rng(99);
  std::vector<float> out(static_cast<size_t>(n_vocab));
  const double sigma = peaked ? 2.0 : 3.0;
  for (auto& x : out) {
    const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
    x = static_cast<float>(sigma * std::sqrt(-2.0 * std::log(u1)) *
                           std::cos(6.283185307179586 * u2));
  }
  if (peaked) {
    for (int i = 0; i < 8; ++i)
      out[rng.next() % out.size()] += 12.0f + static_cast<float>(i) * 0.8f;
  }
  return out;
}

enum Mode : int64_t { kGreedy, kTopK40, kTopP09, kTemperature, kFull };

void BM_Sample(benchmark::State& state) {
  const auto n_vocab = static_cast<int32_t>(state.range(0));
  SamplingParams p;
  p.seed = 1;
  switch (static_cast<Mode>(state.range(1))) {
    case kGreedy:
      p.temperature = 0.0f;
      break;
    case kTopK40:
      p.top_k = 40;
      break;
    case kTopP09:
      p.top_p = 0.9f;
      break;
    case kTemperature:
      p.temperature = 0.8f;
      break;
    case kFull:
      p.top_k = 0;
      p.top_p = 0.95f;
      p.min_p = 0.05f;
      p.repetition_penalty = 1.1f;
      p.frequency_penalty = 0.2f;
      p.logprobs = true;
      p.top_logprobs = 5;
      break;
  }
  const bool peaked = state.range(2) == 0;
  const std::vector<float> logits = make_logits(n_vocab, peaked);
  std::vector<int32_t> history;
  for (int i = 0; i < 512; ++i) history.push_back(static_cast<int32_t>((i * 7919) % n_vocab));
  Sampler sampler(p, n_vocab);
  for (auto _ : state) {
    auto r = sampler.sample(logits, history);
    benchmark::DoNotOptimize(r.token);
  }
  const char* const modes[] = {"greedy", "top_k=40", "top_p=0.9", "temp=0.8",
                               "top_p=.95 min_p=.05 penalties logprobs=5"};
  state.SetLabel(std::string(modes[state.range(1)]) + (peaked ? " peaked" : " flat"));
}

BENCHMARK(BM_Sample)
    ->ArgsProduct({{32000, 128256, 151936},
                   {kGreedy, kTopK40, kTopP09, kTemperature, kFull},
                   {0, 1}})
    ->ArgNames({"vocab", "mode", "flat"})
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
