#include "kiln/engine/sequence.h"

#include <algorithm>
#include <numeric>

namespace kiln::engine {

Expected<std::unique_ptr<SequenceRunner>> SequenceRunner::create(const model::Model& model,
                                                                 util::ThreadPool* pool,
                                                                 int32_t n_ctx,
                                                                 int32_t max_step_tokens,
                                                                 quant::Type kv_type) {
  const model::HParams& hp = model.hparams();
  if (n_ctx <= 0) n_ctx = static_cast<int32_t>(std::min<uint32_t>(hp.n_ctx_train, 1u << 20));
  if (max_step_tokens <= 0) return err("max_step_tokens must be > 0");
  kv::KvShape shape = model::kv_shape(hp);
  shape.type = kv_type;
  const int32_t n_blocks = (n_ctx + kv::kBlockTokens - 1) / kv::kBlockTokens;
  KILN_TRY(kv::KvCache cache,
           kv::KvCache::create(shape, kv::KvCache::bytes_per_block(shape) * n_blocks));
  return std::unique_ptr<SequenceRunner>(
      new SequenceRunner(model, pool, n_ctx, max_step_tokens, std::move(cache)));
}

SequenceRunner::SequenceRunner(const model::Model& model, util::ThreadPool* pool, int32_t n_ctx,
                               int32_t max_step_tokens, kv::KvCache cache)
    : model_(model),
      n_ctx_(n_ctx),
      forward_(model, max_step_tokens, pool),
      cache_(std::move(cache)),
      blocks_(static_cast<size_t>(cache_.num_blocks())) {
  std::iota(blocks_.begin(), blocks_.end(), 0);
}

void SequenceRunner::truncate(int32_t n) {
  if (n < static_cast<int32_t>(tokens_.size())) tokens_.resize(static_cast<size_t>(std::max(0, n)));
}

Expected<std::span<const float>> SequenceRunner::append(std::span<const int32_t> tokens) {
  const uint32_t n_vocab = model_.hparams().n_vocab;
  if (tokens.empty()) return err("append: no tokens");
  if (tokens_.size() + tokens.size() > static_cast<size_t>(n_ctx_))
    return err("context is full: {} + {} tokens exceed the context of {}", tokens_.size(),
               tokens.size(), n_ctx_);
  logits_.clear();
  size_t done = 0;
  while (done < tokens.size()) {
    const size_t n = std::min<size_t>(tokens.size() - done, forward_.max_tokens());
    const int32_t start = static_cast<int32_t>(tokens_.size());
    tokens_.insert(tokens_.end(), tokens.begin() + done, tokens.begin() + done + n);
    std::vector<int32_t> positions(n), rows;
    std::iota(positions.begin(), positions.end(), start);
    const bool last_chunk = done + n == tokens.size();
    if (keep_all_logits_) {
      rows.resize(n);
      std::iota(rows.begin(), rows.end(), 0);
    } else if (last_chunk) {
      rows.push_back(static_cast<int32_t>(n) - 1);
    }
    const int32_t qo[2] = {0, static_cast<int32_t>(n)};
    const int32_t kv_ptr[2] = {0, static_cast<int32_t>(blocks_.size())};
    const int32_t kv_len[1] = {static_cast<int32_t>(tokens_.size())};
    model::StepInput in;
    in.tokens = std::span<const int32_t>(tokens_).subspan(static_cast<size_t>(start), n);
    in.attn = {1, qo, kv_ptr, blocks_.data(), kv_len, positions.data()};
    in.logit_rows = rows;
    const size_t base = logits_.size();
    logits_.resize(base + rows.size() * n_vocab);
    Status st = forward_.run(in, cache_, logits_.data() + base);
    if (!st.ok()) {
      tokens_.resize(static_cast<size_t>(start));
      return std::move(st).take_error();
    }
    done += n;
  }
  return std::span<const float>(logits_).subspan(logits_.size() - n_vocab, n_vocab);
}

std::vector<int32_t> end_of_generation_ids(const tokenizer::Tokenizer& tok) {
  std::vector<int32_t> ids;
  const tokenizer::VocabData& v = tok.vocab();
  for (const auto& id : {v.eos_id, v.eot_id, v.eom_id})
    if (id) ids.push_back(*id);
  static constexpr std::string_view kEndOfTurn[] = {
      "<|eot_id|>",    "<|im_end|>", "<|end|>",         "<end_of_turn>",
      "<|endoftext|>", "<|eom_id|>", "<EOT>",           "</s>",
      "<|return|>",    "<|call|>",   "<|end_of_text|>", "<｜end▁of▁sentence｜>"};
  for (std::string_view text : kEndOfTurn) {
    auto id = tok.find_token(text);
    if (id && (tok.token_type(*id) == tokenizer::TokenType::kControl ||
               tok.token_type(*id) == tokenizer::TokenType::kUserDefined))
      ids.push_back(*id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace kiln::engine
