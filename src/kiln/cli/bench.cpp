// kiln bench: prompt-processing and generation speed, like llama-bench.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/backend/backend.h"
#include "kiln/cli/bench_report.h"
#include "kiln/cli/commands.h"
#include "kiln/cli/flags.h"
#include "kiln/cli/model_files.h"
#include "kiln/engine/sequence.h"
#include "kiln/kv/kv_cache.h"
#include "kiln/model/model.h"
#include "kiln/util/cpu.h"
#include "kiln/util/thread_pool.h"

namespace kiln::cli {
namespace {

struct BenchOptions {
  std::string model;
  int32_t n_prompt = 512;
  int32_t n_gen = 128;
  int32_t reps = 3;
  int threads = 0;
  std::string device = "auto";
  int32_t batch = 512;  // prefill chunk
  std::string kv_type = "f16";
  bool json = false;
};

using Figure = BenchFigure;

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
                                      backend::Backend& be, quant::Type kv_type) {
  std::vector<Figure> out;
  const uint32_t v = m.hparams().n_vocab;
  const int32_t n_ctx = std::max(o.n_prompt, o.n_gen) + 1;
  KILN_TRY(auto seq, engine::SequenceRunner::create(m, be, n_ctx, o.batch, kv_type));
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
    // One decode step per token, its logits back on the host each step, the next token not
    // drawn from them: llama-bench's generation test (it feeds random tokens), so that the two
    // time the same work. (A greedy argmax over a 128k vocabulary on the host adds ~50 us a
    // token: kiln run and kiln serve pay it, `kiln bench http` measures it.)
    const std::vector<int32_t> gen = bench_tokens(o.n_gen, v);
    Figure f{fmt::format("tg{}", o.n_gen), o.n_gen, {}};
    for (int r = -1; r < o.reps; ++r) {
      seq->truncate(0);
      const auto t0 = std::chrono::steady_clock::now();
      for (int32_t i = 0; i < o.n_gen; ++i) {
        KILN_TRY_STATUS(seq->append(std::span<const int32_t>(&gen[i], 1)));
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
  auto be = backend::create_backend({o.device, threads});
  if (!be.ok()) {
    fmt::print(stderr, "kiln bench: {}\n", be.error().message);
    return 1;
  }
  const std::string test_time = utc_now_iso8601();
  auto figs = measure(**m, o, **be, *kv_type);
  if (!figs.ok()) {
    fmt::print(stderr, "kiln bench: {}\n", figs.error().message);
    return 1;
  }
  const model::Model& model = **m;
  BenchRunInfo run;
  run.model_path = o.model;
  run.arch = model.hparams().arch;
  run.size_bytes = model.file().size_bytes();
  run.weight_bytes_per_token = model.weight_bytes_per_token();
  for (const auto& t : model.file().tensors())
    run.params += static_cast<uint64_t>(t.num_elements());
  run.type_kv = quant::type_name(*kv_type);
  run.n_batch = o.batch;
  run.test_time = test_time;
  run.backend = (*be)->name();
  const ThreadPlacement placement =
      current_thread_placement(threads, util::default_spin_us(threads));
  if (o.json) {
    fmt::print("{}\n", bench_json(run, placement, *figs).dump(2));
    return 0;
  }
  print_bench_table(run, placement, *figs);
  fmt::print(stderr, "kiln bench: {} | {} bytes of weights read per generated token\n",
             util::to_string(util::cpu_features()), run.weight_bytes_per_token);
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
  cmd->add_option("--device", o->device, "cpu, cuda, cuda:N or auto")->capture_default_str();
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
