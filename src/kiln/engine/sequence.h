// One sequence on one model, for the single-stream commands (kiln run, kiln bench,
// kiln perplexity): its KV blocks and tokens, prefill in chunks, one-token decode steps, run
// through the same Executor (forward, KV storage, backend) as the engine loop, which batches
// many sequences; this is the simple case of it.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/engine/executor.h"
#include "kiln/model/model.h"
#include "kiln/tokenizer/tokenizer.h"
#include "kiln/util/status.h"

namespace kiln::engine {

class SequenceRunner {
 public:
  // n_ctx: the most tokens the sequence may hold (0: the model's training context).
  // max_step_tokens: prefill chunk size (also the activation arena's size).
  // all_logits: every row's logits can be kept (set_keep_all_logits; perplexity).
  static Expected<std::unique_ptr<SequenceRunner>> create(const model::Model& model,
                                                          backend::Backend& be, int32_t n_ctx,
                                                          int32_t max_step_tokens = 512,
                                                          quant::Type kv_type = quant::Type::F16,
                                                          bool all_logits = false,
                                                          const model::MeshShape& mesh = {});

  // Runs `tokens` after those already held; returns the logits [n_vocab] after the last one.
  // Errors: the context would overflow, a token id out of range.
  Expected<std::span<const float>> append(std::span<const int32_t> tokens);
  // append for a plain greedy choice (is_plain_greedy): the id of the largest logit after
  // the last token (the first on ties), the logits left on the device.
  Expected<int32_t> append_argmax(std::span<const int32_t> tokens);
  // Forgets tokens from position n on (their KV is overwritten by later appends).
  void truncate(int32_t n);

  const std::vector<int32_t>& tokens() const { return tokens_; }
  int32_t n_ctx() const { return n_ctx_; }
  // All rows' logits of the last append ([n, n_vocab]) are kept when keep_all_logits is set
  // (perplexity needs them); otherwise only the last row is computed.
  void set_keep_all_logits(bool keep) { keep_all_logits_ = keep; }
  const std::vector<float>& all_logits() const { return logits_; }
  // Forwards every named intermediate of the following appends to `dump` (kiln run
  // --dump-activations); an empty function stops it.
  void set_dump(model::ActivationDump dump) { exec_->forward().set_dump(std::move(dump)); }
  const MemoryPlan& plan() const { return exec_->plan(); }
  const model::Forward& forward() const { return exec_->forward(); }

 private:
  SequenceRunner(const model::Model& model, int32_t n_ctx, std::unique_ptr<Executor> exec);
  // The steps of append; with argmax, the last step's argmax id to *argmax and no logits kept.
  Status run_steps(std::span<const int32_t> tokens, int32_t* argmax);

  const model::Model& model_;
  int32_t n_ctx_;
  std::unique_ptr<Executor> exec_;
  std::vector<int32_t> blocks_;  // the sequence's block table: all blocks, in order
  std::vector<int32_t> tokens_;
  std::vector<float> logits_;
  bool keep_all_logits_ = false;
};

// The ids that end generation: EOS, EOT, EOM, and control tokens that chat templates use to
// end a turn (<|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>, ...), as llama.cpp
// collects them.
std::vector<int32_t> end_of_generation_ids(const tokenizer::Tokenizer& tok);

}  // namespace kiln::engine
