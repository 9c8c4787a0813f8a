// The model on a backend, ready to run steps: the forward (weights prepared, activation arena
// carved), the paged KV storage sized by the memory plan, and the step's logits in host
// memory. The engine loop and SequenceRunner (kiln run, bench, perplexity) both run their
// steps through it.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/model/forward.h"
#include "kiln/model/model.h"
#include "kiln/util/status.h"

namespace kiln::engine {

struct ExecutorOptions {
  int32_t max_tokens = 512;     // rows per step
  int32_t max_seqs = 16;        // sequences per step (and concurrent sequences)
  int32_t max_context = 4096;   // tokens per sequence
  int32_t max_logit_rows = 0;   // logit rows per step (0: max_seqs)
  int32_t max_hidden_rows = 0;  // hidden-state rows per step (embeddings; 0: none)
  int32_t state_snapshots = 0;  // hybrid models: recurrent-state slots beyond the max_seqs
                                // sequences' ones, for prefix-cache snapshots
  quant::Type kv_type = quant::Type::F16;
  // KV pool: an explicit byte budget, else on a GPU gpu_memory_fraction of the device's
  // memory minus what weights, activations and recurrent state took, else (CPU) max_seqs full
  // contexts capped at 2 GiB. min_kv_blocks: fewer is an error (SequenceRunner needs its whole
  // context).
  uint64_t kv_memory_bytes = 0;
  double gpu_memory_fraction = 0.9;
  int32_t min_kv_blocks = 1;
  // Decode steps from CUDA graphs where the backend has them; KILN_CUDA_GRAPHS=0 in the
  // environment turns them off (every step eager, for comparisons and debugging).
  bool graphs = graphs_default();
  static bool graphs_default();
};

// What the model takes on its device, printed at start by kiln serve and kiln run.
struct MemoryPlan {
  std::string device;
  uint64_t device_total_bytes = 0;
  uint64_t weight_bytes = 0;  // prepared on the device (CPU: packed copies; the mapped
                              // file is counted in file_bytes)
  uint64_t file_bytes = 0;
  uint64_t activation_bytes = 0;  // the forward's arena
  uint64_t kv_bytes_per_token = 0;
  int32_t kv_blocks = 0;
  int64_t kv_tokens = 0;  // tokens the KV pool holds
  int32_t max_context = 0;
  int32_t max_seqs_at_context = 0;   // sequences of max_context tokens that fit at once
  uint64_t state_bytes_per_seq = 0;  // hybrid models: one recurrent-state slot
  int32_t state_slots = 0;           // the sequences' slots
  int32_t state_snapshots = 0;       // and the snapshots' after them
  std::string to_string() const;
};

class Executor {
 public:
  static Expected<std::unique_ptr<Executor>> create(const model::Model& model, backend::Backend& be,
                                                    const ExecutorOptions& opts);

  // Runs one step: launch, then wait. Its outputs, valid until the next step, in host memory:
  // logits() [in.logit_rows.size(), n_vocab], or with argmax (for rows all sampled greedily
  // with nothing else read from their logits) argmax_ids() [in.logit_rows.size()], each row's
  // first largest logit, the logits left on the device; hidden() for in.hidden_rows.
  Status run(const model::StepInput& in, bool argmax);
  // run in two halves: launch queues the step and returns; the host may work meanwhile (the
  // engine computes grammar masks); wait() waits for it.
  Status launch(const model::StepInput& in, bool argmax);
  void wait();
  std::span<const float> logits() const { return logits_out_; }
  std::span<const int32_t> argmax_ids() const { return ids_out_; }
  // The final-norm hidden states of the last step's hidden_rows, [rows, n_embd] in host
  // memory, valid until the next call.
  std::span<const float> hidden() const { return hidden_; }

  // KV blocks the sequences may use: 0 .. num_blocks() - 1 (the cache has one more, the
  // null block that pads graph-replayed steps).
  int32_t num_blocks() const { return num_blocks_; }
  backend::KvCache& kv() { return *kv_; }
  const backend::KvCache& kv() const { return *kv_; }
  // The recurrent state of hybrid models, else null: slots [0, max_seqs) one per running
  // sequence, then state_snapshots snapshot slots.
  backend::StateCache* state() { return state_.get(); }
  model::Forward& forward() { return *forward_; }
  const model::Forward& forward() const { return *forward_; }
  backend::Backend& backend() { return be_; }
  const MemoryPlan& plan() const { return plan_; }
  const ExecutorOptions& options() const { return opts_; }

 private:
  Executor(const model::Model& model, backend::Backend& be, const ExecutorOptions& opts)
      : model_(model), be_(be), opts_(opts) {}
  std::span<const float> logits_out_;
  std::span<const int32_t> ids_out_;

  const model::Model& model_;
  backend::Backend& be_;
  ExecutorOptions opts_;
  std::unique_ptr<model::Forward> forward_;
  std::unique_ptr<backend::KvCache> kv_;
  std::unique_ptr<backend::StateCache> state_;
  std::unique_ptr<backend::Buffer> logits_;      // host memory, [max_logit_rows, n_vocab]
  size_t logits_capacity_ = 0;                   // floats
  std::unique_ptr<backend::Buffer> ids_;         // host memory, [max_logit_rows] int32
  std::unique_ptr<backend::Buffer> hidden_buf_;  // host memory, [max_hidden_rows, n_embd]
  std::span<const float> hidden_;
  MemoryPlan plan_;
  int32_t num_blocks_ = 0;
};

}  // namespace kiln::engine
