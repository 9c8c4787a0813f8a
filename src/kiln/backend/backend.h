// The ops interface: model/forward.cpp is written once against it, and each backend
// (backend/cpu, backend/cuda) implements it (docs/architecture.md, "Backends").
//
// What a backend holds: device memory (buffers, fp32 matrix views of an activation arena),
// weights prepared for its kernels at load, the paged KV storage, fixed buffers for the
// step's inputs, and the ops. Nothing above backend/ names a backend.
//
// Pointers in Mat, in a prepared Weight's data, in StepArgs and in a KvCache live in the
// backend's memory: host code never dereferences them (the CPU backend's memory is the
// host's, but code above backend/ must not rely on it). Ops are issued in order on the
// backend's stream; only download() and sync() wait for them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/backend/collective.h"
#include "kiln/backend/profile.h"
#include "kiln/backend/weight.h"
#include "kiln/quant/types.h"
#include "kiln/util/status.h"

namespace kiln::backend {

// A [rows, cols] fp32 matrix in backend memory, row-major (row r starts at data + r * cols).
struct Mat {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;

  int64_t size() const { return rows * cols; }
  // The first n rows.
  Mat first_rows(int64_t n) const { return {data, n, cols}; }
  // The same memory seen as [r, c] (r * c <= rows * cols).
  Mat as(int64_t r, int64_t c) const { return {data, r, c}; }
  // Row r onwards.
  Mat from_row(int64_t r) const { return {data + r * cols, rows - r, cols}; }
};

// The geometry and storage type of a paged KV cache: n_layer layers of blocks of
// block_tokens tokens, each holding K and V rows of every kv head.
struct KvSpec {
  int32_t n_layer = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;
  quant::Type type = quant::Type::F16;  // F32, F16 or Q8_0
  int32_t block_tokens = 16;
};

// The checks every backend makes of a KV spec: a positive shape, a storage type the caches
// hold (F32, F16, Q8_0), head dims that are whole blocks of that type. An error naming them.
Status check_kv_spec(const KvSpec& spec);

// Paged KV storage of one backend (the layout inside a block is the backend's own, defined
// beside its kernels). Which block belongs to which sequence is the block manager's business
// (kv/block_pool.h); this only owns the memory.
class KvCache {
 public:
  virtual ~KvCache() = default;
  const KvSpec& spec() const { return spec_; }
  int32_t num_blocks() const { return num_blocks_; }
  quant::Type type() const { return spec_.type; }
  // Reads token `in_block` of kv head kvh of (layer, block) back as fp32 (head_dim values,
  // host memory): exact decoding of what is stored. For tests.
  virtual void read(bool is_k, int32_t layer, int32_t block, int32_t in_block, int32_t kvh,
                    float* out) const = 0;

 protected:
  KvCache(const KvSpec& spec, int32_t num_blocks) : spec_(spec), num_blocks_(num_blocks) {}
  KvSpec spec_;
  int32_t num_blocks_ = 0;
};

// Per-sequence recurrent state of gated-delta-net layers (qwen35/qwen3next "linear attention"):
// per slot and per recurrent layer, a conv state [conv_k - 1, conv_dim] (the last conv_k - 1
// inputs of the causal conv1d) and an SSM state [n_v_heads, head_k_dim, head_v_dim], fp32.
// conv_dim is the width of the conv's input, q | k | v: 2 * n_k_heads * head_k_dim +
// n_v_heads * head_v_dim. n_layer counts the recurrent layers only.
struct StateSpec {
  int32_t n_layer = 0;
  int32_t conv_dim = 0;
  int32_t conv_k = 0;
  int32_t n_k_heads = 0;
  int32_t n_v_heads = 0;
  int32_t head_k_dim = 0;
  int32_t head_v_dim = 0;

  // Values of one slot's state of one layer: the conv part and the SSM part.
  int64_t conv_values() const { return int64_t{conv_k - 1} * conv_dim; }
  int64_t ssm_values() const { return int64_t{n_v_heads} * head_k_dim * head_v_dim; }
};

// The checks every backend makes of a state spec: positive shapes, n_v_heads a multiple of
// n_k_heads, conv_dim == 2 * n_k_heads * head_k_dim + n_v_heads * head_v_dim. An error naming
// them.
Status check_state_spec(const StateSpec& spec);

// Recurrent state storage of one backend, num_slots slots (the layout is the backend's own).
// Which slot belongs to which sequence is the state pool's business (kv/); this only owns the
// memory. Fresh storage is zero.
class StateCache {
 public:
  virtual ~StateCache() = default;
  const StateSpec& spec() const { return spec_; }
  int32_t num_slots() const { return num_slots_; }
  // Host copies of one slot's state of one layer: conv [conv_k - 1, conv_dim], SSM
  // [n_v_heads, head_k_dim, head_v_dim]. They wait for every op issued before. For tests.
  virtual void read_conv(int32_t layer, int32_t slot, float* out) const = 0;
  virtual void read_ssm(int32_t layer, int32_t slot, float* out) const = 0;
  virtual void write_conv(int32_t layer, int32_t slot, const float* in) = 0;
  virtual void write_ssm(int32_t layer, int32_t slot, const float* in) = 0;

 protected:
  StateCache(const StateSpec& spec, int32_t num_slots) : spec_(spec), num_slots_(num_slots) {}
  StateSpec spec_;
  int32_t num_slots_ = 0;
};

// The shape of a gated delta rule (Backend::gated_delta_rule). Value head h reads key head
// p.key_head(h).
struct DeltaParams {
  int32_t n_k_heads = 0;
  int32_t n_v_heads = 0;
  int32_t head_k_dim = 0;
  int32_t head_v_dim = 0;
  float norm_eps = 1e-6f;  // of the L2 norms of q and k
  // Which key head value head h reads: h % n_k_heads when the value heads are stored tiled
  // (qwen35 and qwen35moe files: llama.cpp's converter reorders them), h / (n_v / n_k) when
  // grouped as Hugging Face keeps them (qwen3next files).
  bool tiled_heads = true;
  int32_t key_head(int32_t h) const {
    return tiled_heads ? h % n_k_heads : h / (n_v_heads / n_k_heads);
  }
};

// One step's inputs in backend memory (Backend::upload_step). n_tokens rows; attn's pointers
// are backend memory; logit_rows lists the flat rows whose logits are wanted.
struct StepArgs {
  int64_t n_tokens = 0;
  int64_t n_logit_rows = 0;
  int32_t max_q_len = 0;                // the longest query run of one sequence in this step
  const int32_t* tokens = nullptr;      // [n_tokens]
  AttnBatch attn;                       // CSR metadata and positions
  const int32_t* logit_rows = nullptr;  // [n_logit_rows]
  const float* row_scale = nullptr;     // [n_tokens] per-row values the host computed
                                        // (mistral3's query scale), null when not uploaded
  // [attn.num_seqs] the recurrent state slot of each sequence; null when the model has no
  // recurrent layers.
  const int32_t* state_slots = nullptr;
};

// The step as the host builds it (host memory).
struct HostStep {
  std::span<const int32_t> tokens;
  AttnBatch attn;  // host pointers
  std::span<const int32_t> logit_rows;
  std::span<const float> row_scale;      // optional, [n_tokens]
  std::span<const int32_t> state_slots;  // [attn.num_seqs], or empty: no recurrent layers
};

struct StepCapacity {
  int64_t max_tokens = 0;      // rows per step
  int64_t max_kv_indices = 0;  // entries of kv_indices per step
  int32_t n_heads = 0;         // attention's query heads and V head size (its scratch)
  int32_t head_dim_v = 0;
};

struct AttnParams {
  int32_t n_heads = 0;
  float scale = 1.0f;          // applied to q.k
  float softcap = 0.0f;        // score = softcap * tanh(score / softcap); 0 = off
  int32_t sliding_window = 0;  // a query at p sees keys > p - window; 0 = whole context
  // false: a query row sees every key of its sequence in the cache after this step's KV write
  // (positions 0 .. kv_len - 1, also those after its own position), as an encoder (BERT)
  // attends. Not combined with a sliding window (both backends assert sliding_window == 0).
  bool causal = true;
};

// Rotary embedding of a step: per-pair inverse frequencies (backend memory, double) and the
// attention factor; rope_angles writes the step's cos/sin tables.
struct RopeTable {
  const double* inv_freq = nullptr;  // [n_pairs]
  int32_t n_pairs = 0;
  float attn_factor = 1.0f;
};

// A mixture-of-experts FFN layer (qwen3moe): router [n_embd -> n_expert] and the stacked
// experts (expert e of a stacked weight: n_out rows starting at row e * n_out).
struct MoeWeights {
  const Weight* router = nullptr;
  const Weight* gate_exps = nullptr;
  const Weight* up_exps = nullptr;
  const Weight* down_exps = nullptr;
  int32_t n_expert = 0;
  int32_t n_expert_used = 0;
  int64_t n_ff = 0;  // expert FFN width
  // The experts the stacked weights hold: first_expert .. first_expert + n_mats - 1 of the
  // n_expert the router chooses from (all of them but on an expert-parallel mesh).
  int32_t first_expert = 0;
};

// Scratch of the MoE op, carved from the activation arena (sized for max_tokens rows).
struct MoeScratch {
  Mat router;                 // [max_tokens, n_expert]
  Mat weights;                // [max_tokens, n_expert_used]: the chosen experts' weights
  int32_t* chosen = nullptr;  // [max_tokens * n_expert_used]: expert ids
  int32_t* x_rows = nullptr;  // [max_tokens * n_expert_used]: token row of each pair
  Mat in;                     // [max_tokens * n_expert_used, n_embd]: rows gathered per expert
  Mat gate, up;               // [max_tokens * n_expert_used, n_ff]
  Mat out;                    // [max_tokens * n_expert_used, n_embd]: per-pair outputs
  Mat slots;                  // [max_tokens * n_expert_used, n_embd]: weighted per (token, slot)
};

// Memory of the device a backend computes on.
struct DeviceMemory {
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
};

// A block of backend memory, freed with the object.
class Buffer {
 public:
  virtual ~Buffer() = default;
  void* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

 protected:
  Buffer(void* data, uint64_t bytes) : data_(data), bytes_(bytes) {}
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "cuda:0", ...; and a line describing the device for logs.
  virtual std::string name() const = 0;
  virtual std::string description() const = 0;
  virtual DeviceMemory memory() const = 0;

  // Deterministic mode (`--deterministic`): every op computes a row's result in one fixed order
  // whatever else is in the step (the batch's size and make-up, how a prompt was cut into
  // chunks, a prefix-cache hit), so greedy output depends on the request alone. The CPU ops are
  // that way already except the gated delta rule, whose chunked prefill form it turns off; CUDA
  // keeps one kernel family per op for every token count (backend/cuda: matmul.cu,
  // attention.cu). Set before the first step.
  virtual void set_deterministic(bool on) { deterministic_ = on; }
  bool deterministic() const { return deterministic_; }

  // ---- memory ----
  virtual Expected<std::unique_ptr<Buffer>> alloc(uint64_t bytes) = 0;
  // Host memory that downloads reach fastest (CUDA: pinned), for results read every step.
  virtual Expected<std::unique_ptr<Buffer>> alloc_host(uint64_t bytes) = 0;
  // Copies between host and backend memory. upload is ordered with the ops; download waits
  // for every op issued before it.
  virtual void upload(void* dst, const void* host_src, uint64_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, uint64_t bytes) = 0;
  // download queued behind the work before it, without waiting: the bytes are in host_dst
  // after sync() (pinned memory from alloc_host lets the host go on meanwhile). Backends that
  // compute on the host copy at once.
  virtual void download_async(void* host_dst, const void* src, uint64_t bytes) {
    download(host_dst, src, bytes);
  }
  // dst = src for `bytes` bytes of backend memory (the regions must not overlap), ordered with
  // the ops (kiln bench --roofline times it for the device's copy bandwidth).
  virtual void copy(void* dst, const void* src, uint64_t bytes) = 0;
  // Waits for every op issued so far.
  virtual void sync() = 0;
  // Whether ops return before their work is done (queued on a device, done by sync()): the
  // host may do other work while a step runs. False where the ops compute on the calling thread.
  virtual bool asynchronous() const { return false; }

  // ---- profiling ----
  // While on, the backend times each matmul, matmuls group, moe, attention and copy op it
  // issues and sums them by label (profile.h: matmul_label, matmuls_label, moe_label;
  // "attention" and "copy"), with the weight bytes each had to read (attention: 0; copy: the
  // bytes copied). Ops recorded into a graph (begin_capture .. end_capture) are not timed:
  // profiled steps must run eagerly. Off (the default), nothing is timed.
  virtual void set_profiling(bool on) { (void)on; }
  // Waits for the ops issued, then returns the sums since the last take (in the order their
  // labels were first seen) and starts again from nothing. Empty for a backend that cannot
  // profile.
  virtual std::vector<OpTime> profile_take() { return {}; }

  // ---- load ----
  // The weight as this backend's ops take it (CPU: its interleaved copy where one exists;
  // CUDA: uploaded to device memory). Prepared once per distinct file tensor (keyed by the
  // file's data pointer); the backend owns what it made. kRows: only read by rows (embed).
  enum class WeightUse { kMatmul, kRows };
  virtual Expected<Weight> prepare_weight(const Weight& file_weight,
                                          WeightUse use = WeightUse::kMatmul) = 0;
  // A constant fp32 vector (norm weights, biases) in backend memory, owned by the backend.
  // Null in, null out.
  virtual Expected<const float*> prepare_vector(const float* host, int64_t n) = 0;
  virtual Expected<const double*> prepare_doubles(const double* host, int64_t n) = 0;
  // Bytes prepared so far (weights and vectors), for the memory plan.
  virtual uint64_t prepared_bytes() const = 0;

  // Paged KV storage: bytes of one block over all layers, and the storage itself.
  virtual uint64_t kv_bytes_per_block(const KvSpec& spec) const = 0;
  virtual Expected<std::unique_ptr<KvCache>> create_kv(const KvSpec& spec, int32_t num_blocks) = 0;

  // Recurrent state storage (gated-delta-net layers): bytes of one slot over all layers, and
  // the storage itself.
  virtual uint64_t state_bytes_per_slot(const StateSpec& spec) const = 0;
  virtual Expected<std::unique_ptr<StateCache>> create_state(const StateSpec& spec,
                                                             int32_t num_slots) = 0;
  // Copies every layer's conv and SSM state of slot src to slot dst (prefix-cache snapshots),
  // ordered with the ops.
  virtual void state_copy(StateCache& st, int32_t src_slot, int32_t dst_slot) = 0;

  // Fixed buffers for the step's inputs, sized once; upload_step copies a step into them
  // (their addresses never change, so a captured graph reads the new values).
  virtual Status reserve_step(const StepCapacity& cap) = 0;
  virtual Expected<StepArgs> upload_step(const HostStep& step) = 0;

  // ---- step graphs ----
  // A backend that can record the ops of a step once and replay them (CUDA graphs). Between
  // begin_capture and end_capture ops are recorded, not run; a replay runs them again on the
  // values then in the step buffers and the arena (whose addresses never change).
  virtual bool supports_graphs() const { return false; }
  virtual Status begin_capture() { return err("{}: no step graphs", name()); }
  virtual Expected<int32_t> end_capture() { return err("{}: no step graphs", name()); }
  virtual void replay(int32_t graph) { (void)graph; }

  // ---- ops (shapes in the CPU reference ops, backend/cpu/ops.h) ----
  // out[t] = row tokens[t] of the table, dequantized: [n, table.n_in]
  virtual void embed(const Weight& table, const int32_t* tokens, Mat out) = 0;
  // y = x / rms(x) * w per row (w may be null); x and y may alias.
  virtual void rmsnorm(Mat x, const float* w, Mat y, float eps) = 0;
  // x += r, then y = rmsnorm(x) * w (the residual add fused with the next norm); y must not
  // alias x or r.
  virtual void add_rmsnorm(Mat x, Mat r, const float* w, Mat y, float eps) {
    add(x, r);
    rmsnorm(x, w, y, eps);
  }
  // out = (x - mean) / sqrt(var + eps) * w + b per row, var the biased variance (as
  // torch.nn.LayerNorm); w, b may be null (1, 0). out may alias x.
  virtual void layernorm(Mat x, const float* w, const float* b, Mat out, float eps) = 0;
  // x += y, then out = layernorm(x) * w + b (the post-norm residual: BERT's
  // x = LayerNorm(x + sublayer(x))). out may alias x or y.
  virtual void add_layernorm(Mat x, Mat y, const float* w, const float* b, Mat out, float eps) {
    add(x, y);
    layernorm(x, w, b, out, eps);
  }
  // y[t] = W x[t]: x [n, w.n_in], y [n, w.n_out]
  virtual void matmul(const Weight& w, Mat x, Mat y) = 0;
  // y_i = W_i x[t] for weights that share the input (q/k/v, gate/up; each W_i.n_in == x.cols):
  // matmul for each, by default; a backend may prepare x once for all of them.
  virtual void matmuls(std::span<const Weight* const> ws, Mat x, std::span<const Mat> ys) {
    for (size_t i = 0; i < ws.size(); ++i) matmul(*ws[i], x, ys[i]);
  }
  virtual void add_bias(Mat x, const float* b) = 0;    // x[t] += b
  virtual void add(Mat x, Mat y) = 0;                  // x += y
  virtual void scale(Mat x, float s) = 0;              // x *= s
  virtual void scale_rows(Mat x, const float* s) = 0;  // x[t] *= s[t]
  // x[t] += sigmoid(s[t]) * y[t] for s [n, 1]: the gated shared expert (qwen35moe, qwen3next).
  virtual void add_gated_rows(Mat x, Mat y, Mat s) = 0;
  virtual void softcap(Mat x, float cap) = 0;          // x = cap * tanh(x / cap)
  virtual void swiglu(Mat gate, Mat up, Mat out) = 0;  // out = silu(gate) * up
  virtual void geglu(Mat gate, Mat up, Mat out) = 0;   // out = gelu_tanh(gate) * up
  // out = 0.5 x (1 + erf(x / sqrt 2)), the exact GELU (BERT's "gelu"); out may alias x.
  virtual void gelu(Mat x, Mat out) = 0;
  // dst = columns [col0, col0 + dst.cols) of src (same rows)
  virtual void copy_cols(Mat src, int64_t col0, Mat dst) = 0;
  // dst[i] = src[rows[i]] for the dst.rows rows
  virtual void gather_rows(Mat src, const int32_t* rows, Mat dst) = 0;
  // out[r] = the index of row r's largest value, for x.rows rows (out: backend memory, int32):
  // the first on ties, a NaN never (a row whose first value is NaN, or all NaN, gives 0), as
  // cpu::argmax and the sampler's greedy choice.
  virtual void argmax_rows(Mat x, int32_t* out) = 0;
  // cos/sin [n, n_pairs] of the step's positions
  virtual void rope_angles(const RopeTable& t, const int32_t* positions, Mat cos, Mat sin) = 0;
  // Rotates the first 2 * cos.cols dims of each head of x [n, n_heads * head_dim] in place.
  virtual void rope_apply(Mat x, int32_t n_heads, int32_t head_dim, bool neox, Mat cos,
                          Mat sin) = 0;
  // rope_apply of q and of k (same rows, head_dim and tables), in one op where a backend can.
  virtual void rope_apply_qk(Mat q, int32_t n_heads_q, Mat k, int32_t n_heads_k, int32_t head_dim,
                             bool neox, Mat cos, Mat sin) {
    rope_apply(q, n_heads_q, head_dim, neox, cos, sin);
    rope_apply(k, n_heads_k, head_dim, neox, cos, sin);
  }
  // Writes K/V rows [n, n_kv_heads * head_dim] of layer `layer` at the step's positions.
  virtual void kv_write(KvCache& kv, int32_t layer, const StepArgs& step, Mat k, Mat v) = 0;
  // Per-head RMS norms of q and k before their rotation (qwen3, gemma3): weights [head_dim], or
  // null for none (both or neither).
  struct HeadNorms {
    const float* q = nullptr;
    const float* k = nullptr;
    float eps = 0.0f;
  };
  // rmsnorm of each head row of q and k (norms), rope_apply_qk, then kv_write of the rotated k
  // and v, in one op where a backend can.
  virtual void rope_kv_write(Mat q, int32_t n_heads_q, Mat k, int32_t n_heads_k, int32_t head_dim,
                             bool neox, Mat cos, Mat sin, KvCache& kv, int32_t layer,
                             const StepArgs& step, Mat v, const HeadNorms& norms) {
    head_rmsnorm(q, n_heads_q, k, n_heads_k, head_dim, norms);
    rope_apply_qk(q, n_heads_q, k, n_heads_k, head_dim, neox, cos, sin);
    kv_write(kv, layer, step, k, v);
  }
  // rope_kv_write's norms as two rmsnorm ops over the head rows of q and k (none when unset).
  void head_rmsnorm(Mat q, int32_t n_heads_q, Mat k, int32_t n_heads_k, int32_t head_dim,
                    const HeadNorms& norms) {
    if (norms.q == nullptr) return;
    const Mat qh = q.as(q.rows * n_heads_q, head_dim), kh = k.as(k.rows * n_heads_k, head_dim);
    rmsnorm(qh, norms.q, qh, norms.eps);
    rmsnorm(kh, norms.k, kh, norms.eps);
  }
  // Paged attention over the cache (after this step's writes): causal, or every key of the
  // sequence with p.causal false.
  virtual void attention(KvCache& kv, int32_t layer, const StepArgs& step, Mat q, Mat out,
                         const AttnParams& p) = 0;
  // ---- gated delta net (qwen35/qwen3next linear attention; cpu::gated_delta_rule_reference
  // holds the math). A sequence starts from a zero state (conv and SSM) when the position of
  // its first row in the step is 0, else from its slot's state (step.state_slots); both ops
  // write the updated state back to the slot.
  // Causal depthwise conv1d + SiLU over each sequence's rows of x [n, conv_dim] (rows of a
  // sequence contiguous and in order, per attn.qo_indptr): out[t][c] = silu(sum_j w[c][j] *
  // x[t - (conv_k - 1) + j][c]), the rows before the sequence's first taken from its conv
  // state. w [conv_dim, conv_k] row-major (GGUF ssm_conv1d, ne = {conv_k, conv_dim}). out must
  // not alias x.
  virtual void conv1d_silu(StateCache& st, int32_t layer, const StepArgs& step, Mat x,
                           const float* w, Mat out) = 0;
  // The gated delta rule, token by token per value head h: q, k L2-normalised (q then scaled
  // by 1 / sqrt(head_k_dim)), beta = sigmoid(beta_raw), g = ssm_a[h] * softplus(alpha[h] +
  // dt_bias[h]); S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q. qkv [n, conv_dim] (the
  // conv's output: q | k | v columns), alpha and beta [n, n_v_heads] raw projections, ssm_a
  // and dt_bias [n_v_heads]; out [n, n_v_heads * head_v_dim].
  virtual void gated_delta_rule(StateCache& st, int32_t layer, const StepArgs& step, Mat qkv,
                                Mat alpha, Mat beta, const float* ssm_a, const float* dt_bias,
                                Mat out, const DeltaParams& p) = 0;
  // out = x * sigmoid(gate) elementwise (the attention output gate of qwen35/qwen3next); out
  // may alias x.
  virtual void sigmoid_mul(Mat x, Mat gate, Mat out) = 0;
  // src rows are groups of 2 * width columns [a_0 b_0 a_1 b_1 ...] (width columns each): a
  // gets the a_i, b the b_i (qwen35's attn_q output interleaves each head's query and gate).
  virtual void deinterleave(Mat src, int64_t width, Mat a, Mat b) = 0;

  // out[t] = sum over the k chosen experts of weight * expert(xn[t]) (SwiGLU experts),
  // routing by softmax + top-k (ties to the lower index) with the weights renormalised.
  // With w.first_expert or stacked weights of fewer than n_expert matrices (a rank of an
  // expert-parallel mesh), only the chosen experts held (first_expert .. + n_mats) add theirs.
  virtual void moe(const MoeWeights& w, Mat xn, Mat out, const MoeScratch& s) = 0;

  // ---- device mesh (the multi-GPU issue; model/shard.h says what goes where) ----
  // This rank's communicators: tp joins the tensor-parallel ranks of its pipeline stage, pp
  // the stages of its tensor-parallel rank (null: a mesh of one that way). Set before the
  // forward is created; they outlive its use of them.
  // Whether this backend has the mesh ops below (the CPU's over threads, CUDA's over NCCL).
  virtual bool supports_mesh() const { return false; }
  // Makes the calling thread issue to this backend's device (a mesh runs each rank on a
  // thread of its own; CUDA: the thread's current device).
  virtual void bind_thread() {}
  void set_mesh(Collective* tp, Collective* pp) {
    tp_ = tp;
    pp_ = pp;
  }
  int tp_size() const { return tp_ != nullptr ? tp_->size() : 1; }
  // x = the sum over the tensor-parallel ranks of their x, in place; every rank gets the same
  // bits.
  virtual void all_reduce_sum(Mat x);
  // out [x.rows, tp_size() * x.cols]: tensor-parallel rank r's x in columns [r * x.cols,
  // (r + 1) * x.cols), by way of `gathered` [tp_size() * x.rows, x.cols] (the ranks' x one
  // after another).
  virtual void all_gather_cols(Mat x, Mat gathered, Mat out);
  // Pipeline: x to, or from, stage `stage` of this rank's pipeline.
  virtual void send(Mat x, int stage);
  virtual void recv(Mat x, int stage);
  // The first failure of a mesh op since the last take (a peer failed, timed out or aborted,
  // or the backend has no such ops), else OK.
  Status take_mesh_error() {
    Status s = std::move(mesh_error_);
    mesh_error_ = {};
    return s;
  }

 protected:
  // Records a mesh op's failure (the first one stays).
  void mesh_failed(const Status& s) {
    if (!s.ok() && mesh_error_.ok()) mesh_error_ = s;
  }
  Collective* tp_ = nullptr;
  Collective* pp_ = nullptr;
  Status mesh_error_;
  bool deterministic_ = false;
};

// Which device a command runs on: "cpu", "cuda", "cuda:N", or "auto" (cuda when a usable GPU
// is present and this build has CUDA, else cpu).
struct BackendOptions {
  std::string device = "auto";
  int threads = 0;             // CPU threads (0: physical cores)
  bool deterministic = false;  // Backend::set_deterministic
};

// Whether this build has the CUDA backend, and how many GPUs it sees.
bool cuda_compiled();
int cuda_device_count();
// Whether create_backend puts `device` on a GPU: "cuda", "cuda:N", or "auto" when a GPU is
// found (said before it is opened).
bool device_is_gpu(const std::string& device);

// What kiln doctor reports of the GPUs.
struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  uint64_t total_bytes = 0, free_bytes = 0;
};
struct CudaInfo {
  bool compiled = false;
  int driver_version = 0;  // 1000 * major + 10 * minor; 0 when no driver
  int runtime_version = 0;
  std::vector<GpuInfo> gpus;
  std::string error;  // why no GPU is listed, when none is
};
CudaInfo cuda_info();

Expected<std::unique_ptr<Backend>> create_backend(const BackendOptions& opts);

}  // namespace kiln::backend
