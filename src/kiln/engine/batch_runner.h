// A fixed set of sequences on one model, run together through one Executor: kiln bench's
// tests (--parallel P decodes P sequences a step, one token each, each after its own --depth
// context). SequenceRunner is the one-sequence case for kiln run and perplexity; the steps
// here are built the same way (and as the engine loop builds them): one flat batch per step,
// each sequence's rows contiguous and in order, its whole block table, its kv_len after the
// step's writes, and on hybrid models its recurrent-state slot.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/engine/executor.h"
#include "kiln/model/model.h"
#include "kiln/util/status.h"

namespace kiln::engine {

struct BatchRunnerOptions {
  int32_t num_seqs = 1;
  int32_t n_ctx = 0;              // the most tokens one sequence may hold
  int32_t max_step_tokens = 512;  // rows per step: prefill chunks (decode steps of num_seqs
                                  // rows fit however small it is)
  quant::Type kv_type = quant::Type::F16;
  bool graphs = ExecutorOptions::graphs_default();
  model::MeshShape mesh;  // --tp / --pp / --ep
};

class BatchRunner {
 public:
  // Sequence s owns KV blocks [s * blocks_per_seq, (s + 1) * blocks_per_seq) and, on hybrid
  // models, state slot s (and num_seqs + s for its save_context snapshot).
  static Expected<std::unique_ptr<BatchRunner>> create(const model::Model& model,
                                                       backend::Backend& be,
                                                       const BatchRunnerOptions& opts);

  // Tokens to append to one sequence.
  struct Segment {
    int32_t seq = 0;
    std::span<const int32_t> tokens;
  };
  // Appends each segment's tokens to its sequence (each sequence at most once in a call), in
  // steps of at most max_step_tokens rows: the segments laid out in order, a step holding the
  // pieces that fit. Returns the logits after each segment's last token, [segments, n_vocab]
  // in segment order, valid until the next call. Errors: a context would overflow, a sequence
  // out of range or twice, a token id out of range (the failing step's tokens are not kept).
  Expected<std::span<const float>> append(std::span<const Segment> segments);
  // append, bringing back each segment's greedy id (its largest logit, the first on ties)
  // instead of its logits.
  Expected<std::vector<int32_t>> append_argmax(std::span<const Segment> segments);
  // Forgets sequence seq's tokens from position n on (their KV is overwritten by later
  // appends). On hybrid models the recurrent state cannot go back: use restore_context.
  void truncate(int32_t seq, int32_t n);
  // Remembers every sequence's tokens as its context (and, on hybrid models, snapshots its
  // recurrent state); restore_context truncates each back to it and restores the state, so a
  // test can run again after the same context without prefilling it again.
  void save_context();
  void restore_context();

  int32_t num_seqs() const { return static_cast<int32_t>(seqs_.size()); }
  int32_t n_ctx() const { return n_ctx_; }
  int32_t seq_len(int32_t seq) const { return static_cast<int32_t>(seqs_.at(seq).tokens.size()); }
  Executor& executor() { return *exec_; }

 private:
  struct Seq {
    std::vector<int32_t> tokens;
    int32_t context_len = 0;  // save_context
  };
  BatchRunner(const model::Model& model, int32_t n_ctx, int32_t blocks_per_seq,
              std::unique_ptr<Executor> exec, int32_t num_seqs);
  // The steps of append: with ids, each segment's argmax to ids[i], else its logits.
  Status run(std::span<const Segment> segments, std::vector<int32_t>* ids);
  // One step of pieces (segment index, first token of it, count), laid out in order.
  struct Piece {
    size_t segment = 0;
    size_t first = 0, count = 0;
  };
  Status step(std::span<const Segment> segments, std::span<const Piece> pieces,
              std::vector<int32_t>* ids);

  const model::Model& model_;
  int32_t n_ctx_;
  int32_t blocks_per_seq_;
  std::unique_ptr<Executor> exec_;
  std::vector<Seq> seqs_;
  std::vector<int32_t> block_table_;  // all sequences' blocks: sequence s's from s * blocks_per_seq
  std::vector<float> logits_;         // [segments, n_vocab] of the last append
  // A step's host arrays, reused.
  std::vector<int32_t> tokens_, positions_, qo_, kv_ptr_, kv_idx_, kv_len_, rows_, slots_;
  std::vector<size_t> ending_;  // the segment of each logit row
};

}  // namespace kiln::engine
