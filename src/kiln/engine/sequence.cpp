#include "kiln/engine/sequence.h"

#include <algorithm>
#include <numeric>

#include "kiln/kv/kv_cache.h"

namespace kiln::engine {

Expected<std::unique_ptr<SequenceRunner>> SequenceRunner::create(
    const model::Model& model, backend::Backend& be, int32_t n_ctx, int32_t max_step_tokens,
    quant::Type kv_type, bool all_logits, const model::MeshShape& mesh) {
  const model::HParams& hp = model.hparams();
  if (n_ctx <= 0) n_ctx = static_cast<int32_t>(std::min<uint32_t>(hp.n_ctx_train, 1u << 20));
  if (max_step_tokens <= 0) return err("max_step_tokens must be > 0");
  const int32_t n_blocks = (n_ctx + kv::kBlockTokens - 1) / kv::kBlockTokens;
  ExecutorOptions o;
  o.max_tokens = max_step_tokens;
  o.max_seqs = 1;
  o.max_context = n_ctx;
  o.max_logit_rows = all_logits ? max_step_tokens : 1;
  o.kv_type = kv_type;
  const backend::KvSpec spec = model::kv_spec(hp, kv_type);
  o.kv_memory_bytes = be.kv_bytes_per_block(spec) * static_cast<uint64_t>(n_blocks);
  if (o.kv_memory_bytes == 0)
    return err("kv: the {} KV cache cannot hold this model's heads (head dims {}/{})",
               quant::type_name(kv_type), spec.head_dim_k, spec.head_dim_v);
  o.min_kv_blocks = n_blocks;
  o.mesh = mesh;
  KILN_TRY(std::unique_ptr<Executor> exec, Executor::create(model, be, o));
  return std::unique_ptr<SequenceRunner>(new SequenceRunner(model, n_ctx, std::move(exec)));
}

SequenceRunner::SequenceRunner(const model::Model& model, int32_t n_ctx,
                               std::unique_ptr<Executor> exec)
    : model_(model),
      n_ctx_(n_ctx),
      exec_(std::move(exec)),
      blocks_(static_cast<size_t>((n_ctx + kv::kBlockTokens - 1) / kv::kBlockTokens)) {
  std::iota(blocks_.begin(), blocks_.end(), 0);
}

void SequenceRunner::truncate(int32_t n) {
  if (n < static_cast<int32_t>(tokens_.size())) tokens_.resize(static_cast<size_t>(std::max(0, n)));
}

Status SequenceRunner::run_steps(std::span<const int32_t> tokens, int32_t* argmax) {
  if (tokens.empty()) return err("append: no tokens");
  if (tokens_.size() + tokens.size() > static_cast<size_t>(n_ctx_))
    return err("context is full: {} + {} tokens exceed the context of {}", tokens_.size(),
               tokens.size(), n_ctx_);
  logits_.clear();
  size_t done = 0;
  while (done < tokens.size()) {
    const size_t n = std::min<size_t>(tokens.size() - done, exec_->forward().max_tokens());
    const int32_t start = static_cast<int32_t>(tokens_.size());
    tokens_.insert(tokens_.end(), tokens.begin() + done, tokens.begin() + done + n);
    std::vector<int32_t> positions(n), rows;
    std::iota(positions.begin(), positions.end(), start);
    const bool last_chunk = done + n == tokens.size();
    if (keep_all_logits_ && argmax == nullptr) {
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
    static constexpr int32_t kSlot0[] = {0};  // one sequence: state slot 0
    if (exec_->state() != nullptr) {
      in.state = exec_->state();
      in.state_slots = kSlot0;
    }
    const bool want_id = argmax != nullptr && last_chunk;
    if (Status st = exec_->run(in, want_id); !st.ok()) {
      tokens_.resize(static_cast<size_t>(start));
      return st;
    }
    if (want_id) {
      *argmax = exec_->argmax_ids()[0];
    } else {
      logits_.insert(logits_.end(), exec_->logits().begin(), exec_->logits().end());
    }
    done += n;
  }
  return {};
}

Expected<std::span<const float>> SequenceRunner::append(std::span<const int32_t> tokens) {
  KILN_TRY_STATUS(run_steps(tokens, nullptr));
  const uint32_t n_vocab = model_.hparams().n_vocab;
  return std::span<const float>(logits_).subspan(logits_.size() - n_vocab, n_vocab);
}

Expected<int32_t> SequenceRunner::append_argmax(std::span<const int32_t> tokens) {
  int32_t id = 0;
  KILN_TRY_STATUS(run_steps(tokens, &id));
  return id;
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
