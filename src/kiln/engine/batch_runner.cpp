#include "kiln/engine/batch_runner.h"

#include <algorithm>
#include <numeric>

#include "kiln/kv/kv_cache.h"

namespace kiln::engine {

Expected<std::unique_ptr<BatchRunner>> BatchRunner::create(const model::Model& model,
                                                           backend::Backend& be,
                                                           const BatchRunnerOptions& opts) {
  if (opts.num_seqs <= 0 || opts.n_ctx <= 0 || opts.max_step_tokens <= 0)
    return err("batch runner: num_seqs, n_ctx and max_step_tokens must be > 0 (got {}, {}, {})",
               opts.num_seqs, opts.n_ctx, opts.max_step_tokens);
  const model::HParams& hp = model.hparams();
  const int32_t blocks_per_seq = (opts.n_ctx + kv::kBlockTokens - 1) / kv::kBlockTokens;
  ExecutorOptions o;
  o.max_tokens = std::max(opts.max_step_tokens, opts.num_seqs);
  o.max_seqs = opts.num_seqs;
  o.max_context = opts.n_ctx;
  o.max_logit_rows = opts.num_seqs;  // a step ends each sequence's segment at most once
  o.kv_type = opts.kv_type;
  o.graphs = opts.graphs;
  o.mesh = opts.mesh;
  // Hybrid models: a snapshot slot per sequence for save_context.
  if (hp.n_linear_layers() > 0) o.state_snapshots = opts.num_seqs;
  const backend::KvSpec spec = model::kv_spec(hp, opts.kv_type);
  const uint64_t per_block = be.kv_bytes_per_block(spec);
  if (per_block == 0)
    return err("kv: the {} KV cache cannot hold this model's heads (head dims {}/{})",
               quant::type_name(opts.kv_type), spec.head_dim_k, spec.head_dim_v);
  o.min_kv_blocks = blocks_per_seq * opts.num_seqs;
  o.kv_memory_bytes = per_block * static_cast<uint64_t>(o.min_kv_blocks);
  KILN_TRY(std::unique_ptr<Executor> exec, Executor::create(model, be, o));
  return std::unique_ptr<BatchRunner>(
      new BatchRunner(model, opts.n_ctx, blocks_per_seq, std::move(exec), opts.num_seqs));
}

BatchRunner::BatchRunner(const model::Model& model, int32_t n_ctx, int32_t blocks_per_seq,
                         std::unique_ptr<Executor> exec, int32_t num_seqs)
    : model_(model),
      n_ctx_(n_ctx),
      blocks_per_seq_(blocks_per_seq),
      exec_(std::move(exec)),
      seqs_(static_cast<size_t>(num_seqs)),
      block_table_(static_cast<size_t>(blocks_per_seq) * num_seqs) {
  std::iota(block_table_.begin(), block_table_.end(), 0);
}

void BatchRunner::truncate(int32_t seq, int32_t n) {
  std::vector<int32_t>& t = seqs_.at(seq).tokens;
  if (n < static_cast<int32_t>(t.size())) t.resize(static_cast<size_t>(std::max(0, n)));
}

void BatchRunner::save_context() {
  backend::StateCache* state = exec_->state();
  for (int32_t s = 0; s < num_seqs(); ++s) {
    seqs_[s].context_len = seq_len(s);
    if (state != nullptr) exec_->state_copy(s, num_seqs() + s);
  }
}

void BatchRunner::restore_context() {
  backend::StateCache* state = exec_->state();
  for (int32_t s = 0; s < num_seqs(); ++s) {
    truncate(s, seqs_[s].context_len);
    if (state != nullptr) exec_->state_copy(num_seqs() + s, s);
  }
}

Expected<std::span<const float>> BatchRunner::append(std::span<const Segment> segments) {
  KILN_TRY_STATUS(run(segments, nullptr));
  return std::span<const float>(logits_);
}

Expected<std::vector<int32_t>> BatchRunner::append_argmax(std::span<const Segment> segments) {
  std::vector<int32_t> ids(segments.size());
  KILN_TRY_STATUS(run(segments, &ids));
  return ids;
}

Status BatchRunner::run(std::span<const Segment> segments, std::vector<int32_t>* ids) {
  if (segments.empty()) return err("append: no segments");
  std::vector<bool> seen(seqs_.size(), false);
  for (const Segment& g : segments) {
    if (g.seq < 0 || g.seq >= num_seqs())
      return err("append: sequence {} is outside 0..{}", g.seq, num_seqs() - 1);
    if (seen[g.seq]) return err("append: sequence {} twice in one call", g.seq);
    seen[g.seq] = true;
    if (g.tokens.empty()) return err("append: no tokens for sequence {}", g.seq);
    const size_t len = seqs_[g.seq].tokens.size();
    if (len + g.tokens.size() > static_cast<size_t>(n_ctx_))
      return err("context is full: {} + {} tokens exceed the context of {}", len, g.tokens.size(),
                 n_ctx_);
  }
  if (ids == nullptr) logits_.assign(segments.size() * model_.hparams().n_vocab, 0.0f);
  // The segments laid out in order, cut into steps of at most max_tokens rows.
  const size_t max_rows = static_cast<size_t>(exec_->forward().max_tokens());
  std::vector<Piece> pieces;
  size_t rows = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    for (size_t first = 0; first < segments[i].tokens.size();) {
      const size_t n = std::min(segments[i].tokens.size() - first, max_rows - rows);
      pieces.push_back({i, first, n});
      first += n;
      rows += n;
      if (rows == max_rows) {
        KILN_TRY_STATUS(step(segments, pieces, ids));
        pieces.clear();
        rows = 0;
      }
    }
  }
  if (!pieces.empty()) KILN_TRY_STATUS(step(segments, pieces, ids));
  return {};
}

Status BatchRunner::step(std::span<const Segment> segments, std::span<const Piece> pieces,
                         std::vector<int32_t>* ids) {
  tokens_.clear();
  positions_.clear();
  qo_.assign(1, 0);
  kv_ptr_.assign(1, 0);
  kv_idx_.clear();
  kv_len_.clear();
  rows_.clear();
  slots_.clear();
  ending_.clear();
  for (const Piece& p : pieces) {
    const Segment& g = segments[p.segment];
    std::vector<int32_t>& held = seqs_[g.seq].tokens;
    const auto start = static_cast<int32_t>(held.size());
    const auto n = static_cast<int32_t>(p.count);
    const std::span<const int32_t> part = g.tokens.subspan(p.first, p.count);
    held.insert(held.end(), part.begin(), part.end());
    tokens_.insert(tokens_.end(), part.begin(), part.end());
    for (int32_t i = 0; i < n; ++i) positions_.push_back(start + i);
    qo_.push_back(qo_.back() + n);
    // The blocks that hold the sequence's kv_len tokens, as the engine's block tables grow.
    const int32_t kv_len = start + n;
    const int32_t blocks = (kv_len + kv::kBlockTokens - 1) / kv::kBlockTokens;
    const auto table = block_table_.begin() + static_cast<ptrdiff_t>(g.seq) * blocks_per_seq_;
    kv_idx_.insert(kv_idx_.end(), table, table + blocks);
    kv_ptr_.push_back(static_cast<int32_t>(kv_idx_.size()));
    kv_len_.push_back(kv_len);
    slots_.push_back(g.seq);
    if (p.first + p.count == g.tokens.size()) {
      rows_.push_back(qo_.back() - 1);
      ending_.push_back(p.segment);
    }
  }
  model::StepInput in;
  in.tokens = tokens_;
  in.attn = {static_cast<int32_t>(pieces.size()),
             qo_.data(),
             kv_ptr_.data(),
             kv_idx_.data(),
             kv_len_.data(),
             positions_.data()};
  in.logit_rows = rows_;
  if (exec_->state() != nullptr) {
    in.state = exec_->state();
    in.state_slots = slots_;
  }
  const bool argmax = ids != nullptr;
  if (Status st = exec_->run(in, argmax); !st.ok()) {
    for (const Piece& p : pieces) {  // this step's tokens were not computed
      std::vector<int32_t>& held = seqs_[segments[p.segment].seq].tokens;
      held.resize(held.size() - p.count);
    }
    return st;
  }
  const size_t n_vocab = model_.hparams().n_vocab;
  for (size_t r = 0; r < ending_.size(); ++r) {
    if (argmax) {
      (*ids)[ending_[r]] = exec_->argmax_ids()[r];
    } else {
      const std::span<const float> row = exec_->logits().subspan(r * n_vocab, n_vocab);
      std::copy(row.begin(), row.end(), logits_.begin() + ending_[r] * n_vocab);
    }
  }
  return {};
}

}  // namespace kiln::engine
