// Embed requests through the engine loop on the real stories260K model: each input its own
// sequence, batched and chunk-prefilled with everything else, pooled (mean, cls, last) from
// the final-norm hidden states. The reference is one unchunked forward of the whole sequence
// asking for every row's hidden state (Forward's hidden_rows).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "kiln/engine/engine.h"
#include "kiln/model/forward.h"
#include "kiln/model/model.h"
#include "unit/engine/fixture_engine.h"
#include "unit/model/forward_util.h"

namespace kiln::engine {
namespace {

const std::string kModel = std::string(KILN_SOURCE_DIR) + "/../shared/models/stories260K.gguf";

FinishEvent drain(const std::shared_ptr<RequestChannel>& ch) {
  for (;;) {
    auto e = ch->pop(std::chrono::milliseconds(30000));
    if (!e) {
      ADD_FAILURE() << "timed out waiting for an event";
      return {};
    }
    if (auto* f = std::get_if<FinishEvent>(&*e)) return *f;
  }
}

std::shared_ptr<RequestChannel> submit_ok(Engine& e, GenerationRequest req) {
  auto res = e.submit(std::move(req));
  if (auto* refusal = std::get_if<SubmitRefusal>(&res)) {
    ADD_FAILURE() << refusal->message;
    return nullptr;
  }
  return std::get<std::shared_ptr<RequestChannel>>(res);
}

GenerationRequest embed(std::vector<int32_t> prompt) {
  GenerationRequest r;
  r.prompt_tokens = std::move(prompt);
  r.embed = true;
  return r;
}

GenerationRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.prompt_tokens = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

std::vector<int32_t> tokens(int32_t n, int32_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint32_t x = static_cast<uint32_t>(seed) * 2654435761u + 1;
  t[0] = 1;  // BOS
  for (int32_t i = 1; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    t[i] = 3 + static_cast<int32_t>((x >> 8) % 500);
  }
  return t;
}

std::vector<float> reference_pool(const model::Model& m, const std::vector<int32_t>& seq,
                                  model::Pooling p) {
  const std::vector<float> rows = model::hidden_rows_of(m, seq);
  const size_t w = m.hparams().n_embd, n = seq.size();
  std::vector<float> out(w, 0.0f);
  for (size_t k = 0; k < w; ++k) {
    if (p == model::Pooling::kCls) out[k] = rows[k];
    if (p == model::Pooling::kLast) out[k] = rows[(n - 1) * w + k];
    if (p == model::Pooling::kMean) {
      double s = 0;
      for (size_t r = 0; r < n; ++r) s += rows[r * w + k];
      out[k] = static_cast<float>(s / static_cast<double>(n));
    }
  }
  return out;
}

// max |got - want| <= 1e-4 * max |want|: chunked prefill and batching change only the order
// of fp32 sums (F32 KV on both sides).
void expect_near(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
    max_ref = std::max(max_ref, std::fabs(want[i]));
  }
  EXPECT_GT(max_ref, 0.0f) << what;
  EXPECT_LE(max_diff, 1e-4f * max_ref) << what;
}

std::unique_ptr<Engine> start_engine(std::optional<model::Pooling> pooling, int32_t n_ctx = 256) {
  EngineOptions o;
  o.model_path = kModel;
  o.device = model::test_device();
  o.threads = 2;
  o.n_ctx = n_ctx;
  o.max_seqs = 8;
  o.max_batch_tokens = 64;  // a 150-token input prefills in three chunks
  o.kv_type = quant::Type::F32;
  // An explicit KV budget: on a GPU the default fills --gpu-memory-fraction of the card, and
  // a test may hold two engines at once.
  o.kv_memory_bytes = uint64_t{64} << 20;
  o.pooling = pooling;
  return started_engine(o);
}

class EmbeddingEngineTest : public ::testing::TestWithParam<model::Pooling> {};

TEST_P(EmbeddingEngineTest, PooledHiddenStatesMatchOneUnchunkedForward) {
  const model::Pooling pooling = GetParam();
  auto e = start_engine(pooling);
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->pooling(), pooling);
  ASSERT_EQ(e->embedding_width(), static_cast<int32_t>(e->model().hparams().n_embd));
  const std::vector<std::vector<int32_t>> inputs = {tokens(150, 1), tokens(40, 2), tokens(1, 3),
                                                    tokens(17, 4)};
  // Generation alone, then again beside the embeddings: the same tokens.
  std::vector<int32_t> alone;
  {
    auto ch = submit_ok(*e, greedy(tokens(30, 9), 12));
    for (;;) {
      auto ev = ch->pop(std::chrono::milliseconds(30000));
      ASSERT_TRUE(ev);
      if (auto* t = std::get_if<TokenEvent>(&*ev)) alone.push_back(t->token);
      if (std::holds_alternative<FinishEvent>(*ev)) break;
    }
  }
  auto gen = submit_ok(*e, greedy(tokens(30, 9), 12));
  std::vector<std::shared_ptr<RequestChannel>> chans;
  for (const auto& in : inputs) chans.push_back(submit_ok(*e, embed(in)));
  std::vector<int32_t> beside;
  for (;;) {
    auto ev = gen->pop(std::chrono::milliseconds(30000));
    ASSERT_TRUE(ev);
    if (auto* t = std::get_if<TokenEvent>(&*ev)) beside.push_back(t->token);
    if (std::holds_alternative<FinishEvent>(*ev)) break;
  }
  EXPECT_EQ(beside, alone);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const FinishEvent f = drain(chans[i]);
    EXPECT_EQ(f.reason, FinishReason::kStop) << f.error;
    EXPECT_EQ(f.usage.prompt_tokens, static_cast<int32_t>(inputs[i].size()));
    EXPECT_EQ(f.usage.completion_tokens, 0);
    expect_near(f.embedding, reference_pool(e->model(), inputs[i], pooling),
                std::string(model::pooling_name(pooling)) + " input " + std::to_string(i));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(e->stats().num_kv_blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Poolings, EmbeddingEngineTest,
                         ::testing::Values(model::Pooling::kMean, model::Pooling::kCls,
                                           model::Pooling::kLast),
                         [](const auto& info) { return std::string(pooling_name(info.param)); });

// A generation leaves the prompt's blocks in the prefix cache. Mean pooling needs every row,
// so it computes the whole input anyway; last pooling reuses the cached prefix. Both equal the
// reference.
TEST(EmbeddingEngine, PrefixCacheOnlyWhereThePoolingAllows) {
  const std::vector<int32_t> prompt = tokens(100, 5);
  for (model::Pooling p : {model::Pooling::kMean, model::Pooling::kLast}) {
    auto e = start_engine(p);
    ASSERT_NE(e, nullptr);
    drain(submit_ok(*e, greedy(prompt, 2)));
    const int64_t hits_before = e->stats().num_prefix_hit_tokens;
    const FinishEvent f = drain(submit_ok(*e, embed(prompt)));
    ASSERT_EQ(f.reason, FinishReason::kStop) << f.error;
    expect_near(f.embedding, reference_pool(e->model(), prompt, p),
                std::string(model::pooling_name(p)));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (p == model::Pooling::kLast) {
      EXPECT_EQ(f.usage.cached_tokens, 96);
    } else {
      EXPECT_EQ(f.usage.cached_tokens, 0);
    }
    (void)hits_before;
  }
}

TEST(EmbeddingEngine, RefusalsAndTheWholeContext) {
  auto none = start_engine(std::nullopt);  // stories260K has no pooling_type
  ASSERT_NE(none, nullptr);
  EXPECT_EQ(none->pooling(), model::Pooling::kNone);
  auto r = none->submit(embed({1, 2, 3}));
  ASSERT_TRUE(std::holds_alternative<SubmitRefusal>(r));
  EXPECT_EQ(std::get<SubmitRefusal>(r).error, SubmitError::kInvalid);
  EXPECT_NE(std::get<SubmitRefusal>(r).message.find("--pooling"), std::string::npos);

  auto e = start_engine(model::Pooling::kMean, 64);
  ASSERT_NE(e, nullptr);
  auto too_long = e->submit(embed(tokens(65, 1)));
  ASSERT_TRUE(std::holds_alternative<SubmitRefusal>(too_long));
  EXPECT_EQ(std::get<SubmitRefusal>(too_long).error, SubmitError::kContextLengthExceeded);
  auto bad = e->submit(embed({1, 99999}));
  ASSERT_TRUE(std::holds_alternative<SubmitRefusal>(bad));
  EXPECT_EQ(std::get<SubmitRefusal>(bad).error, SubmitError::kInvalid);
  // Exactly the context: accepted (nothing is generated).
  const FinishEvent f = drain(submit_ok(*e, embed(tokens(64, 1))));
  EXPECT_EQ(f.reason, FinishReason::kStop) << f.error;
  EXPECT_EQ(f.embedding.size(), e->model().hparams().n_embd);
}

std::unique_ptr<Engine> start_embedding_engine(const std::string& fixture, int32_t max_batch_tokens,
                                               int32_t n_ctx = 64) {
  EngineOptions o;
  o.device = model::test_device();
  o.threads = 2;
  o.n_ctx = n_ctx;
  o.max_batch_tokens = max_batch_tokens;
  o.kv_type = quant::Type::F32;
  o.kv_memory_bytes = uint64_t{64} << 20;
  return start_fixture_engine(fixture, o);
}

// Every golden sequence submitted at once; each finished embedding, L2-normalized, equal to
// the goldens' `mode` within 1e-4.
void expect_engine_goldens(Engine& e, const nlohmann::json& g, const char* mode) {
  std::vector<std::shared_ptr<RequestChannel>> chans;
  for (const auto& s : g["sequences"]) chans.push_back(submit_ok(e, embed(s)));
  for (size_t i = 0; i < chans.size(); ++i) {
    FinishEvent f = drain(chans[i]);
    ASSERT_EQ(f.reason, FinishReason::kStop) << f.error;
    model::l2_normalize(f.embedding);
    const std::vector<float> want = g["normalized"][mode][i];
    ASSERT_EQ(f.embedding.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k)
      ASSERT_NEAR(f.embedding[k], want[k], 1e-4f) << mode << " seq " << i << " dim " << k;
  }
}

nlohmann::json read_goldens(const std::string& fixture) {
  std::ifstream gf(fixture + "/goldens.json");
  EXPECT_TRUE(gf) << "fixture missing: run tools/record_embedding_goldens.py";
  return gf ? nlohmann::json::parse(gf) : nlohmann::json::object();
}

// The sentence-transformers goldens of tests/fixtures/hf/qwen3_embed (see
// tests/unit/model/embedding_goldens_test.cpp) through the whole engine: the converted file's
// pooling_type (last) chosen with no override, the inputs batched together, L2-normalized.
TEST(EmbeddingEngine, Qwen3EmbeddingGoldensThroughTheEngine) {
  const std::string fixture = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/qwen3_embed";
  const nlohmann::json g = read_goldens(fixture);
  auto e = start_embedding_engine(fixture, 16);  // the 19- and 40-token inputs prefill in chunks
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->pooling(), model::Pooling::kLast);
  expect_engine_goldens(*e, g, "lasttoken");
}

// The BertModel goldens (CLS pooling, the fixture's) through the engine: an encoder's input is
// never split, so with 64 tokens a step the four inputs (1 + 7 + 19 + 40 tokens) take two
// steps, the 40-token one waiting whole. A generation request and an input longer than a step
// are refused.
TEST(EmbeddingEngine, BertGoldensThroughTheEngine) {
  const std::string fixture = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/bert_embed";
  const nlohmann::json g = read_goldens(fixture);
  auto e = start_embedding_engine(fixture, 64, /*n_ctx=*/128);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->pooling(), model::Pooling::kCls);
  expect_engine_goldens(*e, g, "cls");
  GenerationRequest gen;
  gen.prompt_tokens = {5, 6, 7};
  gen.max_tokens = 4;
  auto r = e->submit(gen);
  ASSERT_TRUE(std::holds_alternative<SubmitRefusal>(r));
  EXPECT_NE(std::get<SubmitRefusal>(r).message.find("encoder"), std::string::npos);
  auto too_long = e->submit(embed(std::vector<int32_t>(65, 7)));
  ASSERT_TRUE(std::holds_alternative<SubmitRefusal>(too_long));
  EXPECT_EQ(std::get<SubmitRefusal>(too_long).error, SubmitError::kContextLengthExceeded);
  EXPECT_NE(std::get<SubmitRefusal>(too_long).message.find("one step"), std::string::npos);
}

// The NomicBertModel goldens (mean pooling, the fixture's) through the engine: rotary
// positions from each sequence's own 0, the four inputs in two steps of at most 64 tokens.
TEST(EmbeddingEngine, NomicGoldensThroughTheEngine) {
  const std::string fixture = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/nomic_embed";
  const nlohmann::json g = read_goldens(fixture);
  auto e = start_embedding_engine(fixture, 64, /*n_ctx=*/128);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->pooling(), model::Pooling::kMean);
  expect_engine_goldens(*e, g, "mean");
}

TEST(EmbeddingEngine, RankPoolingIsRefusedAtStart) {
  EngineOptions o;
  o.model_path = kModel;
  o.pooling = model::Pooling::kRank;
  Engine e(o);
  e.start();
  Status st = e.wait_ready();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("rank"), std::string::npos);
}

}  // namespace
}  // namespace kiln::engine
