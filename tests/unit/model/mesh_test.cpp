// check_mesh and pipeline_stages on the shapes of real models: which meshes divide them, and
// the error naming the dimension that does not.
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/model/mesh.h"

namespace kiln::model {
namespace {

HParams llama3_8b() {
  HParams hp;
  hp.arch = "llama";
  hp.n_layer = 32;
  hp.n_head = 32;
  hp.n_head_kv = 8;
  hp.n_embd = 4096;
  hp.n_ff = 14336;
  return hp;
}

HParams qwen3_30b_a3b() {
  HParams hp;
  hp.arch = "qwen3moe";
  hp.n_layer = 48;
  hp.n_head = 32;
  hp.n_head_kv = 4;
  hp.n_embd = 2048;
  hp.n_expert = 128;
  hp.n_expert_used = 8;
  hp.n_ff_expert = 768;
  return hp;
}

std::string error_of(const HParams& hp, MeshShape m) {
  const Status st = check_mesh(hp, m);
  return st.ok() ? std::string() : st.error().message;
}

TEST(Mesh, DenseModelSplitsItsHeadsAndWidth) {
  const HParams hp = llama3_8b();
  for (int tp : {1, 2, 4, 8, 16, 32}) EXPECT_EQ(error_of(hp, {tp, 1, false}), "") << "tp " << tp;
  // 16 and 32 ranks: the 8 KV heads each replicated on 2 or 4 ranks.
  EXPECT_EQ(error_of(hp, {3, 1, false}), "--tp 3 does not divide the model's attention heads (32)");
  EXPECT_EQ(error_of(hp, {64, 1, false}),
            "--tp 64 does not divide the model's attention heads (32)");
  HParams odd = hp;
  odd.n_head = 24;
  odd.n_head_kv = 6;
  EXPECT_NE(error_of(odd, {4, 1, false}).find("--tp 4 and the model's 6 KV heads"),
            std::string::npos);
  odd.n_head_kv = 8;
  odd.n_ff = 14300;
  EXPECT_EQ(error_of(odd, {8, 1, false}),
            "--tp 8 does not divide the model's feed-forward width (14300)");
  EXPECT_EQ(error_of(hp, {2, 1, true}), "--ep needs a mixture-of-experts model");
  EXPECT_EQ(error_of(hp, {0, 1, false}),
            "the mesh needs --tp >= 1 and --pp >= 1 (got --tp 0 --pp 1)");
}

TEST(Mesh, MixtureOfExpertsSplitsEachExpertOrDistributesThem) {
  HParams hp = qwen3_30b_a3b();
  EXPECT_EQ(error_of(hp, {8, 1, false}), "");  // 768 / 8 per expert
  EXPECT_EQ(error_of(hp, {8, 1, true}), "");   // 16 experts a rank
  hp.n_expert = 60;
  EXPECT_EQ(error_of(hp, {8, 1, true}), "--tp 8 does not divide the model's experts (--ep) (60)");
  EXPECT_EQ(error_of(hp, {4, 1, true}), "");
  hp.n_ff_expert = 1000;
  EXPECT_EQ(error_of(hp, {16, 1, false}),
            "--tp 16 does not divide the model's expert feed-forward width (1000)");
}

TEST(Mesh, HybridLinearAttentionHeads) {
  HParams hp;  // a Qwen3.5-9B-like shape: 16 key heads, 32 value heads
  hp.n_layer = 32;
  hp.n_head = 16;
  hp.n_head_kv = 4;
  hp.n_ff = 12288;
  hp.linear_n_k_heads = 16;
  hp.linear_n_v_heads = 32;
  hp.full_attn_interval = 4;
  EXPECT_EQ(error_of(hp, {4, 1, false}), "");
  hp.linear_n_k_heads = 12;
  EXPECT_EQ(error_of(hp, {8, 1, false}),
            "--tp 8 does not divide the model's linear-attention key heads (12)");
}

TEST(Mesh, PipelineStagesCoverTheMainLayersInOrder) {
  HParams hp = llama3_8b();
  using Stages = std::vector<std::pair<uint32_t, uint32_t>>;
  EXPECT_EQ(pipeline_stages(hp, 1), (Stages{{0, 32}}));
  EXPECT_EQ(pipeline_stages(hp, 4), (Stages{{0, 8}, {8, 16}, {16, 24}, {24, 32}}));
  EXPECT_EQ(pipeline_stages(hp, 5), (Stages{{0, 7}, {7, 14}, {14, 20}, {20, 26}, {26, 32}}));
  EXPECT_EQ(error_of(hp, {1, 32, false}), "");
  EXPECT_EQ(error_of(hp, {1, 33, false}),
            "--pp 33 stages need at least one layer each; the model has 32");
  hp.n_layer = 33;  // one multi-token-prediction block after 32 main layers: not a stage's
  hp.n_nextn_layers = 1;
  EXPECT_EQ(pipeline_stages(hp, 2), (Stages{{0, 16}, {16, 32}}));
}

}  // namespace
}  // namespace kiln::model
