// kiln bench: prompt-processing and generation speed, like llama-bench (the measurements:
// engine/bench.h).
#include <algorithm>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/backend/backend.h"
#include "kiln/cli/bench_report.h"
#include "kiln/cli/commands.h"
#include "kiln/cli/flags.h"
#include "kiln/cli/model_files.h"
#include "kiln/engine/bench.h"
#include "kiln/kv/kv_cache.h"
#include "kiln/model/model.h"
#include "kiln/util/cpu.h"
#include "kiln/util/thread_pool.h"

namespace kiln::cli {
namespace {

struct BenchOptions {
  std::string model;
  engine::BenchPlan plan;  // the flags bind its fields; kv_type from the string below
  int threads = 0;
  std::string device = "auto";
  std::string kv_type = "f16";
  bool json = false;
  bool deterministic = false;
};

int run_bench(BenchOptions o) {
  auto kv_type = kv::parse_kv_type(o.kv_type);
  if (!kv_type.ok()) {
    fmt::print(stderr, "kiln bench: --kv-type: {}\n", kv_type.error().message);
    return 2;
  }
  if (o.plan.roofline && o.plan.n_gen == 0) {
    fmt::print(stderr, "kiln bench: --roofline profiles decode steps: it needs -n > 0\n");
    return 2;
  }
  if (int64_t{o.plan.depth} + std::max(o.plan.n_prompt, o.plan.n_gen) + 1 > kMaxContext) {
    fmt::print(stderr, "kiln bench: --depth {} + {} tokens exceed the longest context ({})\n",
               o.plan.depth, std::max(o.plan.n_prompt, o.plan.n_gen), kMaxContext);
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
  auto be = backend::create_backend({o.device, threads, o.deterministic});
  if (!be.ok()) {
    fmt::print(stderr, "kiln bench: {}\n", be.error().message);
    return 1;
  }
  const std::string test_time = utc_now_iso8601();
  o.plan.kv_type = *kv_type;
  auto result = engine::run_bench(**m, **be, o.plan);
  if (!result.ok()) {
    fmt::print(stderr, "kiln bench: {}\n", result.error().message);
    return 1;
  }
  const std::vector<BenchFigure>& figs = result->figures;
  const engine::Roofline* roofline = result->roofline ? &*result->roofline : nullptr;
  const model::Model& model = **m;
  BenchRunInfo run;
  run.model_path = o.model;
  run.arch = model.hparams().arch;
  run.size_bytes = model.file().size_bytes();
  run.weight_bytes_per_token = model.weight_bytes_per_token();
  for (const auto& t : model.file().tensors())
    run.params += static_cast<uint64_t>(t.num_elements());
  run.type_kv = quant::type_name(*kv_type);
  run.n_batch = o.plan.batch;
  run.test_time = test_time;
  run.backend = (*be)->name();
  run.deterministic = o.deterministic;
  const ThreadPlacement placement =
      current_thread_placement(threads, util::default_spin_us(threads));
  if (o.json) {
    fmt::print("{}\n", bench_json(run, placement, figs, roofline).dump(2));
    return 0;
  }
  print_bench_table(run, placement, figs);
  if (roofline != nullptr) print_roofline(*roofline);
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
  add_ranged(cmd, "-p,--n-prompt", o->plan.n_prompt, 0, kMaxContext - 1, "prompt tokens (0: skip)");
  add_ranged(cmd, "-n,--n-gen", o->plan.n_gen, 0, kMaxContext - 1, "generated tokens (0: skip)");
  cmd->add_option("-r,--repetitions", o->plan.reps, "repetitions")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  add_threads_flag(cmd, o->threads);
  cmd->add_option("--device", o->device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  add_mesh_flags(cmd, o->plan.mesh);
  add_deterministic_flag(cmd, o->deterministic);
  cmd->add_option("-b,--batch", o->plan.batch, "prefill chunk size")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--kv-type", o->kv_type,
                  "KV cache type: f16, f32 or q8_0 (q8_0 needs head dims that are multiples of 32)")
      ->capture_default_str();
  add_ranged(cmd, "-d,--depth", o->plan.depth, 0, kMaxContext - 1,
             "context tokens before each test (llama-bench's -d), prefilled untimed");
  add_ranged(cmd, "--parallel", o->plan.parallel, 1, 4096,
             "sequences decoding together, each after its own --depth context (tg: P x n tokens "
             "per repetition, as llama-batched-bench's S_TG; pp: the P prompts, in steps of -b "
             "rows)");
  cmd->add_flag("--roofline", o->plan.roofline,
                "after the tests, profile eager decode steps: per matmul class the bytes read, "
                "time, GB/s and fraction of the copy bandwidth measured in the same run");
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
