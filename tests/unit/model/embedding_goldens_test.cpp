// Oracle: sentence-transformers embeddings (last-token and mean pooling of the final hidden
// states, L2-normalized; computed in torch exactly as sentence-transformers' Pooling and
// Normalize modules do) of a small random Qwen3Model checkpoint, recorded on the GPU machine
// by tools/record_embedding_goldens.py into tests/fixtures/hf/qwen3_embed. The checkpoint is
// the base model as embedding repositories ship it (no lm_head, no "model." prefix) with a
// sentence-transformers modules.json, and goes through kiln's converter, which must find the
// pooling type there.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "forward_util.h"
#include "kiln/model/forward.h"
#include "kiln/model/model.h"
#include "kiln/model/pooling.h"

namespace kiln::model {
namespace {

const std::string kFixture = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/qwen3_embed";
const std::string kBertFixture = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/bert_embed";
const std::string kNomicFixture = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/nomic_embed";

// Each sequence's rows pooled as `mode` ("mean", "cls", "lasttoken") against the goldens:
// the pooled vector within 1e-4 of its largest value, the normalized one within 1e-4.
void expect_pooled_goldens(const Model& model, const nlohmann::json& g, const char* mode,
                           Pooling p) {
  const size_t width = model.hparams().n_embd;
  const auto& seqs = g["sequences"];
  for (size_t i = 0; i < seqs.size(); ++i) {
    const std::vector<int32_t> seq = seqs[i];
    const std::vector<float> rows = hidden_rows_of(model, seq);
    ASSERT_EQ(rows.size(), seq.size() * width);
    PoolAccumulator acc(p, static_cast<int64_t>(width));
    std::vector<int32_t> wanted;
    PoolAccumulator::wanted_rows(p, 0, static_cast<int32_t>(seq.size()),
                                 static_cast<int32_t>(seq.size()), 0, &wanted);
    for (int32_t r : wanted) acc.add(std::span<const float>(rows).subspan(r * width, width));
    std::vector<float> pooled = acc.result();
    const std::vector<float> want_pooled = g["pooled"][mode][i];
    const std::vector<float> want_norm = g["normalized"][mode][i];
    float max_ref = 0, max_diff = 0;
    for (size_t k = 0; k < width; ++k) {
      max_ref = std::max(max_ref, std::fabs(want_pooled[k]));
      max_diff = std::max(max_diff, std::fabs(pooled[k] - want_pooled[k]));
    }
    EXPECT_LE(max_diff, 1e-4f * max_ref) << mode << " seq " << i;
    l2_normalize(pooled);
    for (size_t k = 0; k < width; ++k)
      ASSERT_NEAR(pooled[k], want_norm[k], 1e-4f) << mode << " seq " << i << " dim " << k;
  }
}

// A fixture's goldens and its checkpoint converted to F32 and loaded (null model: a failure
// has been reported).
struct Fixture {
  nlohmann::json goldens;
  Loaded loaded;
};

Fixture load_fixture(const std::string& dir) {
  std::ifstream gf(dir + "/goldens.json");
  if (!gf) {
    ADD_FAILURE() << "fixture missing: run tools/record_embedding_goldens.py";
    return {};
  }
  Fixture f{nlohmann::json::parse(gf), convert_and_load(dir, "f32")};
  if (f.loaded.model != nullptr) {
    EXPECT_EQ(f.loaded.model->hparams().n_embd, f.goldens["hidden"].get<uint32_t>());
  }
  return f;
}

TEST(EmbeddingGoldens, Qwen3LastTokenAndMeanMatchSentenceTransformers) {
  const Fixture f = load_fixture(kFixture);
  ASSERT_NE(f.loaded.model, nullptr);
  const Model& model = *f.loaded.model;
  EXPECT_EQ(model.hparams().arch, "qwen3");
  EXPECT_EQ(model.hparams().pooling, Pooling::kLast);  // from 1_Pooling/config.json
  EXPECT_TRUE(model.hparams().tied_embeddings);
  expect_pooled_goldens(model, f.goldens, "lasttoken", Pooling::kLast);
  expect_pooled_goldens(model, f.goldens, "mean", Pooling::kMean);
}

// A BertModel (post-norm encoder: positions and token types, LayerNorm with bias, exact GELU,
// non-causal attention) converted by kiln, its mean and CLS pooling against
// sentence-transformers'.
TEST(EmbeddingGoldens, BertMeanAndClsMatchSentenceTransformers) {
  const Fixture f = load_fixture(kBertFixture);
  ASSERT_NE(f.loaded.model, nullptr);
  const Model& model = *f.loaded.model;
  EXPECT_EQ(model.hparams().arch, "bert");
  EXPECT_EQ(model.hparams().pooling, Pooling::kCls);  // from 1_Pooling/config.json
  expect_pooled_goldens(model, f.goldens, "mean", Pooling::kMean);
  expect_pooled_goldens(model, f.goldens, "cls", Pooling::kCls);
}

// A NomicBertModel (nomic-embed-text-v1.5's switches: rotary positions over the whole head,
// fused q/k/v, SwiGLU, no projection biases, post-norm LayerNorm, non-causal), its remote
// code run through transformers' trust_remote_code, converted by kiln: mean pooling (the
// shipped one, from 1_Pooling/config.json) and CLS against sentence-transformers'.
TEST(EmbeddingGoldens, NomicMeanMatchesSentenceTransformers) {
  const Fixture f = load_fixture(kNomicFixture);
  ASSERT_NE(f.loaded.model, nullptr);
  const Model& model = *f.loaded.model;
  EXPECT_EQ(model.hparams().arch, "nomic-bert");
  EXPECT_EQ(model.hparams().pooling, Pooling::kMean);
  EXPECT_EQ(model.hparams().n_rot, model.hparams().head_dim_k);  // rotary over the whole head
  expect_pooled_goldens(model, f.goldens, "mean", Pooling::kMean);
  expect_pooled_goldens(model, f.goldens, "cls", Pooling::kCls);
}

// One step of two sequences: A asks for the logits of its last row, B for the hidden states
// of all its rows. A's logits are those of a step without hidden rows, B's hidden states those
// of B alone (the hidden rows ride beside the logit rows through the same final norm).
TEST(ForwardHiddenRows, BesideLogitRowsInOneStep) {
  const Loaded l = convert_and_load(kFixture, "f32");
  ASSERT_NE(l.model, nullptr);
  const Model& model = *l.model;
  const size_t width = model.hparams().n_embd, n_vocab = model.hparams().n_vocab;
  const std::vector<int32_t> a = {5, 9, 13, 200, 7, 3, 44}, b = {8, 100, 31, 17, 250};
  auto be = test_backend();
  ForwardOptions o;
  o.max_tokens = 16;
  o.max_hidden_rows = 16;
  o.max_context = 16;
  auto f = Forward::create(model, *be, o);
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto kv = be->create_kv(kv_spec(model.hparams(), quant::Type::F32), 2);
  ASSERT_TRUE(kv.ok());
  std::vector<int32_t> toks = a, positions;
  toks.insert(toks.end(), b.begin(), b.end());
  for (size_t i = 0; i < a.size(); ++i) positions.push_back(static_cast<int32_t>(i));
  for (size_t i = 0; i < b.size(); ++i) positions.push_back(static_cast<int32_t>(i));
  const int32_t na = static_cast<int32_t>(a.size()), nb = static_cast<int32_t>(b.size());
  const int32_t qo[3] = {0, na, na + nb}, kv_ptr[3] = {0, 1, 2}, kv_idx[2] = {0, 1};
  const int32_t kv_len[2] = {na, nb};
  const int32_t logit_row[1] = {na - 1};
  std::vector<int32_t> b_rows;
  for (int32_t i = 0; i < nb; ++i) b_rows.push_back(na + i);
  StepInput in;
  in.tokens = toks;
  in.attn = {2, qo, kv_ptr, kv_idx, kv_len, positions.data()};
  in.logit_rows = logit_row;
  std::vector<float> logits_alone(n_vocab), logits(n_vocab), hidden(b.size() * width);
  ASSERT_TRUE((*f)->run(in, **kv, logits_alone.data()).ok());
  in.hidden_rows = b_rows;
  ASSERT_TRUE((*f)->run(in, **kv, logits.data(), hidden.data()).ok());
  EXPECT_EQ(logits, logits_alone);
  const std::vector<float> b_alone = hidden_rows_of(model, b);
  ASSERT_EQ(b_alone.size(), hidden.size());
  for (size_t i = 0; i < hidden.size(); ++i) ASSERT_NEAR(hidden[i], b_alone[i], 1e-5f) << i;
  // Asking for hidden rows without room for them is an error, not a write past the buffer.
  in.hidden_rows = b_rows;
  EXPECT_FALSE((*f)->run(in, **kv, logits.data(), nullptr).ok());
}

}  // namespace
}  // namespace kiln::model
