#include "kiln/engine/bench.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include <fmt/format.h>

#include "kiln/engine/batch_runner.h"
#include "kiln/kv/kv_cache.h"

namespace kiln::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Token ids spread over the vocabulary, from the start-th on (the content does not change
// the work; sequences get different ones).
std::vector<int32_t> bench_tokens(int32_t n, uint32_t n_vocab, uint32_t start = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    t[i] = static_cast<int32_t>((1 + 7919u * (start + static_cast<uint32_t>(i))) % n_vocab);
  return t;
}

// Where sequence s's tokens of a test start in bench_tokens (sequence 0: at 0, as before
// --parallel; the others elsewhere).
uint32_t seq_start(int32_t s) {
  return static_cast<uint32_t>(s) * 104729u;
}

constexpr int32_t kRooflineWarmup = 2;  // unprofiled eager steps before the profiled ones

// n_seqs sequences decoding together: one segment of one token per sequence per step.
class DecodeSteps {
 public:
  DecodeSteps(BatchRunner& runner, int32_t n_gen, uint32_t n_vocab) : runner_(runner) {
    for (int32_t s = 0; s < runner.num_seqs(); ++s)
      tokens_.push_back(bench_tokens(n_gen, n_vocab, seq_start(s)));
    segments_.resize(tokens_.size());
  }
  // Step i (its tokens: each sequence's i-th): one sequence's logits back on the host, as
  // llama-bench's; several sequences' argmax ids (the logits left on the device), as a greedy
  // server step takes them (64 rows of a 128k vocabulary are 33 MB a step).
  Status run(int32_t i) {
    for (size_t s = 0; s < tokens_.size(); ++s)
      segments_[s] = {static_cast<int32_t>(s), std::span<const int32_t>(&tokens_[s][i], 1)};
    if (segments_.size() > 1) {
      KILN_TRY_STATUS(runner_.append_argmax(segments_));
    } else {
      KILN_TRY_STATUS(runner_.append(segments_));
    }
    return {};
  }

 private:
  BatchRunner& runner_;
  std::vector<std::vector<int32_t>> tokens_;
  std::vector<BatchRunner::Segment> segments_;
};

Expected<BenchFigure> prompt_test(BatchRunner& runner, const BenchPlan& plan, uint32_t n_vocab) {
  const int32_t p = runner.num_seqs();
  BenchFigure f{bench_test_name(false, plan.n_prompt, p, plan.depth), plan.n_prompt * p, {}};
  f.n_depth = plan.depth;
  f.n_seqs = p;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<BatchRunner::Segment> segments;
  for (int32_t s = 0; s < p; ++s)
    prompts.push_back(bench_tokens(plan.n_prompt, n_vocab, seq_start(s)));
  for (int32_t s = 0; s < p; ++s) segments.push_back({s, prompts[s]});
  for (int r = -1; r < plan.reps; ++r) {  // r = -1: warm-up
    runner.restore_context();
    const auto t0 = Clock::now();
    KILN_TRY_STATUS(runner.append(segments));
    if (r >= 0) f.tok_per_s.push_back(f.n_tokens / seconds(t0));
  }
  return f;
}

// One decode step per token, its logits back on the host each step, the next token not drawn
// from them: llama-bench's generation test (it feeds random tokens), so that the two time the
// same work. (A greedy argmax over a 128k vocabulary on the host adds ~50 us a token: kiln run
// and kiln serve pay it, `kiln bench http` measures it.)
Expected<BenchFigure> gen_test(BatchRunner& runner, const BenchPlan& plan, uint32_t n_vocab) {
  const int32_t p = runner.num_seqs();
  BenchFigure f{bench_test_name(true, plan.n_gen, p, plan.depth), plan.n_gen * p, {}};
  f.gen = true;
  f.n_depth = plan.depth;
  f.n_seqs = p;
  DecodeSteps steps(runner, plan.n_gen, n_vocab);
  for (int r = -1; r < plan.reps; ++r) {
    runner.restore_context();
    const auto t0 = Clock::now();
    for (int32_t i = 0; i < plan.n_gen; ++i) KILN_TRY_STATUS(steps.run(i));
    if (r >= 0) f.tok_per_s.push_back(f.n_tokens / seconds(t0));
  }
  return f;
}

RooflineRow per_step(const backend::OpTime& t, int32_t steps) {
  return {t.label, static_cast<double>(t.calls) / steps, static_cast<double>(t.bytes) / steps,
          t.us / steps};
}

// The profiled eager decode steps after the contexts, and the table's rows from them.
Expected<Roofline> roofline(const model::Model& model, backend::Backend& be, BatchRunner& runner,
                            const BenchPlan& plan, const BenchFigure* tg) {
  Roofline rl;
  rl.n_seqs = runner.num_seqs();
  rl.depth = plan.depth;
  rl.steps = plan.roofline_steps;
  rl.copy_bytes = plan.copy_bytes;
  KILN_TRY(rl.copy_gbs, copy_bandwidth_gbs(be, &rl.copy_bytes));
  const backend::KvSpec spec = model::kv_spec(model.hparams(), plan.kv_type);
  rl.kv_bytes_per_token = static_cast<double>(be.kv_bytes_per_block(spec)) / kv::kBlockTokens;

  runner.restore_context();
  model::Forward& fwd = runner.executor().forward();
  fwd.set_eager(true);
  DecodeSteps steps(runner, kRooflineWarmup + rl.steps, model.hparams().n_vocab);
  Status st;
  for (int32_t i = 0; i < kRooflineWarmup && st.ok(); ++i) st = steps.run(i);
  be.set_profiling(true);
  be.profile_take();  // nothing before the profiled steps
  const auto t0 = Clock::now();
  for (int32_t i = 0; i < rl.steps && st.ok(); ++i) st = steps.run(kRooflineWarmup + i);
  const double wall_us = 1e6 * seconds(t0);
  std::vector<backend::OpTime> ops = be.profile_take();
  be.set_profiling(false);
  fwd.set_eager(false);
  KILN_TRY_STATUS(std::move(st));

  double profiled_us = 0;
  rl.matmuls.label = "matmuls";
  rl.attention.label = "attention";
  for (const backend::OpTime& t : ops) {
    profiled_us += t.us / rl.steps;
    if (t.label == "copy") continue;
    const RooflineRow row = per_step(t, rl.steps);
    if (t.label == "attention") {
      rl.attention = row;
      continue;
    }
    rl.classes.push_back(row);
    rl.matmuls.calls += row.calls;
    rl.matmuls.bytes += row.bytes;
    rl.matmuls.us += row.us;
  }
  std::stable_sort(rl.classes.begin(), rl.classes.end(),
                   [](const RooflineRow& a, const RooflineRow& b) { return a.us > b.us; });
  // The KV each step reads: every sequence's tokens after the step's write, on average over
  // the profiled steps (kv_len from depth + warm-up + 1 to depth + warm-up + steps).
  const double avg_len = plan.depth + kRooflineWarmup + (rl.steps + 1) / 2.0;
  rl.attention.bytes = rl.kv_bytes_per_token * avg_len * rl.n_seqs;
  // Weight bytes per step: the profiled matmuls', else (a backend that cannot profile) the
  // model's count per token.
  const double weight_bytes =
      rl.matmuls.bytes > 0 ? rl.matmuls.bytes : static_cast<double>(model.weight_bytes_per_token());
  rl.eager_step = {"eager step", 1, weight_bytes + rl.attention.bytes, wall_us / rl.steps};
  rl.other = {"other ops", 0, 0, std::max(0.0, rl.eager_step.us - profiled_us)};
  if (tg != nullptr && !tg->tok_per_s.empty()) {
    const double mean = std::accumulate(tg->tok_per_s.begin(), tg->tok_per_s.end(), 0.0) /
                        static_cast<double>(tg->tok_per_s.size());
    const double tg_len = plan.depth + (plan.n_gen + 1) / 2.0;  // the tg steps' average kv_len
    RooflineRow row;
    row.label = be.supports_graphs() && plan.graphs ? "step (graphs)" : "step (tg)";
    row.calls = 1;
    row.bytes = weight_bytes + rl.kv_bytes_per_token * tg_len * rl.n_seqs;
    row.us = mean > 0 ? 1e6 * rl.n_seqs / mean : 0;
    rl.tg_step = row;
  }
  return rl;
}

}  // namespace

std::string bench_test_name(bool gen, int32_t n, int32_t n_seqs, int32_t depth) {
  std::string s = fmt::format("{}{}", gen ? "tg" : "pp", n);
  if (n_seqs > 1) s += fmt::format(" x{}", n_seqs);
  if (depth > 0) s += fmt::format(" @ d{}", depth);
  return s;
}

Expected<double> copy_bandwidth_gbs(backend::Backend& be, uint64_t* bytes) {
  const backend::DeviceMemory mem = be.memory();
  if (mem.free_bytes > 0) *bytes = std::min(*bytes, mem.free_bytes / 8);
  *bytes = *bytes / 256 * 256;
  if (*bytes == 0) return err("copy bandwidth: no device memory free to copy");
  KILN_TRY(std::unique_ptr<backend::Buffer> src, be.alloc(*bytes));
  KILN_TRY(std::unique_ptr<backend::Buffer> dst, be.alloc(*bytes));
  // Fill the source (a fresh page or a lazily mapped one would copy faster, or slower).
  {
    std::vector<uint8_t> ones(std::min<uint64_t>(*bytes, 64 << 20), 1);
    for (uint64_t off = 0; off < *bytes; off += ones.size())
      be.upload(static_cast<uint8_t*>(src->data()) + off, ones.data(),
                std::min<uint64_t>(ones.size(), *bytes - off));
    be.copy(dst->data(), src->data(), *bytes);  // warm-up (dst's pages too)
    be.sync();
  }
  std::vector<double> us;
  for (int i = 0; i < 5; ++i) {
    be.set_profiling(true);
    const auto t0 = Clock::now();
    be.copy(dst->data(), src->data(), *bytes);
    be.sync();
    const double wall_us = 1e6 * seconds(t0);
    const std::vector<backend::OpTime> ops = be.profile_take();
    be.set_profiling(false);
    double t = wall_us;
    for (const backend::OpTime& op : ops)
      if (op.label == "copy" && op.us > 0) t = op.us;
    us.push_back(t);
  }
  std::sort(us.begin(), us.end());
  return 2.0 * static_cast<double>(*bytes) / us[us.size() / 2] / 1e3;
}

Expected<BenchResult> run_bench(const model::Model& model, backend::Backend& be,
                                const BenchPlan& plan) {
  if (plan.n_prompt < 0 || plan.n_gen < 0 || plan.reps < 1 || plan.batch < 1 || plan.depth < 0 ||
      plan.parallel < 1 || plan.roofline_steps < 1)
    return err("bench: bad plan (n_prompt {}, n_gen {}, reps {}, batch {}, depth {}, parallel {})",
               plan.n_prompt, plan.n_gen, plan.reps, plan.batch, plan.depth, plan.parallel);
  if (plan.roofline && plan.n_gen == 0)
    return err("--roofline profiles decode steps and compares them with the tg test: -n > 0");
  const uint32_t n_vocab = model.hparams().n_vocab;
  const int32_t extra = plan.roofline ? kRooflineWarmup + plan.roofline_steps : 0;
  BatchRunnerOptions ro;
  ro.num_seqs = plan.parallel;
  ro.n_ctx = plan.depth + std::max({plan.n_prompt, plan.n_gen, extra}) + 1;
  ro.max_step_tokens = plan.batch;
  ro.kv_type = plan.kv_type;
  ro.graphs = plan.graphs;
  ro.mesh = plan.mesh;
  KILN_TRY(std::unique_ptr<BatchRunner> runner, BatchRunner::create(model, be, ro));
  // Each sequence's context, untimed, in steps of `batch` rows; every repetition starts again
  // from it.
  for (int32_t s = 0; s < plan.parallel && plan.depth > 0; ++s) {
    const std::vector<int32_t> context = bench_tokens(plan.depth, n_vocab, 7 + seq_start(s));
    const BatchRunner::Segment g{s, context};
    KILN_TRY_STATUS(runner->append(std::span<const BatchRunner::Segment>(&g, 1)));
  }
  runner->save_context();

  BenchResult out;
  if (plan.n_prompt > 0) {
    KILN_TRY(BenchFigure f, prompt_test(*runner, plan, n_vocab));
    out.figures.push_back(std::move(f));
  }
  const BenchFigure* tg = nullptr;
  if (plan.n_gen > 0) {
    KILN_TRY(BenchFigure f, gen_test(*runner, plan, n_vocab));
    out.figures.push_back(std::move(f));
    tg = &out.figures.back();
  }
  if (plan.roofline) {
    KILN_TRY(out.roofline, roofline(model, be, *runner, plan, tg));
  }
  return out;
}

}  // namespace kiln::engine
