// The first real-model oracle: stories260K (Llama-2 architecture, F32, trained) must continue
// "Once upon a time" greedily with exactly the ids llama.cpp produces.
#include <gtest/gtest.h>

#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "forward_util.h"
#include "kiln/backend/cpu/ops.h"
#include "kiln/model/forward.h"
#include "kiln/model/model.h"

namespace kiln::model {
namespace {

const std::string kModels = std::string(KILN_SOURCE_DIR) + "/../shared/models/";

// Greedy decoding of one sequence, prompt prefilled in one step, then one token per step.
std::vector<int32_t> greedy(const Model& m, const std::vector<int32_t>& prompt, int n_gen,
                            util::ThreadPool* pool) {
  const HParams& hp = m.hparams();
  const int32_t max_len = static_cast<int32_t>(prompt.size()) + n_gen;
  const int32_t n_blocks = (max_len + kv::kBlockTokens - 1) / kv::kBlockTokens;
  TestForward tf =
      make_forward(m, static_cast<int32_t>(prompt.size()), n_blocks, quant::Type::F16, pool);
  EXPECT_TRUE(tf.ok());
  if (!tf.ok()) return {};
  Forward& fwd = *tf.fwd;
  backend::KvCache* cache = tf.kv.get();
  std::vector<int32_t> blocks(static_cast<size_t>(n_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::vector<float> logits(hp.n_vocab);

  std::vector<int32_t> tokens = prompt, out;
  int32_t done = 0;  // tokens already in the cache
  while (static_cast<int>(out.size()) < n_gen) {
    std::vector<int32_t> step(tokens.begin() + done, tokens.end());
    std::vector<int32_t> positions(step.size());
    std::iota(positions.begin(), positions.end(), done);
    const int32_t qo[2] = {0, static_cast<int32_t>(step.size())};
    const int32_t kv_ptr[2] = {0, n_blocks};
    const int32_t kv_len[1] = {static_cast<int32_t>(tokens.size())};
    const int32_t last[1] = {static_cast<int32_t>(step.size()) - 1};
    StepInput in;
    in.tokens = step;
    in.attn = {1, qo, kv_ptr, blocks.data(), kv_len, positions.data()};
    in.logit_rows = last;
    Status st = fwd.run(in, *cache, logits.data());
    EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
    done = static_cast<int32_t>(tokens.size());
    const int32_t next = backend::cpu::argmax(logits.data(), hp.n_vocab);
    out.push_back(next);
    tokens.push_back(next);
  }
  return out;
}

TEST(Stories260K, GreedyMatchesLlamaCpp) {
  std::ifstream f(kModels + "stories260K.greedy64.nodellamacpp.json");
  ASSERT_TRUE(f) << "missing ../shared/models (CI lays shared/ beside the checkout)";
  const nlohmann::json golden = nlohmann::json::parse(f);
  auto model = Model::load(kModels + "stories260K.gguf");
  ASSERT_TRUE(model.ok()) << model.error().message;
  const std::vector<int32_t> prompt = golden["prompt_ids"];
  const std::vector<int32_t> want = golden["greedy_ids"];
  util::ThreadPool pool(2);
  EXPECT_EQ(greedy(**model, prompt, static_cast<int>(want.size()), &pool), want);
  // Thread count does not change the result (fixed reduction order).
  EXPECT_EQ(greedy(**model, prompt, 16, nullptr),
            std::vector<int32_t>(want.begin(), want.begin() + 16));
}

}  // namespace
}  // namespace kiln::model
