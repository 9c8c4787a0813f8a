// kiln bench: prompt-processing and generation speed, like llama-bench.
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/backend/cpu/ops.h"
#include "kiln/cli/commands.h"
#include "kiln/cli/flags.h"
#include "kiln/cli/model_files.h"
#include "kiln/engine/sequence.h"
#include "kiln/kv/kv_cache.h"
#include "kiln/model/model.h"
#include "kiln/util/cpu.h"

namespace kiln::cli {
namespace {

struct BenchOptions {
  std::string model;
  int32_t n_prompt = 512;
  int32_t n_gen = 128;
  int32_t reps = 3;
  int threads = 0;
  int32_t batch = 512;  // prefill chunk
  std::string kv_type = "f16";
  bool json = false;
};

struct Figure {
  std::string test;
  int32_t n_tokens = 0;
  std::vector<double> tok_per_s;
  double mean() const {
    return std::accumulate(tok_per_s.begin(), tok_per_s.end(), 0.0) / tok_per_s.size();
  }
  double stddev() const {
    if (tok_per_s.size() < 2) return 0;
    const double m = mean();
    double s = 0;
    for (double v : tok_per_s) s += (v - m) * (v - m);
    return std::sqrt(s / (tok_per_s.size() - 1));
  }
};

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Token ids spread over the vocabulary (the content does not change the work).
std::vector<int32_t> bench_tokens(int32_t n, uint32_t n_vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((1 + 7919u * i) % n_vocab);
  return t;
}

Expected<std::vector<Figure>> measure(const model::Model& m, const BenchOptions& o,
                                      util::ThreadPool& pool, quant::Type kv_type) {
  std::vector<Figure> out;
  const uint32_t v = m.hparams().n_vocab;
  const int32_t n_ctx = std::max(o.n_prompt, o.n_gen) + 1;
  KILN_TRY(auto seq, engine::SequenceRunner::create(m, &pool, n_ctx, o.batch, kv_type));
  if (o.n_prompt > 0) {
    Figure f{fmt::format("pp{}", o.n_prompt), o.n_prompt, {}};
    const std::vector<int32_t> prompt = bench_tokens(o.n_prompt, v);
    for (int r = -1; r < o.reps; ++r) {  // r = -1: warm-up
      seq->truncate(0);
      const auto t0 = std::chrono::steady_clock::now();
      KILN_TRY_STATUS(seq->append(prompt));
      if (r >= 0) f.tok_per_s.push_back(o.n_prompt / seconds(t0));
    }
    out.push_back(std::move(f));
  }
  if (o.n_gen > 0) {
    Figure f{fmt::format("tg{}", o.n_gen), o.n_gen, {}};
    for (int r = -1; r < o.reps; ++r) {
      seq->truncate(0);
      int32_t tok = 1;
      const auto t0 = std::chrono::steady_clock::now();
      for (int32_t i = 0; i < o.n_gen; ++i) {
        KILN_TRY(std::span<const float> logits, seq->append(std::span<const int32_t>(&tok, 1)));
        tok = backend::cpu::argmax(logits.data(), v);
      }
      if (r >= 0) f.tok_per_s.push_back(o.n_gen / seconds(t0));
    }
    out.push_back(std::move(f));
  }
  return out;
}

int run_bench(BenchOptions o) {
  auto kv_type = kv::parse_kv_type(o.kv_type);
  if (!kv_type.ok()) {
    fmt::print(stderr, "kiln bench: --kv-type: {}\n", kv_type.error().message);
    return 2;
  }
  auto path = model_path_or_default(o.model);
  if (!path.ok()) {
    fmt::print(stderr, "kiln bench: {}\n", path.error().message);
    return 1;
  }
  o.model = *path;
  auto m = model::Model::load(o.model);
  if (!m.ok()) {
    fmt::print(stderr, "kiln bench: {}\n", m.error().message);
    return 1;
  }
  const int threads = o.threads > 0 ? o.threads : util::default_num_threads();
  util::ThreadPool pool(threads);
  auto figs = measure(**m, o, pool, *kv_type);
  if (!figs.ok()) {
    fmt::print(stderr, "kiln bench: {}\n", figs.error().message);
    return 1;
  }
  const model::Model& model = **m;
  const uint64_t bytes = model.file().size_bytes();
  const uint64_t bytes_per_token = model.weight_bytes_per_token();
  uint64_t params = 0;
  for (const auto& t : model.file().tensors()) params += static_cast<uint64_t>(t.num_elements());
  const std::string arch = model.hparams().arch;
  if (o.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const Figure& f : *figs) {
      j.push_back(
          {{"model", o.model},
           {"arch", arch},
           {"size_bytes", bytes},
           {"params", params},
           {"backend", "cpu"},
           {"threads", threads},
           {"type_kv", quant::type_name(*kv_type)},
           {"test", f.test},
           {"n_tokens", f.n_tokens},
           {"tok_per_s_mean", f.mean()},
           {"tok_per_s_stddev", f.stddev()},
           {"samples", f.tok_per_s},
           {"weight_bytes_per_token", bytes_per_token},
           {"gb_per_s", f.test.starts_with("tg") ? f.mean() * bytes_per_token / 1e9 : 0.0}});
    }
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("| {:<12} | {:>10} | {:>8} | {:<7} | {:>7} | {:>7} | {:>8} | {:>20} | {:>9} |\n",
             "model", "size", "params", "backend", "threads", "type_kv", "test", "t/s", "GB/s");
  fmt::print(
      "| {:-<12} | {:->10} | {:->8} | {:-<7} | {:->7} | {:->7} | {:->8} | {:->20} | {:->9} |\n", "",
      "", "", "", "", "", "", "", "");
  for (const Figure& f : *figs) {
    const std::string gbs =
        f.test.starts_with("tg") ? fmt::format("{:.2f}", f.mean() * bytes_per_token / 1e9) : "";
    fmt::print(
        "| {:<12} | {:>6.2f} MiB | {:>6.2f} M | {:<7} | {:>7} | {:>7} | {:>8} | {:>11.2f} ± "
        "{:>6.2f} "
        "| {:>9} |\n",
        arch, bytes / 1048576.0, params / 1e6, "cpu", threads, quant::type_name(*kv_type), f.test,
        f.mean(), f.stddev(), gbs);
  }
  fmt::print(stderr, "kiln bench: {} | {} bytes of weights read per generated token\n",
             util::to_string(util::cpu_features()), bytes_per_token);
  return 0;
}

}  // namespace

RunFn add_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench", "Prompt-processing and generation speed (`kiln bench http`: a server under load)");
  auto o = std::make_shared<BenchOptions>();
  cmd->add_option("-m,--model", o->model, kDefaultModelHelp);
  add_ranged(cmd, "-p,--n-prompt", o->n_prompt, 0, kMaxContext - 1, "prompt tokens (0: skip)");
  add_ranged(cmd, "-n,--n-gen", o->n_gen, 0, kMaxContext - 1, "generated tokens (0: skip)");
  cmd->add_option("-r,--repetitions", o->reps, "repetitions")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  add_threads_flag(cmd, o->threads);
  cmd->add_option("-b,--batch", o->batch, "prefill chunk size")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--kv-type", o->kv_type,
                  "KV cache type: f16, f32 or q8_0 (q8_0 needs head dims that are multiples of 32)")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "JSON output");
  auto http_chosen = std::make_shared<std::function<bool()>>();
  auto http_run = std::make_shared<RunFn>();
  add_bench_http(*cmd, http_chosen.get(), http_run.get());
  return [o, http_chosen, http_run]() {
    if ((*http_chosen)()) return (*http_run)();
    return run_bench(*o);
  };
}

}  // namespace kiln::cli
