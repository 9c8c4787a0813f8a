#include "kiln/backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "kiln/backend/cuda/env.h"
#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/nccl.h"

namespace kiln::backend::cuda {
namespace {

// Errors of calls made at load (allocation, copies) become Status; a failing call inside a
// step is a broken device, reported by the next download/sync.
Status check(cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return {};
  cudaGetLastError();
  return err("cuda: {}: {}", what, cudaGetErrorString(e));
}

// KILN_CUDA_SKIP=norm,swiglu,rope,attn (any of them): those ops launch nothing (their outputs
// keep stale values, so the model's output is wrong). A profiling aid only: a step's time
// without an op's kernels is the most that fusing them away could save.
struct SkipOps {
  bool norm = false, swiglu = false, rope = false, attn = false;
};
const SkipOps& skip_ops() {
  static const SkipOps s = [] {
    SkipOps o;
    const char* e = std::getenv("KILN_CUDA_SKIP");
    const std::string_view v = e != nullptr ? e : "";
    o.norm = v.find("norm") != std::string_view::npos;
    o.swiglu = v.find("swiglu") != std::string_view::npos;
    o.rope = v.find("rope") != std::string_view::npos;
    o.attn = v.find("attn") != std::string_view::npos;
    if (!v.empty()) std::fprintf(stderr, "kiln: KILN_CUDA_SKIP=%s: timing only, output wrong\n", e);
    return o;
  }();
  return s;
}

class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(void* p, uint64_t bytes) : Buffer(p, bytes) {}
  ~DeviceBuffer() override { cudaFree(data_); }
};

class PinnedBuffer final : public Buffer {
 public:
  PinnedBuffer(void* p, uint64_t bytes) : Buffer(p, bytes) {}
  ~PinnedBuffer() override { cudaFreeHost(data_); }
};

Expected<void*> device_alloc(uint64_t bytes, std::string_view what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, std::max<uint64_t>(bytes, 256));
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return err("cuda: out of memory allocating {:.1f} MiB for {} ({:.1f} MiB free of {:.1f} MiB)",
               static_cast<double>(bytes) / (1 << 20), what,
               static_cast<double>(free_b) / (1 << 20), static_cast<double>(total_b) / (1 << 20));
  }
  return p;
}

class CudaKvCache final : public KvCache {
 public:
  CudaKvCache(const KvSpec& spec, int32_t num_blocks, const KvLayer& geometry, void* k, void* v)
      : KvCache(spec, num_blocks), geometry_(geometry), k_(k), v_(v) {}
  ~CudaKvCache() override {
    cudaFree(k_);
    cudaFree(v_);
  }
  KvLayer layer(int32_t il) const {
    KvLayer l = geometry_;
    l.k = static_cast<uint8_t*>(k_) + static_cast<size_t>(il) * num_blocks_ * l.k_block_bytes;
    l.v = static_cast<uint8_t*>(v_) + static_cast<size_t>(il) * num_blocks_ * l.v_block_bytes;
    return l;
  }
  void read(bool is_k, int32_t layer_index, int32_t block, int32_t in_block, int32_t kvh,
            float* out) const override {
    cudaDeviceSynchronize();
    kv_read(layer(layer_index), is_k, block, in_block, kvh, out);
  }

 private:
  KvLayer geometry_;
  void* k_ = nullptr;
  void* v_ = nullptr;
};

// The recurrent state on the device: one block of floats per slot, per layer its conv state
// then its SSM state (DeltaLayer, kernels.h), so state_copy is one copy.
class CudaStateCache final : public StateCache {
 public:
  CudaStateCache(const StateSpec& spec, int32_t num_slots, float* values)
      : StateCache(spec, num_slots), values_(values) {}
  ~CudaStateCache() override { cudaFree(values_); }
  static int64_t layer_values(const StateSpec& s) { return s.conv_values() + s.ssm_values(); }
  static int64_t slot_values(const StateSpec& s) { return s.n_layer * layer_values(s); }
  float* slot(int32_t i) const { return values_ + static_cast<size_t>(i) * slot_values(spec_); }
  DeltaLayer layer(int32_t il) const {
    KILN_ASSERT(il >= 0 && il < spec_.n_layer);
    DeltaLayer l;
    l.conv = values_ + il * layer_values(spec_);
    l.ssm = l.conv + spec_.conv_values();
    l.slot_stride = slot_values(spec_);
    l.conv_dim = spec_.conv_dim;
    l.conv_k = spec_.conv_k;
    return l;
  }
  void read_conv(int32_t il, int32_t s, float* out) const override {
    copy(out, part(il, s, false), spec_.conv_values(), cudaMemcpyDeviceToHost);
  }
  void read_ssm(int32_t il, int32_t s, float* out) const override {
    copy(out, part(il, s, true), spec_.ssm_values(), cudaMemcpyDeviceToHost);
  }
  void write_conv(int32_t il, int32_t s, const float* in) override {
    copy(part(il, s, false), in, spec_.conv_values(), cudaMemcpyHostToDevice);
  }
  void write_ssm(int32_t il, int32_t s, const float* in) override {
    copy(part(il, s, true), in, spec_.ssm_values(), cudaMemcpyHostToDevice);
  }

 private:
  float* part(int32_t il, int32_t s, bool ssm) const {
    KILN_ASSERT(il >= 0 && il < spec_.n_layer && s >= 0 && s < num_slots_);
    float* base = slot(s) + il * layer_values(spec_);
    return ssm ? base + spec_.conv_values() : base;
  }
  // After every op issued on any stream (the backend's stream is non-blocking).
  static void copy(void* dst, const void* src, int64_t n, cudaMemcpyKind kind) {
    cudaDeviceSynchronize();
    cudaMemcpy(dst, src, static_cast<size_t>(n) * sizeof(float), kind);
  }
  float* values_ = nullptr;  // [num_slots][n_layer][conv | ssm]
};

// Largest expert count per token the MoE op supports (its identity row buffer).
constexpr int64_t kMaxExpertsUsed = 32;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  ~CudaBackend() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    for (cudaGraphExec_t g : graphs_) cudaGraphExecDestroy(g);
    if (matmul_ != nullptr) destroy_matmul_context(matmul_);
    for (void* p : owned_) cudaFree(p);
    if (staging_ != nullptr) cudaFreeHost(staging_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status init() {
    KILN_TRY_STATUS(check(cudaSetDevice(device_), "set device"));
    KILN_TRY_STATUS(check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream"));
    KILN_TRY_STATUS(check(cudaGetDeviceProperties(&props_, device_), "device properties"));
    return {};
  }

  std::string name() const override { return fmt::format("cuda:{}", device_); }
  std::string description() const override {
    const DeviceMemory m = memory();
    return fmt::format("cuda:{}: {}, compute capability {}.{}, {} SMs, {:.0f} MiB ({:.0f} free)",
                       device_, props_.name, props_.major, props_.minor, props_.multiProcessorCount,
                       static_cast<double>(m.total_bytes) / (1 << 20),
                       static_cast<double>(m.free_bytes) / (1 << 20));
  }
  DeviceMemory memory() const override {
    size_t free_b = 0, total_b = 0;
    cudaSetDevice(device_);
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) cudaGetLastError();
    return {total_b, free_b};
  }

  // ---- mesh ops over NCCL (nccl.h), on the stream in order with the kernels ----
  bool supports_mesh() const override { return true; }
  void bind_thread() override { cudaSetDevice(device_); }
  void all_reduce_sum(Mat x) override {
    if (tp_ != nullptr) mesh_failed(nccl_all_reduce_sum(tp_, x.data, x.size(), stream_));
  }
  void all_gather_cols(Mat x, Mat gathered, Mat out) override {
    if (tp_ == nullptr)
      return copy(out.data, x.data, static_cast<uint64_t>(x.size()) * sizeof(float));
    const Status st = nccl_all_gather(tp_, x.data, x.size(), gathered.data, stream_);
    mesh_failed(st);
    if (!st.ok()) return;
    const size_t row = static_cast<size_t>(x.cols) * sizeof(float);
    for (int r = 0; r < tp_size(); ++r)  // rank r's rows into its columns
      cudaMemcpy2DAsync(out.data + r * x.cols, static_cast<size_t>(out.cols) * sizeof(float),
                        gathered.data + r * x.size(), row, row, static_cast<size_t>(x.rows),
                        cudaMemcpyDeviceToDevice, stream_);
  }
  void send(Mat x, int stage) override {
    if (pp_ == nullptr) return mesh_failed(err("{}: send without a pipeline", name()));
    mesh_failed(
        nccl_send(pp_, x.data, static_cast<uint64_t>(x.size()) * sizeof(float), stage, stream_));
  }
  void recv(Mat x, int stage) override {
    if (pp_ == nullptr) return mesh_failed(err("{}: recv without a pipeline", name()));
    mesh_failed(
        nccl_recv(pp_, x.data, static_cast<uint64_t>(x.size()) * sizeof(float), stage, stream_));
  }

  Expected<std::unique_ptr<Buffer>> alloc(uint64_t bytes) override {
    KILN_TRY(void* p, device_alloc(bytes, "activations"));
    return std::unique_ptr<Buffer>(new DeviceBuffer(p, bytes));
  }
  Expected<std::unique_ptr<Buffer>> alloc_host(uint64_t bytes) override {
    void* p = nullptr;
    KILN_TRY_STATUS(check(cudaMallocHost(&p, std::max<uint64_t>(bytes, 256)), "pinned memory"));
    return std::unique_ptr<Buffer>(new PinnedBuffer(p, bytes));
  }
  void upload(void* dst, const void* host_src, uint64_t bytes) override {
    if (bytes > 0) cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_);
  }
  void download(void* host_dst, const void* src, uint64_t bytes) override {
    if (bytes > 0) cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_);
    sync();
  }
  void download_async(void* host_dst, const void* src, uint64_t bytes) override {
    if (bytes > 0) cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_);
  }
  void copy(void* dst, const void* src, uint64_t bytes) override {
    if (bytes == 0) return;
    const int ev = profile_begin();
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_);
    profile_end(ev, bytes, [] { return std::string("copy"); });
  }
  void sync() override {
    const cudaError_t e = cudaStreamSynchronize(stream_);
    // A kernel fault is sticky: the device cannot go on. On a mesh the rank fails (the mesh
    // then serves no more, and says so); alone, say so loudly rather than return wrong numbers.
    if (e != cudaSuccess && (tp_ != nullptr || pp_ != nullptr)) {
      mesh_failed(err("cuda:{}: the device failed: {}", device_, cudaGetErrorString(e)));
      return;
    }
    if (e != cudaSuccess) {
      std::fprintf(stderr, "kiln: the CUDA device failed: %s\n", cudaGetErrorString(e));
      std::abort();
    }
  }

  Expected<Weight> prepare_weight(const Weight& fw, WeightUse use) override {
    if (fw.empty()) return fw;
    const auto key = std::make_pair(fw.data, fw.n_out * fw.n_mats);
    auto it = weights_.find(key);
    if (it != weights_.end()) return it->second;
    if (!supports_type(fw.type))
      return err("cuda: no kernels for weight type {}", quant::type_name(fw.type));
    const uint64_t bytes = fw.total_bytes();
    KILN_TRY(void* p, device_alloc(bytes, "weights"));
    owned_.push_back(p);
    KILN_TRY_STATUS(check(cudaMemcpy(p, fw.data, bytes, cudaMemcpyHostToDevice), "upload"));
    Weight w = fw;
    w.data = static_cast<const uint8_t*>(p);
    w.prepared = nullptr;
    prepared_bytes_ += bytes;
    max_n_in_ = std::max(max_n_in_, w.n_in);
    max_n_out_ = std::max(max_n_out_, w.n_out);
    max_experts_ = std::max(max_experts_, w.n_mats);
    if (w.n_mats <= 1 && cuda::matvec_supports(w)) int8_matvec_weights_ = true;
    KILN_TRY_STATUS(add_f16_copy(&w, use));
    weights_[key] = w;
    return w;
  }
  // fp16 copies (default; KILN_CUDA_F16_WEIGHTS=0 turns them off): each quantized matmul weight
  // is also kept dequantized to fp16 (Weight::prepared), which the cuBLAS path (prefill chunks,
  // and short weights in large batches) multiplies in place instead of dequantizing it chunk by
  // chunk every step (a third of a 512-token prefill step on an 8B Q4_K_M model: pp512 +61% on
  // the H200, docs/performance.md); decode keeps reading the quantized rows. Not the embedding
  // table (gathered by rows), stacked experts, nor vocabulary-sized heads (over 65,536 rows: a
  // prefill wants the logits of a few rows). Only while the copies stay within a quarter of the
  // device memory free when the first weight is prepared (in preparation order: a model too
  // large for that gets copies for its first layers only), the rest left to the KV cache.
  Status add_f16_copy(Weight* w, WeightUse use) {
    static const bool on = !env_is("KILN_CUDA_F16_WEIGHTS", "0");
    if (!on || use != WeightUse::kMatmul || w->n_mats > 1 || w->n_out > 65536 ||
        w->type == quant::Type::F16 || w->type == quant::Type::F32)
      return {};
    const uint64_t bytes = static_cast<uint64_t>(w->n_out) * static_cast<uint64_t>(w->n_in) * 2;
    if (!f16_budget_) f16_budget_ = memory().free_bytes / 4;
    if (f16_copy_bytes_ + bytes > *f16_budget_) return {};
    Expected<void*> copy = device_alloc(bytes, "an fp16 copy of a weight");
    if (!copy.ok()) return {};  // out of memory: no copy, the chunked path
    void* p = *copy;
    owned_.push_back(p);
    cuda::dequantize_rows_f16(*w, 0, w->n_out, static_cast<uint16_t*>(p), stream_);
    KILN_TRY_STATUS(check(cudaStreamSynchronize(stream_), "fp16 copy of a weight"));
    w->prepared = p;
    prepared_bytes_ += bytes;
    f16_copy_bytes_ += bytes;
    return {};
  }
  Expected<const float*> prepare_vector(const float* host, int64_t n) override {
    if (host == nullptr) return static_cast<const float*>(nullptr);
    KILN_TRY(void* p, upload_owned(host, static_cast<uint64_t>(n) * sizeof(float)));
    return static_cast<const float*>(p);
  }
  Expected<const double*> prepare_doubles(const double* host, int64_t n) override {
    if (host == nullptr) return static_cast<const double*>(nullptr);
    KILN_TRY(void* p, upload_owned(host, static_cast<uint64_t>(n) * sizeof(double)));
    return static_cast<const double*>(p);
  }
  uint64_t prepared_bytes() const override { return prepared_bytes_; }

  uint64_t kv_bytes_per_block(const KvSpec& s) const override {
    if (!kv_spec_ok(s).ok()) return 0;
    return static_cast<uint64_t>(s.n_layer) *
           static_cast<uint64_t>(
               kv_block_bytes(s.type, s.block_tokens, s.n_kv_heads, s.head_dim_k) +
               kv_block_bytes(s.type, s.block_tokens, s.n_kv_heads, s.head_dim_v));
  }
  Expected<std::unique_ptr<KvCache>> create_kv(const KvSpec& s, int32_t num_blocks) override {
    KILN_TRY_STATUS(kv_spec_ok(s));
    if (num_blocks <= 0) return err("kv: {} blocks is not a cache size", num_blocks);
    const KvLayer g = make_kv_layer(s.type, nullptr, nullptr, s.block_tokens, s.n_kv_heads,
                                    s.head_dim_k, s.head_dim_v);
    const uint64_t kb = static_cast<uint64_t>(g.k_block_bytes) * s.n_layer * num_blocks;
    const uint64_t vb = static_cast<uint64_t>(g.v_block_bytes) * s.n_layer * num_blocks;
    KILN_TRY(void* k, device_alloc(kb, "the KV cache (K)"));
    auto v = device_alloc(vb, "the KV cache (V)");
    if (!v.ok()) {
      cudaFree(k);
      return std::move(v).take_error();
    }
    // Zero bytes are 0.0 in every type (an f16 scale of 0 with zero quants for Q8_0).
    cudaMemset(k, 0, kb);
    cudaMemset(*v, 0, vb);
    KILN_TRY_STATUS(check(cudaDeviceSynchronize(), "clear the KV cache"));
    return std::unique_ptr<KvCache>(new CudaKvCache(s, num_blocks, g, k, *v));
  }

  uint64_t state_bytes_per_slot(const StateSpec& s) const override {
    if (!state_spec_ok(s).ok()) return 0;
    return static_cast<uint64_t>(CudaStateCache::slot_values(s)) * sizeof(float);
  }
  Expected<std::unique_ptr<StateCache>> create_state(const StateSpec& s,
                                                     int32_t num_slots) override {
    KILN_TRY_STATUS(state_spec_ok(s));
    if (num_slots <= 0) return err("state: {} slots is not a state pool size", num_slots);
    const uint64_t bytes = state_bytes_per_slot(s) * static_cast<uint64_t>(num_slots);
    KILN_TRY(void* p, device_alloc(bytes, "the recurrent state"));
    cudaMemset(p, 0, bytes);
    if (Status st = check(cudaDeviceSynchronize(), "clear the recurrent state"); !st.ok()) {
      cudaFree(p);
      return std::move(st).take_error();
    }
    return std::unique_ptr<StateCache>(new CudaStateCache(s, num_slots, static_cast<float*>(p)));
  }
  void state_copy(StateCache& st, int32_t src_slot, int32_t dst_slot) override {
    const auto& c = static_cast<CudaStateCache&>(st);
    KILN_ASSERT(src_slot >= 0 && src_slot < c.num_slots() && dst_slot >= 0 &&
                dst_slot < c.num_slots());
    if (src_slot == dst_slot) return;
    cudaMemcpyAsync(c.slot(dst_slot), c.slot(src_slot),
                    static_cast<size_t>(CudaStateCache::slot_values(c.spec())) * sizeof(float),
                    cudaMemcpyDeviceToDevice, stream_);
  }

  Status reserve_step(const StepCapacity& cap) override {
    if (cap.max_tokens <= step_cap_.max_tokens && cap.max_kv_indices <= step_cap_.max_kv_indices)
      return {};
    if (staging_ != nullptr) {
      // Grown: the old buffers stay owned (freed with the backend); graphs are rebuilt.
      cudaFreeHost(staging_);
      staging_ = nullptr;
    }
    step_cap_ = cap;
    const int64_t t = cap.max_tokens;
    // Layout (int32 words): tokens, positions, qo_indptr, kv_indptr, kv_len, logit_rows,
    // row_scale (float), state_slots, kv_indices. Per-sequence arrays are sized by max_tokens
    // (upload_step refuses more sequences than that).
    off_tokens_ = 0;
    off_positions_ = off_tokens_ + t;
    off_qo_ = off_positions_ + t;
    off_kvptr_ = off_qo_ + t + 1;
    off_kvlen_ = off_kvptr_ + t + 1;
    off_rows_ = off_kvlen_ + t;
    off_scale_ = off_rows_ + t;
    off_slots_ = off_scale_ + t;
    off_indices_ = off_slots_ + t;
    step_words_ = off_indices_ + cap.max_kv_indices;
    KILN_TRY(void* d, device_alloc(static_cast<uint64_t>(step_words_) * 4, "step inputs"));
    owned_.push_back(d);
    step_dev_ = static_cast<int32_t*>(d);
    KILN_TRY_STATUS(check(cudaMallocHost(&staging_, static_cast<uint64_t>(step_words_) * 4),
                          "pinned step staging"));
    // Identity rows for the MoE down projection (pair p reads row p).
    std::vector<int32_t> iota(static_cast<size_t>(t * kMaxExpertsUsed));
    for (size_t i = 0; i < iota.size(); ++i) iota[i] = static_cast<int32_t>(i);
    KILN_TRY(void* ip, upload_owned(iota.data(), iota.size() * 4));
    iota_ = static_cast<const int32_t*>(ip);
    // moe_route's ticket (0 between launches).
    const uint32_t zero = 0;
    KILN_TRY(void* cp, upload_owned(&zero, sizeof zero));
    moe_counter_ = static_cast<uint32_t*>(cp);
    if (attn_workspace_ == nullptr && cap.n_heads > 0) {
      // Split-K scratch of the decode attention (long contexts over several CTAs).
      attn_workspace_bytes_ =
          attention_workspace_bytes(cap.n_heads, cap.head_dim_v, deterministic());
      KILN_TRY(attn_workspace_, device_alloc(attn_workspace_bytes_, "attention scratch"));
      owned_.push_back(attn_workspace_);
      KILN_TRY_STATUS(
          check(cudaMemset(attn_workspace_, 0, static_cast<size_t>(attn_workspace_bytes_)),
                "clear attention scratch"));
    }
    if (matmul_ == nullptr) {
      // The matmul's scratch for the largest weight prepared so far.
      matmul_ = create_matmul_context(
          t, std::max<int64_t>(max_n_in_, 1), std::max<int64_t>(max_n_out_, 1),
          max_experts_ > 1 ? t * kMaxExpertsUsed : 0, max_experts_ > 1 ? max_experts_ : 0);
      if (matmul_ == nullptr) return err("cuda: could not create the matmul context (cuBLAS)");
      matmul_set_deterministic(matmul_, deterministic());
      prepared_bytes_ += matmul_context_bytes(matmul_);
    }
    return {};
  }

  Expected<StepArgs> upload_step(const HostStep& h) override {
    const AttnBatch& a = h.attn;
    const int64_t n = static_cast<int64_t>(h.tokens.size());
    const int64_t n_idx = a.num_seqs > 0 ? a.kv_indptr[a.num_seqs] : 0;
    if (n > step_cap_.max_tokens || a.num_seqs > step_cap_.max_tokens ||
        n_idx > step_cap_.max_kv_indices ||
        static_cast<int64_t>(h.logit_rows.size()) > step_cap_.max_tokens)
      return err("cuda: the step ({} tokens, {} sequences, {} blocks) exceeds the step buffers", n,
                 a.num_seqs, n_idx);
    if (!h.state_slots.empty() && h.state_slots.size() != static_cast<size_t>(a.num_seqs))
      return err("cuda: {} state slots for {} sequences", h.state_slots.size(), a.num_seqs);
    auto* w = static_cast<int32_t*>(staging_);
    std::memcpy(w + off_tokens_, h.tokens.data(), n * 4);
    std::memcpy(w + off_positions_, a.positions, n * 4);
    std::memcpy(w + off_qo_, a.qo_indptr, (a.num_seqs + 1) * 4);
    std::memcpy(w + off_kvptr_, a.kv_indptr, (a.num_seqs + 1) * 4);
    std::memcpy(w + off_kvlen_, a.kv_len, a.num_seqs * 4);
    std::memcpy(w + off_rows_, h.logit_rows.data(), h.logit_rows.size() * 4);
    if (!h.row_scale.empty()) std::memcpy(w + off_scale_, h.row_scale.data(), n * 4);
    if (!h.state_slots.empty())
      std::memcpy(w + off_slots_, h.state_slots.data(), h.state_slots.size() * 4);
    std::memcpy(w + off_indices_, a.kv_indices, n_idx * 4);
    // One copy: the staging words up to the last kv index used.
    cudaMemcpyAsync(step_dev_, staging_, static_cast<uint64_t>(off_indices_ + n_idx) * 4,
                    cudaMemcpyHostToDevice, stream_);
    StepArgs s;
    s.n_tokens = n;
    s.n_logit_rows = static_cast<int64_t>(h.logit_rows.size());
    for (int32_t i = 0; i < a.num_seqs; ++i)
      s.max_q_len = std::max(s.max_q_len, a.qo_indptr[i + 1] - a.qo_indptr[i]);
    s.tokens = step_dev_ + off_tokens_;
    s.attn.num_seqs = a.num_seqs;
    s.attn.positions = step_dev_ + off_positions_;
    s.attn.qo_indptr = step_dev_ + off_qo_;
    s.attn.kv_indptr = step_dev_ + off_kvptr_;
    s.attn.kv_len = step_dev_ + off_kvlen_;
    s.attn.kv_indices = step_dev_ + off_indices_;
    s.logit_rows = step_dev_ + off_rows_;
    s.row_scale =
        h.row_scale.empty() ? nullptr : reinterpret_cast<const float*>(step_dev_ + off_scale_);
    s.state_slots = h.state_slots.empty() ? nullptr : step_dev_ + off_slots_;
    return s;
  }

  // ---- graphs ----
  bool supports_graphs() const override { return true; }
  bool asynchronous() const override { return true; }
  Status begin_capture() override {
    KILN_TRY_STATUS(check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                          "begin graph capture"));
    capturing_ = true;
    return {};
  }
  Expected<int32_t> end_capture() override {
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    KILN_TRY_STATUS(check(cudaStreamEndCapture(stream_, &graph), "end graph capture"));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    KILN_TRY_STATUS(check(e, "instantiate graph"));
    graphs_.push_back(exec);
    return static_cast<int32_t>(graphs_.size() - 1);
  }
  void replay(int32_t graph) override { cudaGraphLaunch(graphs_.at(graph), stream_); }

  // ---- ops ----
  void embed(const Weight& table, const int32_t* tokens, Mat out) override {
    forget_q8();
    cuda::embed(table, tokens, out.rows, out.data, stream_);
  }
  void rmsnorm(Mat x, const float* w, Mat y, float eps) override {
    const Q8Target t = q8_target(y);
    if (skip_ops().norm) return produced_q8(y, t.xq != nullptr);
    produced_q8(y, cuda::rmsnorm(x.data, w, y.data, x.rows, x.cols, eps, stream_, t.xq, t.xds));
  }
  void layernorm(Mat x, const float* w, const float* b, Mat out, float eps) override {
    forget_q8();
    KILN_ASSERT(out.rows == x.rows && out.cols == x.cols);
    cuda::layernorm(x.data, w, b, out.data, x.rows, x.cols, eps, stream_);
  }
  void add_layernorm(Mat x, Mat y, const float* w, const float* b, Mat out, float eps) override {
    forget_q8();
    KILN_ASSERT(y.rows == x.rows && y.cols == x.cols && out.rows == x.rows && out.cols == x.cols);
    cuda::add_layernorm(x.data, y.data, w, b, out.data, x.rows, x.cols, eps, stream_);
  }
  void add_rmsnorm(Mat x, Mat r, const float* w, Mat y, float eps) override {
    KILN_ASSERT(r.rows == x.rows && r.cols == x.cols && y.rows == x.rows && y.cols == x.cols);
    const Q8Target t = q8_target(y);
    if (skip_ops().norm) return produced_q8(y, t.xq != nullptr);
    produced_q8(
        y, cuda::add_rmsnorm(x.data, r.data, w, y.data, x.rows, x.cols, eps, stream_, t.xq, t.xds));
  }
  void matmul(const Weight& w, Mat x, Mat y) override {
    KILN_ASSERT(x.cols == w.n_in && y.cols == w.n_out && x.rows == y.rows);
    const Weight* ws[1] = {&w};
    float* ys[1] = {y.data};
    const int ev = profile_begin();
    consumed_q8(x, cuda::matmul_shared(matmul_, ws, ys, 1, x.data, x.rows, stream_, holds_q8(x)));
    profile_end(ev, w.total_bytes(), [&] { return matmul_label(w); });
  }
  void matmuls(std::span<const Weight* const> ws, Mat x, std::span<const Mat> ys) override {
    KILN_ASSERT(ws.size() == ys.size() && ws.size() <= 8);
    float* yp[8];
    for (size_t i = 0; i < ws.size(); ++i) {
      KILN_ASSERT(x.cols == ws[i]->n_in && ys[i].cols == ws[i]->n_out && x.rows == ys[i].rows);
      yp[i] = ys[i].data;
    }
    const int ev = profile_begin();
    consumed_q8(x, cuda::matmul_shared(matmul_, ws.data(), yp, static_cast<int>(ws.size()), x.data,
                                       x.rows, stream_, holds_q8(x)));
    if (ev >= 0) {
      uint64_t bytes = 0;
      for (const Weight* w : ws) bytes += w->total_bytes();
      profile_end(ev, bytes, [&] { return matmuls_label(ws); });
    }
  }
  void add_bias(Mat x, const float* b) override {
    forget_q8();
    cuda::add_bias(x.data, b, x.rows, x.cols, stream_);
  }
  void add(Mat x, Mat y) override {
    forget_q8();
    cuda::add(x.data, y.data, x.size(), stream_);
  }
  void scale(Mat x, float s) override {
    forget_q8();
    cuda::scale(x.data, s, x.size(), stream_);
  }
  void scale_rows(Mat x, const float* s) override {
    forget_q8();
    cuda::scale_rows(x.data, s, x.rows, x.cols, stream_);
  }
  void add_gated_rows(Mat x, Mat y, Mat s) override {
    forget_q8();
    KILN_ASSERT(y.rows == x.rows && y.cols == x.cols && s.rows >= x.rows && s.cols == 1);
    cuda::add_gated_rows(x.data, y.data, s.data, x.rows, x.cols, stream_);
  }
  void softcap(Mat x, float cap) override {
    forget_q8();
    cuda::softcap(x.data, cap, x.size(), stream_);
  }
  void swiglu(Mat gate, Mat up, Mat out) override {
    const Q8Target t = q8_target(out);
    if (skip_ops().swiglu) return produced_q8(out, t.xq != nullptr);
    if (t.xq == nullptr) {
      forget_q8();
      cuda::swiglu(gate.data, up.data, out.data, gate.size(), stream_);
      return;
    }
    produced_q8(out,
                cuda::swiglu_q8(gate.data, up.data, out.data, gate.size(), t.xq, t.xds, stream_));
  }
  void geglu(Mat gate, Mat up, Mat out) override {
    forget_q8();
    cuda::geglu(gate.data, up.data, out.data, gate.size(), stream_);
  }
  void gelu(Mat x, Mat out) override {
    forget_q8();
    KILN_ASSERT(out.size() == x.size());
    cuda::gelu(x.data, out.data, x.size(), stream_);
  }
  void copy_cols(Mat src, int64_t col0, Mat dst) override {
    forget_q8();
    cuda::copy_cols(src.data, src.cols, col0, dst.data, dst.cols, dst.rows, stream_);
  }
  void gather_rows(Mat src, const int32_t* rows, Mat dst) override {
    forget_q8();
    cuda::gather_rows(src.data, rows, dst.data, dst.rows, dst.cols, stream_);
  }
  void argmax_rows(Mat x, int32_t* out) override {
    forget_q8();
    cuda::argmax_rows(x.data, x.rows, x.cols, out, stream_);
  }
  void rope_angles(const RopeTable& t, const int32_t* positions, Mat cos, Mat sin) override {
    forget_q8();
    cuda::rope_angles(t.inv_freq, t.n_pairs, positions, cos.rows, t.attn_factor, cos.data, sin.data,
                      stream_);
  }
  void rope_apply_qk(Mat q, int32_t n_heads_q, Mat k, int32_t n_heads_k, int32_t head_dim,
                     bool neox, Mat cos, Mat sin) override {
    forget_q8();
    KILN_ASSERT(q.rows == k.rows);
    cuda::rope_apply2(q.data, n_heads_q, k.data, n_heads_k, q.rows, head_dim,
                      static_cast<int32_t>(cos.cols), neox, cos.data, sin.data, stream_);
  }
  void rope_apply(Mat x, int32_t n_heads, int32_t head_dim, bool neox, Mat cos, Mat sin) override {
    forget_q8();
    cuda::rope_apply(x.data, x.rows, n_heads, head_dim, static_cast<int32_t>(cos.cols), neox,
                     cos.data, sin.data, stream_);
  }
  void kv_write(KvCache& kv, int32_t layer, const StepArgs& step, Mat k, Mat v) override {
    forget_q8();
    cuda::kv_write(static_cast<CudaKvCache&>(kv).layer(layer), step.attn, step.n_tokens, k.data,
                   v.data, stream_);
  }
  void rope_kv_write(Mat q, int32_t n_heads_q, Mat k, int32_t n_heads_k, int32_t head_dim,
                     bool neox, Mat cos, Mat sin, KvCache& kv, int32_t layer, const StepArgs& step,
                     Mat v, const HeadNorms& norms) override {
    const cuda::KvLayer& l = static_cast<CudaKvCache&>(kv).layer(layer);
    if (head_dim != l.head_dim_k || n_heads_k != l.n_kv_heads || q.rows != step.n_tokens ||
        k.rows != step.n_tokens) {
      Backend::rope_kv_write(q, n_heads_q, k, n_heads_k, head_dim, neox, cos, sin, kv, layer, step,
                             v, norms);
      return;
    }
    // The head norms in the same launch where the kernel can (else as their own rmsnorm ops;
    // KILN_CUDA_FUSE_QK_NORM=0 for comparisons).
    static const bool fuse_norms = !env_is("KILN_CUDA_FUSE_QK_NORM", "0");
    HeadNorms fused;
    if (norms.q != nullptr && fuse_norms &&
        cuda::rope_kv_write_norms_fuse(l, q.data, k.data, norms.q, norms.k)) {
      fused = norms;
    } else {
      head_rmsnorm(q, n_heads_q, k, n_heads_k, head_dim, norms);
    }
    forget_q8();
    if (skip_ops().rope) return;
    cuda::rope_kv_write(l, step.attn, step.n_tokens, q.data, n_heads_q, k.data, v.data,
                        static_cast<int32_t>(cos.cols), neox, cos.data, sin.data, stream_, fused.q,
                        fused.k, fused.eps);
  }
  void attention(KvCache& kv, int32_t layer, const StepArgs& step, Mat q, Mat out,
                 const backend::AttnParams& p) override {
    const Q8Target t = q8_target(out);
    if (skip_ops().attn) return produced_q8(out, t.xq != nullptr);
    cuda::AttnParams cp;
    cp.n_heads = p.n_heads;
    cp.scale = p.scale;
    cp.softcap = p.softcap;
    cp.sliding_window = p.sliding_window;
    cp.causal = p.causal;
    cp.workspace = attn_workspace_;
    cp.workspace_bytes = attn_workspace_bytes_;
    cp.xq = t.xq;
    cp.xds = t.xds;
    cp.deterministic = deterministic();
    const int ev = profile_begin();
    produced_q8(out, cuda::attention(static_cast<CudaKvCache&>(kv).layer(layer), step.attn,
                                     step.n_tokens, step.max_q_len, q.data, out.data, cp, stream_));
    profile_end(ev, 0, [] { return std::string("attention"); });
  }
  void moe(const MoeWeights& w, Mat xn, Mat out, const MoeScratch& s) override {
    // The norm before may have left xn quantized in the matmul rows (the router, an F32 or int8
    // matmul, does not change them: it writes the same levels if it quantizes xn itself).
    const bool xn_held = holds_q8(xn);
    forget_q8();
    const int64_t n = xn.rows, k = w.n_expert_used, pairs = n * k;
    KILN_ASSERT(k <= kMaxExpertsUsed);
    const int ev = profile_begin();
    const Mat router = s.router.as(n, w.n_expert);
    const int32_t experts = static_cast<int32_t>(w.gate_exps->n_mats);
    // gate and up read the same token rows: the norm's int8 rows when it left them, else
    // quantized once (by the first matmul_id, or here for the fused decode form).
    cuda::MatmulQ8 held = xn_held ? cuda::matmul_q8(matmul_) : cuda::MatmulQ8{};
    // A decode step's fused form (moe_decode.cu): router + top-k, gate + up, down + combine in
    // one launch each, where matmul_id takes its few-pair int8 form for both (the same bits).
    const bool fuse = moe_fuse_ && !deterministic() && n <= cuda::kMatvecMaxTokens &&
                      cuda::matmul_id_few(matmul_, *w.gate_exps, experts, n, pairs) &&
                      cuda::matmul_id_few(matmul_, *w.down_exps, experts, pairs, pairs);
    if (fuse && held.xq == nullptr) {
      const cuda::MatmulQ8 q = cuda::matmul_id_q8(matmul_, n, xn.cols);
      if (q.xq != nullptr) {
        cuda::quantize_q8_32(xn.data, n, xn.cols, q.xq, q.xds, stream_);
        held = q;
      }
    }
    const bool fused = fuse && held.xq != nullptr;
    const bool routed = fused && cuda::moe_route(*w.router, xn.data, held.xq, held.xds, n,
                                                 static_cast<int32_t>(k), router.data, s.chosen,
                                                 s.weights.data, s.x_rows, moe_counter_, stream_);
    if (!routed) {
      cuda::matmul(matmul_, *w.router, xn.data, router.data, n, stream_);
      cuda::moe_topk(router.data, n, w.n_expert, static_cast<int32_t>(k), s.chosen, s.weights.data,
                     s.x_rows, stream_);
    }
    // An expert-parallel rank: the pairs of others' experts run on its expert 0 with weight 0
    // (computed, adding nothing; a grouped kernel that skips them is left for when a GPU mesh
    // can be measured).
    if (experts < w.n_expert)
      cuda::moe_localize(s.chosen, s.weights.data, pairs, w.first_expert, experts, stream_);
    // The activation quantized for the down projection as it is written (swiglu_q8).
    const cuda::MatmulQ8 down_q = cuda::matmul_id_q8(matmul_, pairs, w.n_ff);
    bool act_q8 = false;
    const bool paired =
        fused && cuda::matvec_id_pair(*w.gate_exps, *w.up_exps, experts, held.xq, held.xds,
                                      s.x_rows, s.chosen, s.gate.data, s.up.data, pairs, stream_);
    if (!paired) {
      const bool xn_q8 =
          cuda::matmul_id(matmul_, *w.gate_exps, experts, xn.data, n, s.x_rows, s.chosen,
                          s.gate.data, pairs, stream_, false, held.xq, held.xds);
      cuda::matmul_id(matmul_, *w.up_exps, experts, xn.data, n, s.x_rows, s.chosen, s.up.data,
                      pairs, stream_, xn_q8, held.xq, held.xds);
    }
    if (down_q.xq != nullptr && w.n_ff % 32 == 0 && !deterministic()) {  // groups of 32 a row
      act_q8 = cuda::swiglu_q8(s.gate.data, s.up.data, s.gate.data, pairs * w.n_ff, down_q.xq,
                               down_q.xds, stream_);
    } else {
      cuda::swiglu(s.gate.data, s.up.data, s.gate.data, pairs * w.n_ff, stream_);
    }
    const bool combined =
        fused && act_q8 &&
        cuda::moe_down_combine(*w.down_exps, experts, down_q.xq, down_q.xds, nullptr, s.chosen,
                               s.weights.data, n, static_cast<int32_t>(k), out.data, stream_);
    if (!combined) {
      cuda::matmul_id(matmul_, *w.down_exps, experts, s.gate.data, pairs, iota_, s.chosen,
                      s.out.data, pairs, stream_, act_q8);
      cuda::moe_combine(s.out.data, s.weights.data, n, static_cast<int32_t>(k), xn.cols, out.data,
                        stream_);
    }
    profile_end(ev, moe_bytes(w, n), [&] { return moe_label(w); });
  }
  void conv1d_silu(StateCache& st, int32_t layer, const StepArgs& step, Mat x, const float* w,
                   Mat out) override {
    forget_q8();
    KILN_ASSERT(step.state_slots != nullptr && x.cols == st.spec().conv_dim && out.cols == x.cols &&
                x.rows == step.n_tokens && out.rows == x.rows && out.data != x.data);
    cuda::conv1d_silu(static_cast<CudaStateCache&>(st).layer(layer), step.attn, step.state_slots,
                      step.n_tokens, x.data, w, out.data, stream_);
  }
  void gated_delta_rule(StateCache& st, int32_t layer, const StepArgs& step, Mat qkv, Mat alpha,
                        Mat beta, const float* ssm_a, const float* dt_bias, Mat out,
                        const DeltaParams& p) override {
    forget_q8();
    const StateSpec& s = st.spec();
    KILN_ASSERT(step.state_slots != nullptr && p.n_k_heads == s.n_k_heads &&
                p.n_v_heads == s.n_v_heads && p.head_k_dim == s.head_k_dim &&
                p.head_v_dim == s.head_v_dim && qkv.cols == s.conv_dim &&
                qkv.rows == step.n_tokens && alpha.cols == p.n_v_heads &&
                beta.cols == p.n_v_heads && out.cols == int64_t{p.n_v_heads} * p.head_v_dim);
    const DeltaShape shape{p.n_k_heads,  p.n_v_heads, p.head_k_dim,
                           p.head_v_dim, p.norm_eps,  p.tiled_heads};
    cuda::gated_delta_rule(
        static_cast<CudaStateCache&>(st).layer(layer), step.attn, step.state_slots, step.n_tokens,
        qkv.data, alpha.data, beta.data, ssm_a, dt_bias, out.data, shape,
        deterministic() ? cuda::DeltaKernel::kRecurrent : delta_kernel_, stream_);
  }
  void sigmoid_mul(Mat x, Mat gate, Mat out) override {
    forget_q8();
    KILN_ASSERT(gate.size() == x.size() && out.size() == x.size());
    cuda::sigmoid_mul(x.data, gate.data, out.data, x.size(), stream_);
  }
  void deinterleave(Mat src, int64_t width, Mat a, Mat b) override {
    forget_q8();
    KILN_ASSERT(width > 0 && src.cols % (2 * width) == 0 && a.cols * 2 == src.cols &&
                b.cols == a.cols && a.rows == src.rows && b.rows == src.rows);
    cuda::deinterleave(src.data, src.rows, src.cols / (2 * width), width, a.data, b.data, stream_);
  }

  // ---- profiling ----
  void set_profiling(bool on) override { profiling_ = on; }
  // Before the first step (the attention workspace is sized for it at reserve_step).
  void set_deterministic(bool on) override {
    Backend::set_deterministic(on);
    if (matmul_ != nullptr) matmul_set_deterministic(matmul_, on);
  }
  std::vector<OpTime> profile_take() override {
    sync();
    for (const TimedOp& op : timed_) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, events_[op.event], events_[op.event + 1]) != cudaSuccess) {
        cudaGetLastError();
        ms = 0;
      }
      profile_.add(op.label, op.bytes, 1000.0 * ms);
    }
    timed_.clear();
    next_event_ = 0;
    return profile_.take();
  }

 private:
  // While profiling (and not capturing a graph), records an event before an op's launches and
  // returns its index in events_ (the pair's first); -1 when the op is not timed. The pool of
  // events grows to the most ops of one take and is reused after it.
  int profile_begin() {
    if (!profiling_ || capturing_) return -1;
    while (events_.size() < next_event_ + 2) {
      cudaEvent_t e = nullptr;
      if (cudaEventCreate(&e) != cudaSuccess) {
        cudaGetLastError();
        return -1;
      }
      events_.push_back(e);
    }
    const int i = static_cast<int>(next_event_);
    next_event_ += 2;
    cudaEventRecord(events_[i], stream_);
    return i;
  }
  // The event after the op's launches; its time goes under label() when profile_take reads it.
  template <typename Label>
  void profile_end(int event, uint64_t bytes, Label&& label) {
    if (event < 0) return;
    cudaEventRecord(events_[event + 1], stream_);
    timed_.push_back({label(), bytes, event});
  }

  // The matmul context's int8 activations hold quantize(q8_src_) after a producer (rmsnorm,
  // add_rmsnorm, swiglu) wrote them or a matmul quantized its input; any other op forgets it
  // (it may write that memory), so a matmul reuses them only straight after their producer.
  struct Q8Target {
    int8_t* xq = nullptr;
    float2* xds = nullptr;
  };
  Q8Target q8_target(Mat y) {
    forget_q8();
    // Nobody reads them: e.g. an all-F16 model, or the deterministic mode's matmuls.
    if (!int8_matvec_weights_ || deterministic()) return {};
    const cuda::MatmulQ8 q = cuda::matmul_q8(matmul_);
    if (y.rows > q.max_tokens || y.cols > q.max_cols) return {};
    return {q.xq, q.xds};
  }
  void produced_q8(Mat y, bool quantized) {
    if (quantized) q8_src_ = y.data, q8_rows_ = y.rows, q8_cols_ = y.cols;
  }
  bool holds_q8(Mat x) const {
    return q8_src_ == x.data && q8_rows_ == x.rows && q8_cols_ == x.cols;
  }
  void consumed_q8(Mat x, bool quantized) {
    forget_q8();
    produced_q8(x, quantized);
  }
  void forget_q8() { q8_src_ = nullptr; }

  Expected<void*> upload_owned(const void* host, uint64_t bytes) {
    KILN_TRY(void* p, device_alloc(bytes, "constants"));
    owned_.push_back(p);
    KILN_TRY_STATUS(check(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), "upload"));
    prepared_bytes_ += bytes;
    return p;
  }
  // The shared checks, then the delta rule kernel's limit (a state column in registers).
  static Status state_spec_ok(const StateSpec& s) {
    KILN_TRY_STATUS(check_state_spec(s));
    if (s.head_k_dim > kDeltaMaxHeadDimK)
      return err("cuda: the gated delta rule supports key head dims up to {}; this model has {}",
                 kDeltaMaxHeadDimK, s.head_k_dim);
    return {};
  }
  // The shared checks, then the CUDA attention's own limits.
  static Status kv_spec_ok(const KvSpec& s) {
    KILN_TRY_STATUS(check_kv_spec(s));
    if (s.head_dim_k % 8 != 0 || s.head_dim_v % 8 != 0 || s.head_dim_k > 256 || s.head_dim_v > 256)
      return err(
          "cuda: attention supports head dims that are multiples of 8 up to 256; this "
          "model has {}/{}",
          s.head_dim_k, s.head_dim_v);
    return {};
  }

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaDeviceProp props_{};
  // Uploaded, by the file's data pointer and the rows (a mesh rank's part of a tied output
  // starts where the embedding table does).
  std::map<std::pair<const uint8_t*, int64_t>, Weight> weights_;
  std::vector<void*> owned_;
  std::vector<cudaGraphExec_t> graphs_;
  uint64_t prepared_bytes_ = 0;
  uint64_t f16_copy_bytes_ = 0;         // add_f16_copy: made so far
  std::optional<uint64_t> f16_budget_;  // ... and at most (set at the first one)
  int64_t max_n_in_ = 0, max_n_out_ = 0, max_experts_ = 1;
  bool int8_matvec_weights_ = false;  // a prepared weight the int8 matvec reads
  // KILN_CUDA_DELTA=recurrent|chunked forces the gated delta rule's form (A/B timing; default:
  // runs of 64+ rows chunked), read when the backend is made.
  const cuda::DeltaKernel delta_kernel_ = [] {
    const char* e = std::getenv("KILN_CUDA_DELTA");
    const std::string_view v = e != nullptr ? e : "";
    if (v == "recurrent") return cuda::DeltaKernel::kRecurrent;
    if (v == "chunked") return cuda::DeltaKernel::kChunked;
    return cuda::DeltaKernel::kAuto;
  }();
  MatmulContext* matmul_ = nullptr;
  const float* q8_src_ = nullptr;
  int64_t q8_rows_ = 0, q8_cols_ = 0;
  const int32_t* iota_ = nullptr;
  uint32_t* moe_counter_ = nullptr;
  // The fused MoE decode kernels (moe_decode.cu), opt-in: KILN_CUDA_MOE_FUSE=1 runs router +
  // top-k, gate + up, down + combine in one launch each (off while its logits' open difference
  // from this form's stands, docs/performance.md session 22).
  const bool moe_fuse_ = env_is("KILN_CUDA_MOE_FUSE", "1");
  void* attn_workspace_ = nullptr;
  int64_t attn_workspace_bytes_ = 0;
  StepCapacity step_cap_;
  // Profiling: the ops timed since the last take (their event pairs in events_), and the sums.
  struct TimedOp {
    std::string label;
    uint64_t bytes = 0;
    int event = 0;
  };
  bool profiling_ = false;
  bool capturing_ = false;  // between begin_capture and end_capture: nothing is timed
  std::vector<cudaEvent_t> events_;
  size_t next_event_ = 0;
  std::vector<TimedOp> timed_;
  OpTimeSums profile_;
  void* staging_ = nullptr;
  int32_t* step_dev_ = nullptr;
  int64_t off_tokens_ = 0, off_positions_ = 0, off_qo_ = 0, off_kvptr_ = 0, off_kvlen_ = 0,
          off_rows_ = 0, off_scale_ = 0, off_slots_ = 0, off_indices_ = 0, step_words_ = 0;
};

}  // namespace

Expected<std::unique_ptr<Backend>> create_cuda_backend(int device_index) {
  auto be = std::make_unique<CudaBackend>(device_index);
  KILN_TRY_STATUS(be->init());
  return std::unique_ptr<Backend>(std::move(be));
}

}  // namespace kiln::backend::cuda
