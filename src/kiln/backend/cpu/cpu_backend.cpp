#include "kiln/backend/cpu/cpu_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "kiln/backend/cpu/matmul.h"
#include "kiln/quant/convert.h"
#include "kiln/util/cpu.h"

namespace kiln::backend::cpu {
namespace {

class HostBuffer final : public Buffer {
 public:
  HostBuffer(void* p, uint64_t bytes) : Buffer(p, bytes) {}
  ~HostBuffer() override { std::free(data_); }
};

// The CPU's paged KV memory: per layer a K and a V array of blocks in the layout of
// KvLayerView (ops.h), the one definition of it.
class CpuKvCache final : public KvCache {
 public:
  CpuKvCache(const KvSpec& spec, int32_t num_blocks, const KvLayerView& geometry)
      : KvCache(spec, num_blocks), geometry_(geometry) {
    // Zero bytes are 0.0 in every type (an f16 scale of 0 with zero quants for Q8_0).
    k_.assign(static_cast<size_t>(geometry.k_block_bytes) * spec.n_layer * num_blocks, 0);
    v_.assign(static_cast<size_t>(geometry.v_block_bytes) * spec.n_layer * num_blocks, 0);
  }
  KvLayerView layer(int32_t il) {
    KvLayerView v = geometry_;
    v.k = k_.data() + static_cast<size_t>(il) * num_blocks_ * geometry_.k_block_bytes;
    v.v = v_.data() + static_cast<size_t>(il) * num_blocks_ * geometry_.v_block_bytes;
    return v;
  }
  void read(bool is_k, int32_t layer, int32_t block, int32_t in_block, int32_t kvh,
            float* out) const override {
    KvLayerView v = const_cast<CpuKvCache*>(this)->layer(layer);
    if (is_k) {
      kv_read_k(v, block, in_block, kvh, out);
    } else {
      kv_read_v(v, block, in_block, kvh, out);
    }
  }

 private:
  KvLayerView geometry_;  // k/v null: the block sizes and head geometry
  std::vector<uint8_t> k_, v_;
};

// The CPU's recurrent state: one block of floats per slot, per layer its conv state then its
// SSM state (DeltaLayerView), so a slot's whole state is one contiguous copy.
class CpuStateCache final : public StateCache {
 public:
  CpuStateCache(const StateSpec& spec, int32_t num_slots)
      : StateCache(spec, num_slots),
        values_(static_cast<size_t>(slot_values(spec)) * num_slots, 0.0f) {}
  static int64_t layer_values(const StateSpec& s) { return s.conv_values() + s.ssm_values(); }
  static int64_t slot_values(const StateSpec& s) { return s.n_layer * layer_values(s); }
  float* slot(int32_t i) { return values_.data() + static_cast<size_t>(i) * slot_values(spec_); }
  DeltaLayerView layer(int32_t il) {
    KILN_ASSERT(il >= 0 && il < spec_.n_layer);
    DeltaLayerView v;
    v.conv = values_.data() + il * layer_values(spec_);
    v.ssm = v.conv + spec_.conv_values();
    v.slot_stride = slot_values(spec_);
    v.conv_dim = spec_.conv_dim;
    v.conv_k = spec_.conv_k;
    return v;
  }
  void read_conv(int32_t il, int32_t s, float* out) const override {
    std::copy_n(values_.data() + offset(il, s, false), spec_.conv_values(), out);
  }
  void read_ssm(int32_t il, int32_t s, float* out) const override {
    std::copy_n(values_.data() + offset(il, s, true), spec_.ssm_values(), out);
  }
  void write_conv(int32_t il, int32_t s, const float* in) override {
    std::copy_n(in, spec_.conv_values(), values_.data() + offset(il, s, false));
  }
  void write_ssm(int32_t il, int32_t s, const float* in) override {
    std::copy_n(in, spec_.ssm_values(), values_.data() + offset(il, s, true));
  }

 private:
  // Where slot s's conv (or SSM) state of layer il starts.
  size_t offset(int32_t il, int32_t s, bool ssm) const {
    KILN_ASSERT(il >= 0 && il < spec_.n_layer && s >= 0 && s < num_slots_);
    return static_cast<size_t>(s * slot_values(spec_) + il * layer_values(spec_) +
                               (ssm ? spec_.conv_values() : 0));
  }
  std::vector<float> values_;  // [num_slots][n_layer][conv | ssm]
};

Expected<KvLayerView> kv_geometry(const KvSpec& s) {
  KILN_TRY_STATUS(check_kv_spec(s));
  return make_kv_view(s.type, nullptr, nullptr, s.block_tokens, s.n_kv_heads, s.head_dim_k,
                      s.head_dim_v);
}

}  // namespace

CpuBackend::CpuBackend(int threads)
    : own_pool_(
          std::make_unique<util::ThreadPool>(threads > 0 ? threads : util::default_num_threads())),
      pool_(own_pool_.get()) {}

CpuBackend::CpuBackend(util::ThreadPool* pool) : pool_(pool) {}

void CpuBackend::set_threads(int n) {
  if (own_pool_ == nullptr || n < 1 || n == own_pool_->num_threads()) return;
  own_pool_ = std::make_unique<util::ThreadPool>(n);
  pool_ = own_pool_.get();
}

std::string CpuBackend::description() const {
  return fmt::format("cpu: {} threads, {} kernels, weights packed: {}",
                     pool_ != nullptr ? pool_->num_threads() : 1, path_name(best_kernel_path()),
                     packing_enabled() ? "yes" : "no (KILN_PACK=0)");
}

DeviceMemory CpuBackend::memory() const {
  DeviceMemory m;
  const long pages = ::sysconf(_SC_PHYS_PAGES), avail = ::sysconf(_SC_AVPHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) m.total_bytes = static_cast<uint64_t>(pages) * page;
  if (avail > 0 && page > 0) m.free_bytes = static_cast<uint64_t>(avail) * page;
  return m;
}

Expected<std::unique_ptr<Buffer>> CpuBackend::alloc(uint64_t bytes) {
  constexpr uint64_t kAlign = 64;
  const uint64_t n = std::max<uint64_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  void* p = std::aligned_alloc(kAlign, n);
  if (p == nullptr) return err("cpu: out of memory allocating {} bytes", bytes);
  return std::unique_ptr<Buffer>(new HostBuffer(p, bytes));
}

void CpuBackend::upload(void* dst, const void* host_src, uint64_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
}
void CpuBackend::download(void* host_dst, const void* src, uint64_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
}
void CpuBackend::copy(void* dst, const void* src, uint64_t bytes) {
  if (bytes == 0) return;
  timed([] { return std::string("copy"); }, bytes, [&] { std::memcpy(dst, src, bytes); });
}

Expected<Weight> CpuBackend::prepare_weight(const Weight& file_weight, WeightUse use) {
  if (use == WeightUse::kRows || file_weight.empty()) return file_weight;
  const auto key = std::make_pair(file_weight.data, file_weight.n_out * file_weight.n_mats);
  auto it = weights_.find(key);
  if (it != weights_.end()) return it->second;
  Weight w = file_weight;
  if (packing_enabled()) packed_.pack(&w);
  weights_.emplace(key, w);
  return w;
}

Expected<const float*> CpuBackend::prepare_vector(const float* host, int64_t) {
  return host;  // already in host memory, owned by the model
}
Expected<const double*> CpuBackend::prepare_doubles(const double* host, int64_t) {
  return host;
}

uint64_t CpuBackend::kv_bytes_per_block(const KvSpec& spec) const {
  auto g = kv_geometry(spec);
  if (!g.ok()) return 0;
  return static_cast<uint64_t>(spec.n_layer) * (g->k_block_bytes + g->v_block_bytes);
}

Expected<std::unique_ptr<KvCache>> CpuBackend::create_kv(const KvSpec& spec, int32_t num_blocks) {
  KILN_TRY(const KvLayerView g, kv_geometry(spec));
  if (num_blocks <= 0 || num_blocks > (1 << 30))
    return err("kv: {} blocks is not a cache size", num_blocks);
  try {
    return std::unique_ptr<KvCache>(new CpuKvCache(spec, num_blocks, g));
  } catch (const std::bad_alloc&) {
    return err("kv: out of memory for {} blocks ({} bytes)", num_blocks,
               kv_bytes_per_block(spec) * static_cast<uint64_t>(num_blocks));
  }
}

uint64_t CpuBackend::state_bytes_per_slot(const StateSpec& spec) const {
  if (!check_state_spec(spec).ok()) return 0;
  return static_cast<uint64_t>(CpuStateCache::slot_values(spec)) * sizeof(float);
}

Expected<std::unique_ptr<StateCache>> CpuBackend::create_state(const StateSpec& spec,
                                                               int32_t num_slots) {
  KILN_TRY_STATUS(check_state_spec(spec));
  if (num_slots <= 0) return err("state: {} slots is not a state pool size", num_slots);
  try {
    return std::unique_ptr<StateCache>(new CpuStateCache(spec, num_slots));
  } catch (const std::bad_alloc&) {
    return err("state: out of memory for {} slots ({} bytes)", num_slots,
               state_bytes_per_slot(spec) * static_cast<uint64_t>(num_slots));
  }
}

void CpuBackend::state_copy(StateCache& st, int32_t src_slot, int32_t dst_slot) {
  auto& c = static_cast<CpuStateCache&>(st);
  KILN_ASSERT(src_slot >= 0 && src_slot < c.num_slots() && dst_slot >= 0 &&
              dst_slot < c.num_slots());
  if (src_slot != dst_slot)
    std::copy_n(c.slot(src_slot), CpuStateCache::slot_values(c.spec()), c.slot(dst_slot));
}

DeltaLayerView CpuBackend::state_view(StateCache& st, int32_t layer) {
  return static_cast<CpuStateCache&>(st).layer(layer);
}

KvLayerView CpuBackend::layer_view(KvCache& kv, int32_t layer) {
  return static_cast<CpuKvCache&>(kv).layer(layer);
}

Expected<StepArgs> CpuBackend::upload_step(const HostStep& step) {
  StepArgs a;
  a.n_tokens = static_cast<int64_t>(step.tokens.size());
  a.n_logit_rows = static_cast<int64_t>(step.logit_rows.size());
  a.tokens = step.tokens.data();
  a.attn = step.attn;
  a.logit_rows = step.logit_rows.data();
  a.row_scale = step.row_scale.empty() ? nullptr : step.row_scale.data();
  if (!step.state_slots.empty() &&
      step.state_slots.size() != static_cast<size_t>(step.attn.num_seqs))
    return err("cpu: {} state slots for {} sequences", step.state_slots.size(), step.attn.num_seqs);
  a.state_slots = step.state_slots.empty() ? nullptr : step.state_slots.data();
  for (int32_t s = 0; s < step.attn.num_seqs; ++s)
    a.max_q_len = std::max(a.max_q_len, step.attn.qo_indptr[s + 1] - step.attn.qo_indptr[s]);
  return a;
}

void CpuBackend::embed(const Weight& table, const int32_t* tokens, Mat out) {
  cpu::embed(table, tokens, out.rows, out.data);
}
void CpuBackend::rmsnorm(Mat x, const float* w, Mat y, float eps) {
  cpu::rmsnorm(x.data, w, y.data, x.rows, x.cols, eps);
}
void CpuBackend::layernorm(Mat x, const float* w, const float* b, Mat out, float eps) {
  KILN_ASSERT(out.rows == x.rows && out.cols == x.cols);
  cpu::layernorm(x.data, w, b, out.data, x.rows, x.cols, eps);
}
void CpuBackend::add_layernorm(Mat x, Mat y, const float* w, const float* b, Mat out, float eps) {
  KILN_ASSERT(y.size() == x.size() && out.rows == x.rows && out.cols == x.cols);
  cpu::add_layernorm(x.data, y.data, w, b, out.data, x.rows, x.cols, eps);
}
void CpuBackend::matmul(const Weight& w, Mat x, Mat y) {
  KILN_ASSERT(x.cols == w.n_in && y.cols == w.n_out && x.rows == y.rows);
  timed([&] { return matmul_label(w); }, w.total_bytes(),
        [&] { cpu::matmul(w, x.data, y.data, x.rows, pool_); });
}
// One matmul per weight, as the default, timed as one group.
void CpuBackend::matmuls(std::span<const Weight* const> ws, Mat x, std::span<const Mat> ys) {
  KILN_ASSERT(ws.size() == ys.size());
  uint64_t bytes = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    KILN_ASSERT(x.cols == ws[i]->n_in && ys[i].cols == ws[i]->n_out && x.rows == ys[i].rows);
    bytes += ws[i]->total_bytes();
  }
  timed([&] { return matmuls_label(ws); }, bytes,
        [&] {
          for (size_t i = 0; i < ws.size(); ++i)
            cpu::matmul(*ws[i], x.data, ys[i].data, x.rows, pool_);
        });
}
void CpuBackend::add_bias(Mat x, const float* b) {
  cpu::add_bias(x.data, b, x.rows, x.cols);
}
void CpuBackend::add(Mat x, Mat y) {
  cpu::add(x.data, y.data, x.size());
}
void CpuBackend::scale(Mat x, float s) {
  cpu::scale(x.data, s, x.size());
}
void CpuBackend::scale_rows(Mat x, const float* s) {
  for (int64_t t = 0; t < x.rows; ++t)
    if (s[t] != 1.0f) cpu::scale(x.data + t * x.cols, s[t], x.cols);
}
void CpuBackend::add_gated_rows(Mat x, Mat y, Mat s) {
  for (int64_t t = 0; t < x.rows; ++t) {
    const float g = 1.0f / (1.0f + std::exp(-s.data[t]));
    float* xt = x.data + t * x.cols;
    const float* yt = y.data + t * y.cols;
    for (int64_t i = 0; i < x.cols; ++i) xt[i] += g * yt[i];
  }
}
void CpuBackend::softcap(Mat x, float cap) {
  cpu::softcap(x.data, cap, x.size());
}
void CpuBackend::swiglu(Mat gate, Mat up, Mat out) {
  cpu::swiglu(gate.data, up.data, out.data, gate.size());
}
void CpuBackend::geglu(Mat gate, Mat up, Mat out) {
  cpu::geglu(gate.data, up.data, out.data, gate.size());
}
void CpuBackend::gelu(Mat x, Mat out) {
  KILN_ASSERT(out.size() == x.size());
  cpu::gelu(x.data, out.data, x.size());
}
void CpuBackend::copy_cols(Mat src, int64_t col0, Mat dst) {
  for (int64_t t = 0; t < dst.rows; ++t)
    std::copy_n(src.data + t * src.cols + col0, dst.cols, dst.data + t * dst.cols);
}
void CpuBackend::gather_rows(Mat src, const int32_t* rows, Mat dst) {
  for (int64_t i = 0; i < dst.rows; ++i) {
    KILN_ASSERT(rows[i] >= 0 && rows[i] < src.rows);
    std::copy_n(src.data + int64_t{rows[i]} * src.cols, dst.cols, dst.data + i * dst.cols);
  }
}
void CpuBackend::argmax_rows(Mat x, int32_t* out) {
  for (int64_t r = 0; r < x.rows; ++r) out[r] = argmax(x.data + r * x.cols, x.cols);
}
void CpuBackend::rope_angles(const RopeTable& t, const int32_t* positions, Mat cos, Mat sin) {
  cpu::rope_angles(t.inv_freq, t.n_pairs, positions, cos.rows, t.attn_factor, cos.data, sin.data);
}
void CpuBackend::rope_apply(Mat x, int32_t n_heads, int32_t head_dim, bool neox, Mat cos, Mat sin) {
  cpu::rope_apply(x.data, x.rows, n_heads, head_dim, static_cast<int32_t>(cos.cols), neox, cos.data,
                  sin.data);
}
void CpuBackend::kv_write(KvCache& kv, int32_t layer, const StepArgs& step, Mat k, Mat v) {
  cpu::kv_write(layer_view(kv, layer), step.attn, k.data, v.data);
}
void CpuBackend::attention(KvCache& kv, int32_t layer, const StepArgs& step, Mat q, Mat out,
                           const AttnParams& p) {
  timed([] { return std::string("attention"); }, 0,
        [&] { cpu::attention(layer_view(kv, layer), step.attn, q.data, out.data, p, pool_); });
}

void CpuBackend::conv1d_silu(StateCache& st, int32_t layer, const StepArgs& step, Mat x,
                             const float* w, Mat out) {
  KILN_ASSERT(step.state_slots != nullptr && x.cols == st.spec().conv_dim && out.cols == x.cols &&
              x.rows == step.n_tokens && out.rows == x.rows && out.data != x.data);
  cpu::conv1d_silu(state_view(st, layer), step.attn, step.state_slots, x.data, w, out.data, pool_);
}
void CpuBackend::gated_delta_rule(StateCache& st, int32_t layer, const StepArgs& step, Mat qkv,
                                  Mat alpha, Mat beta, const float* ssm_a, const float* dt_bias,
                                  Mat out, const DeltaParams& p) {
  const StateSpec& s = st.spec();
  KILN_ASSERT(step.state_slots != nullptr && p.n_k_heads == s.n_k_heads &&
              p.n_v_heads == s.n_v_heads && p.head_k_dim == s.head_k_dim &&
              p.head_v_dim == s.head_v_dim && qkv.cols == s.conv_dim && qkv.rows == step.n_tokens &&
              alpha.cols == p.n_v_heads && beta.cols == p.n_v_heads &&
              out.cols == int64_t{p.n_v_heads} * p.head_v_dim);
  cpu::gated_delta_rule(state_view(st, layer), step.attn, step.state_slots, qkv.data, alpha.data,
                        beta.data, ssm_a, dt_bias, out.data, p, pool_,
                        deterministic() ? cpu::DeltaForm::kRecurrent : cpu::DeltaForm::kAuto);
}
void CpuBackend::sigmoid_mul(Mat x, Mat gate, Mat out) {
  KILN_ASSERT(gate.size() == x.size() && out.size() == x.size());
  cpu::sigmoid_mul(x.data, gate.data, out.data, x.size());
}
void CpuBackend::deinterleave(Mat src, int64_t width, Mat a, Mat b) {
  KILN_ASSERT(width > 0 && src.cols % (2 * width) == 0 && a.cols * 2 == src.cols &&
              b.cols == a.cols && a.rows == src.rows && b.rows == src.rows);
  cpu::deinterleave(src.data, src.rows, src.cols / (2 * width), width, a.data, b.data);
}

void CpuBackend::all_reduce_sum(Mat x) {
  if (tp_ == nullptr) return;
  mesh_failed(tp_->all_reduce_sum(x.data, x.size()));
}

void CpuBackend::all_gather_cols(Mat x, Mat gathered, Mat out) {
  const int n = tp_size();
  KILN_ASSERT(out.rows == x.rows && out.cols == n * x.cols && gathered.size() >= n * x.size());
  if (tp_ == nullptr)
    return copy(out.data, x.data, static_cast<uint64_t>(x.size()) * sizeof(float));
  const Status st = tp_->all_gather(x.data, x.size(), gathered.data);
  mesh_failed(st);
  if (!st.ok()) return;
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < x.rows; ++i)
      std::copy_n(gathered.data + r * x.size() + i * x.cols, x.cols,
                  out.data + i * out.cols + r * x.cols);
}

void CpuBackend::send(Mat x, int stage) {
  if (pp_ == nullptr) return mesh_failed(err("cpu: send without a pipeline"));
  mesh_failed(pp_->send(x.data, static_cast<uint64_t>(x.size()) * sizeof(float), stage));
}

void CpuBackend::recv(Mat x, int stage) {
  if (pp_ == nullptr) return mesh_failed(err("cpu: recv without a pipeline"));
  mesh_failed(pp_->recv(x.data, static_cast<uint64_t>(x.size()) * sizeof(float), stage));
}

void CpuBackend::moe(const MoeWeights& w, Mat xn, Mat out, const MoeScratch& s) {
  timed([&] { return moe_label(w); }, moe_bytes(w, xn.rows), [&] { moe_rows(w, xn, out, s); });
}
// Mixture of experts (qwen3moe): softmax over the router logits, the top n_expert_used experts
// (ties to the lower index), weights renormalised to sum to 1 (norm_topk_prob), and each
// expert a SwiGLU FFN. Tokens are grouped per expert so each expert's weights are read once
// per step; a token's result does not depend on which other tokens share the step.
void CpuBackend::moe_rows(const MoeWeights& w, Mat xn, Mat out, const MoeScratch& s) {
  const int64_t n = xn.rows, n_exp = w.n_expert, k = w.n_expert_used, d = xn.cols;
  Mat router = s.router.as(n, n_exp);
  cpu::matmul(*w.router, xn.data, router.data, n, pool_);
  moe_probs_.resize(static_cast<size_t>(n_exp));
  moe_order_.resize(static_cast<size_t>(n_exp));
  for (int64_t t = 0; t < n; ++t) {
    const float* r = router.data + t * n_exp;
    const float mx = *std::max_element(r, r + n_exp);
    double sum = 0;
    for (int64_t e = 0; e < n_exp; ++e) sum += moe_probs_[e] = std::exp(r[e] - mx);
    for (int64_t e = 0; e < n_exp; ++e) moe_probs_[e] = static_cast<float>(moe_probs_[e] / sum);
    std::iota(moe_order_.begin(), moe_order_.end(), 0);
    std::partial_sort(
        moe_order_.begin(), moe_order_.begin() + k, moe_order_.end(), [&](int32_t a, int32_t b) {
          return moe_probs_[a] != moe_probs_[b] ? moe_probs_[a] > moe_probs_[b] : a < b;
        });
    float wsum = 0;
    for (int64_t j = 0; j < k; ++j) wsum += moe_probs_[moe_order_[j]];
    for (int64_t j = 0; j < k; ++j) {
      s.chosen[t * k + j] = moe_order_[j];
      s.weights.data[t * k + j] = moe_probs_[moe_order_[j]] / wsum;
    }
  }
  int32_t* rows = s.x_rows;  // (token, slot) pairs routed to the expert, as t * k + j
  // The experts held here (an expert-parallel rank holds some): the other pairs add nothing.
  const int64_t held = w.gate_exps->n_mats;
  if (held < n_exp) std::fill(s.slots.data, s.slots.data + n * k * d, 0.0f);
  for (int64_t e = 0; e < held; ++e) {
    int64_t m = 0;
    for (int64_t i = 0; i < n * k; ++i)
      if (s.chosen[i] == w.first_expert + e) rows[m++] = static_cast<int32_t>(i);
    if (m == 0) continue;
    for (int64_t i = 0; i < m; ++i) std::copy_n(xn.data + (rows[i] / k) * d, d, s.in.data + i * d);
    cpu::matmul(expert(*w.gate_exps, e), s.in.data, s.gate.data, m, pool_);
    cpu::matmul(expert(*w.up_exps, e), s.in.data, s.up.data, m, pool_);
    cpu::swiglu(s.gate.data, s.up.data, s.gate.data, m * w.n_ff);
    cpu::matmul(expert(*w.down_exps, e), s.gate.data, s.out.data, m, pool_);
    // Weighted outputs per (token, slot); tokens then add their experts in slot order, so
    // the sum order is fixed whatever the grouping.
    for (int64_t i = 0; i < m; ++i) {
      float* dst = s.slots.data + int64_t{rows[i]} * d;
      const float wt = s.weights.data[rows[i]];
      for (int64_t c = 0; c < d; ++c) dst[c] = wt * s.out.data[i * d + c];
    }
  }
  std::fill(out.data, out.data + n * d, 0.0f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) cpu::add(out.data + t * d, s.slots.data + (t * k + j) * d, d);
}

}  // namespace kiln::backend::cpu
