// The transformer forward, written once for the llama family against the backend's ops
// (backend/backend.h), for a flat batch of tokens from many sequences. At creation it
// prepares the model's weights on the backend and carves an activation arena sized for the
// largest step; run() allocates nothing, uploads the step's inputs once, and reads back only
// the logits (and, for tests, any intermediate asked for).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/model/model.h"
#include "kiln/model/rope.h"

namespace kiln::model {

struct StepInput {
  std::span<const int32_t> tokens;      // [n_tokens], flat over sequences
  backend::AttnBatch attn;              // positions and paged-KV metadata (host memory)
  std::span<const int32_t> logit_rows;  // flat rows whose logits are wanted, in output order
  // Flat rows whose final-norm hidden states are wanted (embedding pooling), in output order;
  // disjoint from logit_rows.
  std::span<const int32_t> hidden_rows;
  // Hybrid models (Gated DeltaNet layers): the recurrent state and each sequence's slot in it
  // [attn.num_seqs]. A sequence whose first row here is at position 0 starts from a zero
  // state; any other continues from its slot.
  backend::StateCache* state = nullptr;
  std::span<const int32_t> state_slots;
};

// Called with each named intermediate: (name, layer or -1, data [rows, cols], host memory).
using ActivationDump = std::function<void(std::string_view name, int layer, const float* data,
                                          int64_t rows, int64_t cols)>;

struct ForwardOptions {
  int32_t max_tokens = 512;     // rows per step (the arena's size)
  int32_t max_seqs = 0;         // sequences per step (0: max_tokens)
  int32_t max_context = 0;      // tokens per sequence (0: the model's training context)
  int32_t max_logit_rows = 0;   // rows of logits per step (0: max_seqs)
  int32_t max_hidden_rows = 0;  // rows of hidden states per step (0: none, no embeddings)
  // Decode steps (one token per sequence) run as replays of a graph captured once per batch
  // size bucket, when the backend supports graphs and a KV block is reserved for the rows that
  // pad a step up to its bucket (enable_graphs).
  bool graphs = true;
  int32_t null_kv_block = -1;    // set by enable_graphs
  int32_t null_state_slot = -1;  // hybrid models: the padding rows' recurrent-state slot
};

class Forward {
 public:
  static Expected<std::unique_ptr<Forward>> create(const Model& model, backend::Backend& be,
                                                   const ForwardOptions& opts);

  // Writes logits [logit_rows.size(), n_vocab] and, when hidden_rows are asked for, their
  // final-norm hidden states [hidden_rows.size(), n_embd] to host memory. With `ids`, each
  // logit row's argmax (Backend::argmax_rows: the first largest) goes to ids
  // [logit_rows.size()] instead and `logits` is not written: the logits stay on the device (a
  // greedy step brings back 4 bytes a row, not n_vocab floats). Errors: too many tokens,
  // sequences, blocks or rows for the step buffers, bad token ids or rows.
  Status run(const StepInput& in, backend::KvCache& cache, float* logits, float* hidden = nullptr,
             int32_t* ids = nullptr);
  // The checks run and launch make of a step before any op: its sizes against the capacity,
  // token ids, rows, recurrent state slots. (A mesh checks a step once, before its ranks run
  // it: a rank that fails after this has failed, not the input.)
  Status check(const StepInput& in) const;
  // run without the wait: the step and its copies to logits / hidden / ids (host memory from
  // Backend::alloc_host, for the copies to overlap) are queued; they are there after the
  // backend's sync(). The host may meanwhile prepare what sampling the step will need.
  Status launch(const StepInput& in, backend::KvCache& cache, float* logits,
                float* hidden = nullptr, int32_t* ids = nullptr);

  void set_dump(ActivationDump dump) { dump_ = std::move(dump); }
  int32_t max_tokens() const { return opts_.max_tokens; }
  // Decode steps run from graphs from now on (when the backend has them and opts.graphs is
  // set), their padding rows on this KV block, which no sequence may own.
  // Hybrid models need null_state_slot too: a state slot no sequence uses, which the padding
  // rows (each a fresh sequence at position 0) write; without one their decode runs eagerly.
  void enable_graphs(int32_t null_kv_block, int32_t null_state_slot = -1);
  bool graphs_enabled() const { return !buckets_.empty(); }
  // While set, every step runs eagerly, decode steps too (kiln bench --roofline's profiled
  // steps: a backend times the ops it issues, not those a graph replays); the graphs captured
  // stay for when it is cleared.
  void set_eager(bool eager) { eager_ = eager; }
  // Bytes of the activation arena (the memory plan).
  uint64_t arena_bytes() const { return arena_ != nullptr ? arena_->bytes() : 0; }
  backend::Backend& backend() const { return be_; }

 private:
  Forward(const Model& model, backend::Backend& be, const ForwardOptions& opts);
  Status prepare();
  Status carve_arena();
  // The blocks of a layer (model/blocks/), one per kind of LayerDesc: each reads x_ (adding
  // the previous block's output, left in tmp_, fused with its norm) and leaves its own output
  // in tmp_.
  void attention_block(int layer, const LayerDesc& desc, const backend::StepArgs& step,
                       backend::KvCache& cache, int64_t n);
  // A Gated DeltaNet layer (blocks/delta_net.cpp): the conv and the delta rule over the
  // sequences' recurrent states.
  void delta_net_block(int layer, const backend::StepArgs& step, backend::StateCache& state,
                       int64_t n);
  void ffn_input(int layer, int64_t n);
  void dense_ffn_block(int layer, int64_t n);
  void moe_ffn_block(int layer, int64_t n);
  void shared_expert(int layer, int64_t n);
  // Encoders (blocks/encoder.cpp): the embeddings, and post-norm blocks that leave x_ whole.
  void encoder_embeddings(const backend::StepArgs& step, int64_t n);
  void encoder_attention_block(int layer, const backend::StepArgs& step, backend::KvCache& cache,
                               int64_t n);
  void encoder_ffn_block(int layer, int64_t n);
  // The ops of a step of n rows whose inputs are uploaded, up to the logits of its first
  // n_out logit rows in logits_; the n_hidden rows after them (step.logit_rows holds both
  // lists) stop at the final norm, rows [n_out, n_out + n_hidden) of xn_.
  void body(const backend::StepArgs& step, backend::KvCache& cache, backend::StateCache* state,
            int64_t n, int64_t n_out, int64_t n_hidden = 0);
  // The decode step padded to its bucket, run from its graph (captured on first use).
  Status run_graph(const StepInput& in, backend::KvCache& cache, float* logits, int32_t* ids);
  // The step's first n_out logit rows to the host: the logits, or with ids their argmax.
  void download_logits(int64_t n_out, float* logits, int32_t* ids);
  void dump(std::string_view name, int layer, backend::Mat m);
  // A row-parallel matmul's output (a partial sum on each tensor-parallel rank) summed over
  // the ranks; nothing on a mesh of one.
  void reduce(backend::Mat y);
  // Whether layer il first adds the previous layer's output to x (not on the first layer of
  // the model or of a pipeline stage, whose x comes whole).
  bool residual_pending(int il) const { return il > static_cast<int>(place_.first_layer); }

  const Model& model_;
  backend::Backend& be_;
  ForwardOptions opts_;
  // The model's place on a device mesh (a mesh of one for a whole model): the index of its
  // stage's first layer in this rank's KV cache and recurrent state, and whether the output
  // projection is split by vocabulary over the tensor-parallel ranks (the logits gathered).
  MeshPlace place_;
  uint32_t kv_base_ = 0, linear_base_ = 0;
  bool linear_layers_ = false;  // the stage has Gated DeltaNet layers (needs a state)
  bool vocab_split_ = false;
  ActivationDump dump_;
  std::vector<float> dump_host_;

  // The model's weights as the backend's ops take them.
  ModelWeights weights_;
  std::vector<LayerWeights> layers_;
  // Encoders: row 0 of the token type table (every token is of type 0), as a bias vector.
  std::vector<float> token_type0_host_;
  const float* token_type0_ = nullptr;

  // Activation arena, carved into [max_tokens, width] matrices.
  std::unique_ptr<backend::Buffer> arena_;
  backend::Mat x_, xn_, q_, k_, v_, attn_, gate_, up_, tmp_, tmp2_, out_rows_, logits_, row_scale_;
  backend::Mat ids_;  // [max_logit_rows] int32 (the size of a float): the logit rows' argmax
  backend::Mat logits_part_;      // vocab_split_: this rank's columns of the logits
  backend::Mat logits_gathered_;  // and every rank's, one after another
  // The shared expert's output and gate logit (qwen35moe, qwen3next).
  backend::Mat shexp_out_, shexp_gate_;
  // qwen35 attention: the projection of [q_h | gate_h] per head, and the gates.
  backend::Mat q_gate_, attn_gate_;
  // Gated DeltaNet layers: the projections (mixed [q | k | v], z, beta, alpha; qwen3next's
  // [b | a]), the conv's output and the delta rule's.
  backend::Mat lin_mixed_, lin_conv_, lin_z_, lin_beta_, lin_alpha_, lin_ba_, lin_core_;
  backend::MoeScratch moe_;
  // Rope: [0] full-attention layers, [1] sliding layers (when their frequencies differ); the
  // step's cos/sin tables ([max_tokens, n_rot / 2]) are shared by Q, K and every layer.
  RopeFreqs rope_[2];
  backend::RopeTable rope_table_[2];
  bool rope_swa_differs_ = false;
  backend::Mat rope_cos_[2], rope_sin_[2];
  // Host-side per-row values computed from positions (mistral3's query scale).
  std::vector<float> row_scale_host_;
  // Host list of a step's logit rows then hidden rows (capacity reserved at creation).
  std::vector<int32_t> out_rows_host_;
  // Graphs: bucket sizes (ascending), the graph of each (-1 until captured), and host buffers
  // of the padded step.
  std::vector<int32_t> buckets_;
  std::vector<int32_t> graph_of_bucket_;
  std::vector<int32_t> pad_tokens_, pad_positions_, pad_qo_, pad_kv_ptr_, pad_kv_idx_, pad_kv_len_,
      pad_rows_, pad_state_slots_;
  backend::StateCache* graph_state_ = nullptr;  // the recurrent state the graphs were captured on
  bool eager_ = false;                          // set_eager
  // Fills row_scale_host_ for rows [0, n) from positions; the span to upload (empty if none).
  std::span<const float> row_scales(const int32_t* positions, int64_t n);

 public:
  // Graph replays and captures so far (tests and benchmarks).
  int64_t num_graph_replays() const { return num_graph_replays_; }
  int64_t num_graph_captures() const { return num_graph_captures_; }

 private:
  int64_t num_graph_replays_ = 0, num_graph_captures_ = 0;
};

}  // namespace kiln::model
