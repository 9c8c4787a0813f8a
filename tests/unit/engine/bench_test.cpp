// kiln bench's measurements on the real stories260K model: sequences decoding together through
// BatchRunner give each the same tokens and logits as running it alone (SequenceRunner), and
// run_bench's --depth / --parallel tests and --roofline table hold together.
#include "kiln/engine/bench.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/engine/batch_runner.h"
#include "kiln/engine/sequence.h"

namespace kiln::engine {
namespace {

const std::string kModels = std::string(KILN_SOURCE_DIR) + "/../shared/models/";

class BenchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = model::Model::load(kModels + "stories260K.gguf");
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
  }
  std::unique_ptr<model::Model> model_;
  util::ThreadPool pool_{2};
  backend::cpu::CpuBackend be_{&pool_};
};

std::vector<int32_t> prompt(int32_t n, int32_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[i] = 3 + (seed * 37 + i * 11) % 500;
  return t;
}

// Three sequences of different context lengths (within a block, across blocks), prefilled
// together in steps of 16 rows that mix them, then decoded greedily one token each per step:
// each gets the tokens and logits it gets alone.
TEST_F(BenchTest, ParallelDecodeMatchesEachSequenceAlone) {
  const std::vector<std::vector<int32_t>> prompts = {prompt(5, 1), prompt(17, 2), prompt(40, 3)};
  const int32_t n_gen = 24, n_ctx = 80;
  const uint32_t n_vocab = model_->hparams().n_vocab;

  std::vector<std::vector<int32_t>> alone_ids(prompts.size());
  std::vector<std::vector<float>> alone_first(prompts.size());  // logits after the prompt
  for (size_t s = 0; s < prompts.size(); ++s) {
    auto r = SequenceRunner::create(*model_, be_, n_ctx, 16);
    ASSERT_TRUE(r.ok()) << r.error().message;
    auto lg = (*r)->append(prompts[s]);
    ASSERT_TRUE(lg.ok()) << lg.error().message;
    alone_first[s].assign(lg->begin(), lg->end());
    int32_t next = static_cast<int32_t>(std::max_element(lg->begin(), lg->end()) - lg->begin());
    for (int32_t i = 0; i < n_gen; ++i) {
      alone_ids[s].push_back(next);
      auto id = (*r)->append_argmax(std::span<const int32_t>(&next, 1));
      ASSERT_TRUE(id.ok()) << id.error().message;
      next = *id;
    }
  }

  BatchRunnerOptions o;
  o.num_seqs = static_cast<int32_t>(prompts.size());
  o.n_ctx = n_ctx;
  o.max_step_tokens = 16;
  auto br = BatchRunner::create(*model_, be_, o);
  ASSERT_TRUE(br.ok()) << br.error().message;
  BatchRunner& runner = **br;
  std::vector<BatchRunner::Segment> segs;
  for (size_t s = 0; s < prompts.size(); ++s) segs.push_back({static_cast<int32_t>(s), prompts[s]});
  auto lg = runner.append(segs);  // 62 tokens: 4 steps, the sequences' pieces mixed
  ASSERT_TRUE(lg.ok()) << lg.error().message;
  ASSERT_EQ(lg->size(), prompts.size() * n_vocab);
  std::vector<int32_t> first(prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s) {
    const std::span<const float> row = lg->subspan(s * n_vocab, n_vocab);
    EXPECT_EQ(std::vector<float>(row.begin(), row.end()), alone_first[s]) << "sequence " << s;
    first[s] = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  }
  runner.save_context();
  // n_gen greedy steps, one token per sequence each.
  auto decode = [&] {
    std::vector<std::vector<int32_t>> together(prompts.size());
    std::vector<int32_t> next = first;
    for (int32_t i = 0; i < n_gen; ++i) {
      for (size_t s = 0; s < prompts.size(); ++s) {
        together[s].push_back(next[s]);
        segs[s] = {static_cast<int32_t>(s), std::span<const int32_t>(&next[s], 1)};
      }
      auto ids = runner.append_argmax(segs);
      EXPECT_TRUE(ids.ok()) << ids.error().message;
      if (!ids.ok()) break;
      next = *ids;
    }
    return together;
  };
  const std::vector<std::vector<int32_t>> together = decode();
  for (size_t s = 0; s < prompts.size(); ++s) {
    EXPECT_EQ(together[s], alone_ids[s]) << "sequence " << s;
    EXPECT_EQ(runner.seq_len(static_cast<int32_t>(s)),
              static_cast<int32_t>(prompts[s].size()) + n_gen);
  }
  // The greedy continuations are not all one token (the comparison means something).
  EXPECT_GT(std::set<int32_t>(alone_ids[2].begin(), alone_ids[2].end()).size(), 1u);

  // restore_context goes back to the prompts; the same steps give the same tokens again.
  runner.restore_context();
  for (size_t s = 0; s < prompts.size(); ++s)
    EXPECT_EQ(runner.seq_len(static_cast<int32_t>(s)), static_cast<int32_t>(prompts[s].size()));
  EXPECT_EQ(decode(), together);
}

TEST_F(BenchTest, BatchRunnerErrors) {
  BatchRunnerOptions o;
  o.num_seqs = 2;
  o.n_ctx = 8;
  auto br = BatchRunner::create(*model_, be_, o);
  ASSERT_TRUE(br.ok()) << br.error().message;
  const std::vector<int32_t> t = prompt(6, 1);
  const BatchRunner::Segment twice[] = {{0, t}, {0, t}};
  EXPECT_FALSE((*br)->append(twice).ok());
  const BatchRunner::Segment outside[] = {{2, t}};
  EXPECT_FALSE((*br)->append(outside).ok());
  const BatchRunner::Segment one[] = {{1, t}};
  ASSERT_TRUE((*br)->append(one).ok());
  auto full = (*br)->append(one);  // 6 + 6 > 8
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.error().message.find("context is full"), std::string::npos);
  EXPECT_EQ((*br)->seq_len(1), 6);
  EXPECT_EQ((*br)->seq_len(0), 0);
}

TEST_F(BenchTest, DepthAndParallelFigures) {
  BenchPlan plan;
  plan.n_prompt = 16;
  plan.n_gen = 8;
  plan.reps = 2;
  plan.batch = 32;
  plan.depth = 40;
  plan.parallel = 2;
  auto r = run_bench(*model_, be_, plan);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->figures.size(), 2u);
  const BenchFigure& pp = r->figures[0];
  const BenchFigure& tg = r->figures[1];
  EXPECT_EQ(pp.test, "pp16 x2 @ d40");
  EXPECT_EQ(tg.test, "tg8 x2 @ d40");
  EXPECT_FALSE(pp.gen);
  EXPECT_TRUE(tg.gen);
  EXPECT_EQ(pp.n_tokens, 32);
  EXPECT_EQ(tg.n_tokens, 16);
  for (const BenchFigure* f : {&pp, &tg}) {
    EXPECT_EQ(f->n_depth, 40);
    EXPECT_EQ(f->n_seqs, 2);
    ASSERT_EQ(f->tok_per_s.size(), 2u);
    for (double t : f->tok_per_s) EXPECT_GT(t, 0);
  }
  EXPECT_FALSE(r->roofline.has_value());

  // Defaults: the names of before --depth and --parallel.
  plan.depth = 0;
  plan.parallel = 1;
  plan.reps = 1;
  auto plain = run_bench(*model_, be_, plan);
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  ASSERT_EQ(plain->figures.size(), 2u);
  EXPECT_EQ(plain->figures[0].test, "pp16");
  EXPECT_EQ(plain->figures[1].test, "tg8");
  EXPECT_EQ(bench_test_name(true, 128, 8, 32768), "tg128 x8 @ d32768");
  EXPECT_EQ(bench_test_name(false, 512, 1, 32768), "pp512 @ d32768");
}

TEST_F(BenchTest, RooflineRowsAddUp) {
  BenchPlan plan;
  plan.n_prompt = 0;
  plan.n_gen = 8;
  plan.reps = 1;
  plan.depth = 64;
  plan.parallel = 2;
  plan.roofline = true;
  plan.roofline_steps = 4;
  plan.copy_bytes = uint64_t{4} << 20;
  auto r = run_bench(*model_, be_, plan);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r->roofline.has_value());
  const Roofline& rl = *r->roofline;
  EXPECT_EQ(rl.n_seqs, 2);
  EXPECT_EQ(rl.depth, 64);
  EXPECT_EQ(rl.steps, 4);
  EXPECT_GT(rl.copy_gbs, 0);
  EXPECT_LE(rl.copy_bytes, plan.copy_bytes);
  // stories260K: the q/k/v and gate/up groups, attn_output, ffn_down, the output.
  ASSERT_EQ(rl.classes.size(), 5u);
  double bytes = 0, us = 0, calls = 0;
  for (size_t i = 0; i < rl.classes.size(); ++i) {
    const RooflineRow& c = rl.classes[i];
    EXPECT_GT(c.us, 0) << c.label;
    EXPECT_GT(c.bytes, 0) << c.label;
    if (i > 0) {
      EXPECT_LE(c.us, rl.classes[i - 1].us) << "sorted by time";
    }
    bytes += c.bytes;
    us += c.us;
    calls += c.calls;
  }
  EXPECT_DOUBLE_EQ(rl.matmuls.bytes, bytes);
  EXPECT_DOUBLE_EQ(rl.matmuls.us, us);
  EXPECT_DOUBLE_EQ(calls, 4 * 5 + 1);  // per step: 4 classes per layer x 5 layers, the output
  // Every matmul weight once per step (the two sequences share the read).
  uint64_t weights = 0;
  for (const gguf::TensorInfo& t : model_->file().tensors())
    if (t.ne.size() >= 2 && t.name != "token_embd.weight") weights += t.size_bytes;
  EXPECT_DOUBLE_EQ(rl.matmuls.bytes, static_cast<double>(weights));
  // KV: 5 layers x K and V x 4 heads x 8 dims x 2 bytes (f16) a token, for two sequences of
  // 64 + 2 (warm-up) + 1..4 tokens.
  EXPECT_DOUBLE_EQ(rl.kv_bytes_per_token, 5.0 * 2 * 4 * 8 * 2);
  EXPECT_DOUBLE_EQ(rl.attention.bytes, rl.kv_bytes_per_token * (64 + 2 + 2.5) * 2);
  EXPECT_DOUBLE_EQ(rl.attention.calls, 5);
  EXPECT_GT(rl.attention.us, 0);
  EXPECT_GT(rl.eager_step.us, 0);
  EXPECT_NEAR(rl.eager_step.us, rl.matmuls.us + rl.attention.us + rl.other.us, 1e-6);
  EXPECT_DOUBLE_EQ(rl.eager_step.bytes, rl.matmuls.bytes + rl.attention.bytes);
  ASSERT_TRUE(rl.tg_step.has_value());
  EXPECT_EQ(rl.tg_step->label, "step (tg)");  // the CPU has no graphs
  const BenchFigure& tg = r->figures.at(0);
  EXPECT_NEAR(rl.tg_step->us, 1e6 * 2 / tg.tok_per_s[0], 1e-6 * rl.tg_step->us);
  EXPECT_GT(rl.percent_of_copy(rl.eager_step), 0);

  plan.n_gen = 0;  // nothing to compare the profiled steps with
  EXPECT_FALSE(run_bench(*model_, be_, plan).ok());
}

TEST_F(BenchTest, CopyBandwidthIsPositive) {
  uint64_t bytes = uint64_t{8} << 20;
  auto gbs = copy_bandwidth_gbs(be_, &bytes);
  ASSERT_TRUE(gbs.ok()) << gbs.error().message;
  EXPECT_GT(*gbs, 0);
  EXPECT_EQ(bytes, uint64_t{8} << 20);
}

}  // namespace
}  // namespace kiln::engine
