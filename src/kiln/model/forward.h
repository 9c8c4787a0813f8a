// The transformer forward, written once for the llama family over the CPU reference ops, for
// a flat batch of tokens from many sequences. Activations live in buffers sized at
// construction for the largest step; run() does not allocate.
#pragma once

#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/backend/cpu/ops.h"
#include "kiln/kv/kv_cache.h"
#include "kiln/model/model.h"
#include "kiln/model/rope.h"
#include "kiln/util/thread_pool.h"

namespace kiln::model {

struct StepInput {
  std::span<const int32_t> tokens;      // [n_tokens], flat over sequences
  backend::AttnBatch attn;              // positions and paged-KV metadata of those tokens
  std::span<const int32_t> logit_rows;  // flat rows whose logits are wanted, in output order
};

// Called with each named intermediate: (name, layer or -1, data [rows, cols]).
using ActivationDump = std::function<void(std::string_view name, int layer, const float* data,
                                          int64_t rows, int64_t cols)>;

class Forward {
 public:
  Forward(const Model& model, int32_t max_tokens, util::ThreadPool* pool);

  // Writes logits [logit_rows.size(), n_vocab]. Errors: too many tokens, bad token ids.
  Status run(const StepInput& in, kv::KvCache& cache, float* logits);

  void set_dump(ActivationDump dump) { dump_ = std::move(dump); }
  int32_t max_tokens() const { return max_tokens_; }

 private:
  void attention_block(int layer, const StepInput& in, kv::KvCache& cache, int64_t n);
  void ffn_block(int layer, int64_t n);
  void moe_block(int layer, int64_t n);
  void dump(std::string_view name, int layer, const float* data, int64_t rows, int64_t cols);
  void rope_step(const StepInput& in, int64_t n);

  const Model& model_;
  int32_t max_tokens_;
  util::ThreadPool* pool_;
  ActivationDump dump_;
  // Activation arena, [max_tokens, width] each.
  std::vector<float> x_, xn_, q_, k_, v_, attn_, gate_, up_, tmp_, tmp2_;
  // MoE: router logits [max_tokens, n_expert], rows gathered per expert and their outputs.
  std::vector<float> router_, moe_in_, moe_gate_, moe_up_, moe_out_, moe_slots_;
  // Rope frequencies, computed once: [0] full-attention layers, [1] sliding layers. The step's
  // cos/sin tables ([max_tokens, n_rot / 2] each) are shared by Q, K and every layer.
  RopeFreqs rope_[2];
  bool rope_swa_differs_ = false;
  std::vector<float> rope_cos_[2], rope_sin_[2];
};

}  // namespace kiln::model
