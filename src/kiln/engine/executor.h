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
#include "kiln/backend/mesh.h"
#include "kiln/model/forward.h"
#include "kiln/model/mesh.h"
#include "kiln/model/model.h"
#include "kiln/util/status.h"
#include "kiln/util/thread_pool.h"

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
  // A device mesh (--tp, --pp, --ep; the multi-GPU issue): the model cut into tp x pp ranks
  // (Model::shard), each on a backend of its own made like the executor's (rank 0 is it) with
  // mesh_threads threads (0: the cores shared out), run together for every step.
  model::MeshShape mesh;
  int mesh_threads = 0;
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
  // A mesh: each rank's prepared weights, KV bytes per token and activations (rank order).
  struct Rank {
    uint64_t weight_bytes = 0, kv_bytes_per_token = 0, activation_bytes = 0;
  };
  std::string mesh;  // "--tp 2 --pp 1", empty for one device
  std::vector<Rank> ranks;
  std::string to_string() const;
};

class Executor {
 public:
  static Expected<std::unique_ptr<Executor>> create(const model::Model& model, backend::Backend& be,
                                                    const ExecutorOptions& opts);

  // Runs one step: launch, then wait. On a mesh every rank runs it; a rank that fails after the
  // step's checks fails the mesh (failed()): this and every later step return an error. Its
  // outputs, valid until the next step, in host memory: logits() [in.logit_rows.size(), n_vocab],
  // or with argmax (for rows all sampled greedily with nothing else read from their logits)
  // argmax_ids() [in.logit_rows.size()], each row's first largest logit, the logits left on the
  // device; hidden() for in.hidden_rows.
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
  backend::KvCache& kv() { return *ranks_[0].kv; }
  const backend::KvCache& kv() const { return *ranks_[0].kv; }
  // The recurrent state of hybrid models, else null: slots [0, max_seqs) one per running
  // sequence, then state_snapshots snapshot slots.
  backend::StateCache* state();
  // Copies every layer's recurrent state of slot src to slot dst (prefix-cache snapshots), on
  // every rank, ordered with the steps.
  void state_copy(int32_t src_slot, int32_t dst_slot);
  // Rank 0's forward (a whole model's only one).
  model::Forward& forward() { return *ranks_[0].forward; }
  const model::Forward& forward() const { return *ranks_[0].forward; }
  // Whether launch() returns before the device has run the step (wait() waits for it): the
  // engine does other host work meanwhile. Not on a mesh: each rank's thread runs its part of
  // the step to the end.
  bool asynchronous() const { return mesh_ == nullptr && be_.asynchronous(); }
  // Whether a rank of the mesh failed (an error in a step after its checks, a peer that timed
  // out): the mesh is gone, every step fails. Never for one device.
  bool failed() const { return failed_; }
  // Gives the mesh up (a watchdog; tests): every rank's pending and later collective calls
  // fail, so the next step fails and failed() holds. Nothing on one device.
  void abort(const std::string& why) {
    if (mesh_ != nullptr) mesh_->abort(why);
  }
  backend::Backend& backend() { return be_; }
  const MemoryPlan& plan() const { return plan_; }
  const ExecutorOptions& options() const { return opts_; }

 private:
  Executor(const model::Model& model, backend::Backend& be, const ExecutorOptions& opts)
      : model_(model), be_(be), opts_(opts) {}
  std::span<const float> logits_out_;
  std::span<const int32_t> ids_out_;

  // Creates each rank's forward, KV cache and recurrent state, sized by the memory plan.
  Status create_ranks();
  Expected<uint64_t> kv_room(backend::Backend& be, const backend::KvSpec& spec,
                             uint64_t blocks_per_seq, uint64_t* blocks) const;
  // The step on every rank of a mesh, each on a thread of its own (rank 0 on the caller's,
  // the others on rank_threads_'s).
  Status launch_mesh(const model::StepInput& in, float* logits, float* hidden, int32_t* ids);

  const model::Model& model_;
  backend::Backend& be_;
  ExecutorOptions opts_;
  // The ranks: one for a whole model (be_, the model itself); on a mesh, rank stage * tp +
  // tp_rank with its shard of the model. The outputs come back from out_rank_ (the last
  // stage's tensor-parallel rank 0).
  struct Rank {
    std::unique_ptr<model::Model> shard;
    const model::Model* model = nullptr;
    backend::Backend* be = nullptr;
    std::unique_ptr<model::Forward> forward;
    std::unique_ptr<backend::KvCache> kv;
    std::unique_ptr<backend::StateCache> state;
  };
  std::unique_ptr<backend::Mesh> mesh_;
  std::vector<Rank> ranks_;
  size_t out_rank_ = 0;
  bool failed_ = false;
  std::string failure_;
  std::unique_ptr<backend::Buffer> logits_;      // host memory, [max_logit_rows, n_vocab]
  size_t logits_capacity_ = 0;                   // floats
  std::unique_ptr<backend::Buffer> ids_;         // host memory, [max_logit_rows] int32
  std::unique_ptr<backend::Buffer> hidden_buf_;  // host memory, [max_hidden_rows, n_embd]
  std::span<const float> hidden_;
  // A mesh's rank threads, made once: a pool of one thread per rank whose static ranges give
  // each thread one rank (rank 0 the caller's). Last: joined before the ranks they run go.
  std::unique_ptr<util::ThreadPool> rank_threads_;
  MemoryPlan plan_;
  int32_t num_blocks_ = 0;
};

}  // namespace kiln::engine
