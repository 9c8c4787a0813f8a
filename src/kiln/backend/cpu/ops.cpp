#include "kiln/backend/cpu/ops.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "kiln/backend/cpu/attention.h"
#include "kiln/backend/cpu/matmul.h"
#include "kiln/quant/convert.h"
#include "kiln/quant/fp16.h"
#include "kiln/util/status.h"

namespace kiln::backend::cpu {

namespace {

std::atomic<OpsMode> g_ops_mode{[] {
  const char* env = std::getenv("KILN_SCALAR_OPS");
  return env != nullptr && std::string_view(env) == "1" ? OpsMode::Reference : OpsMode::Fast;
}()};

bool use_avx2() {
  static const bool available = avx2_ops_available();
  return available && g_ops_mode.load(std::memory_order_relaxed) == OpsMode::Fast;
}

}  // namespace

void set_ops_mode(OpsMode mode) {
  g_ops_mode.store(mode, std::memory_order_relaxed);
}
OpsMode ops_mode() {
  return g_ops_mode.load(std::memory_order_relaxed);
}

void embed(const Weight& table, const int32_t* tokens, int64_t n_tokens, float* out) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    KILN_ASSERT(tokens[t] >= 0 && tokens[t] < table.n_out);
    Status st =
        quant::dequantize_row(table.type, table.row(tokens[t]), out + t * table.n_in, table.n_in);
    KILN_ASSERT(st.ok());
  }
}

void rmsnorm_reference(const float* x, const float* w, float* y, int64_t n_rows, int64_t n,
                       float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * (w ? w[i] : 1.0f);
  }
}

void rmsnorm(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps) {
  if (use_avx2()) return rmsnorm_avx2(x, w, y, n_rows, n, eps);
  rmsnorm_reference(x, w, y, n_rows, n, eps);
}

namespace {

// One row of layernorm: the two-pass mean and biased variance in double, then each output
// rounded once from double. y may alias x (element i is read before it is written).
void layernorm_row(const float* x, const float* w, const float* b, float* y, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const double mean = sum / static_cast<double>(n);
  double sq = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = x[i] - mean;
    sq += d * d;
  }
  const double inv = 1.0 / std::sqrt(sq / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) {
    double v = (x[i] - mean) * inv;
    if (w != nullptr) v *= w[i];
    if (b != nullptr) v += b[i];
    y[i] = static_cast<float>(v);
  }
}

}  // namespace

void layernorm(const float* x, const float* w, const float* b, float* y, int64_t n_rows, int64_t n,
               float eps) {
  for (int64_t r = 0; r < n_rows; ++r) layernorm_row(x + r * n, w, b, y + r * n, n, eps);
}

void add_layernorm(float* x, const float* r, const float* w, const float* b, float* y,
                   int64_t n_rows, int64_t n, float eps) {
  for (int64_t t = 0; t < n_rows; ++t) {
    float* xr = x + t * n;
    const float* rr = r + t * n;
    for (int64_t i = 0; i < n; ++i) xr[i] += rr[i];
    layernorm_row(xr, w, b, y + t * n, n, eps);
  }
}

void matmul(const Weight& w, const float* x, float* y, int64_t n_tokens, util::ThreadPool* pool) {
  matmul_fast(w, x, y, n_tokens, pool);
}

void add_bias(float* x, const float* b, int64_t n_tokens, int64_t n) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t i = 0; i < n; ++i) x[t * n + i] += b[i];
}

void add(float* x, const float* y, int64_t n) {
  if (use_avx2()) return add_avx2(x, y, n);
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void rope(float* x, const int32_t* positions, int64_t n_tokens, int32_t n_heads, int32_t head_dim,
          int32_t n_rot, float freq_base, bool neox, const float* freq_factors) {
  const int32_t half = n_rot / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const double pos = positions[t];
    for (int32_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int32_t i = 0; i < half; ++i) {
        double theta = pos * std::pow(static_cast<double>(freq_base), -2.0 * i / n_rot);
        if (freq_factors != nullptr) theta /= freq_factors[i];
        const float c = static_cast<float>(std::cos(theta));
        const float s = static_cast<float>(std::sin(theta));
        const int32_t a = neox ? i : 2 * i;
        const int32_t b = neox ? i + half : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
    }
  }
}

void rope_angles(const double* inv_freq, int32_t n_pairs, const int32_t* positions,
                 int64_t n_tokens, float attn_factor, float* cos, float* sin) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const double pos = positions[t];
    for (int32_t i = 0; i < n_pairs; ++i) {
      const double theta = pos * inv_freq[i];
      float c = static_cast<float>(std::cos(theta));
      float s = static_cast<float>(std::sin(theta));
      if (attn_factor != 1.0f) {
        c *= attn_factor;
        s *= attn_factor;
      }
      cos[t * n_pairs + i] = c;
      sin[t * n_pairs + i] = s;
    }
  }
}

void rope_apply(float* x, int64_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t n_pairs,
                bool neox, const float* cos, const float* sin) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* ct = cos + t * n_pairs;
    const float* st = sin + t * n_pairs;
    for (int32_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int32_t i = 0; i < n_pairs; ++i) {
        const int32_t a = neox ? i : 2 * i;
        const int32_t b = neox ? i + n_pairs : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * ct[i] - x1 * st[i];
        v[b] = x0 * st[i] + x1 * ct[i];
      }
    }
  }
}

void swiglu_reference(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void geglu_reference(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  if (use_avx2()) return swiglu_avx2(gate, up, out, n);
  swiglu_reference(gate, up, out, n);
}

void geglu(const float* gate, const float* up, float* out, int64_t n) {
  if (use_avx2()) return geglu_avx2(gate, up, out, n);
  geglu_reference(gate, up, out, n);
}

void gelu(const float* x, float* out, int64_t n) {
  constexpr double kInvSqrt2 = 0.70710678118654752440;
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    out[i] = static_cast<float>(0.5 * v * std::erfc(-v * kInvSqrt2));
  }
}

void scale(float* x, float s, int64_t n) {
  if (use_avx2()) return scale_avx2(x, s, n);
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void softcap(float* x, float cap, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

namespace {

// The sequence that owns flat row t (qo_indptr is sorted).
int32_t seq_of_row(const AttnBatch& b, int64_t t) {
  int32_t s = 0;
  while (s + 1 < b.num_seqs && b.qo_indptr[s + 1] <= t) ++s;
  return s;
}

}  // namespace

KvLayerView make_kv_view(quant::Type type, uint8_t* k, uint8_t* v, int32_t block_tokens,
                         int32_t n_kv_heads, int32_t head_dim_k, int32_t head_dim_v) {
  KvLayerView view;
  view.type = type;
  view.k = k;
  view.v = v;
  view.block_tokens = block_tokens;
  view.n_kv_heads = n_kv_heads;
  view.head_dim_k = head_dim_k;
  view.head_dim_v = head_dim_v;
  const auto row = [&](int32_t dim) {
    const std::optional<uint64_t> bytes = quant::row_bytes(type, static_cast<uint64_t>(dim));
    KILN_ASSERT(bytes.has_value());
    return static_cast<int64_t>(*bytes);
  };
  view.k_block_bytes = int64_t{block_tokens} * n_kv_heads * row(head_dim_k);
  view.v_block_bytes = int64_t{block_tokens} * n_kv_heads * row(head_dim_v);
  return view;
}

namespace {

// Start of kv head kvh's part of block `block`.
uint8_t* k_head(const KvLayerView& kv, int64_t block, int32_t kvh) {
  return kv.k + block * kv.k_block_bytes + kvh * kv.k_head_bytes();
}
uint8_t* v_head(const KvLayerView& kv, int64_t block, int32_t kvh) {
  return kv.v + block * kv.v_block_bytes + kvh * kv.v_head_bytes();
}

// Row j of a [block_tokens][row] head part, of `dim` elements of the type.
uint8_t* row_in_head(uint8_t* head, quant::Type type, int32_t j, int32_t dim) {
  return head + int64_t{j} * static_cast<int64_t>(*quant::row_bytes(type, dim));
}

}  // namespace

void kv_read_k(const KvLayerView& kv, int64_t block, int32_t in_block, int32_t kvh, float* out) {
  uint8_t* head = k_head(kv, block, kvh);
  if (kv.type == quant::Type::F32) {
    const float* kt = reinterpret_cast<const float*>(head);
    for (int32_t d = 0; d < kv.head_dim_k; ++d) out[d] = kt[d * kv.block_tokens + in_block];
  } else if (kv.type == quant::Type::F16) {
    const uint16_t* kt = reinterpret_cast<const uint16_t*>(head);
    for (int32_t d = 0; d < kv.head_dim_k; ++d)
      out[d] = quant::fp16_to_fp32(kt[d * kv.block_tokens + in_block]);
  } else {
    Status st = quant::dequantize_row(kv.type, row_in_head(head, kv.type, in_block, kv.head_dim_k),
                                      out, kv.head_dim_k);
    KILN_ASSERT(st.ok());
  }
}

void kv_read_v(const KvLayerView& kv, int64_t block, int32_t in_block, int32_t kvh, float* out) {
  Status st = quant::dequantize_row(
      kv.type, row_in_head(v_head(kv, block, kvh), kv.type, in_block, kv.head_dim_v), out,
      kv.head_dim_v);
  KILN_ASSERT(st.ok());
}

void kv_write(const KvLayerView& kv, const AttnBatch& b, const float* k, const float* v) {
  const int64_t k_row = int64_t{kv.n_kv_heads} * kv.head_dim_k;
  const int64_t v_row = int64_t{kv.n_kv_heads} * kv.head_dim_v;
  for (int32_t s = 0; s < b.num_seqs; ++s) {
    for (int32_t t = b.qo_indptr[s]; t < b.qo_indptr[s + 1]; ++t) {
      const int32_t pos = b.positions[t];
      const int32_t slot = b.kv_indptr[s] + pos / kv.block_tokens;
      KILN_ASSERT(slot < b.kv_indptr[s + 1]);
      const int64_t block = b.kv_indices[slot];
      const int32_t j = pos % kv.block_tokens;
      for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
        const float* ks = k + t * k_row + int64_t{h} * kv.head_dim_k;
        const float* vs = v + t * v_row + int64_t{h} * kv.head_dim_v;
        uint8_t* kh = k_head(kv, block, h);
        if (kv.type == quant::Type::F16 && use_avx2()) {  // same bits as fp32_to_fp16
          fp32_to_fp16_avx2(ks, reinterpret_cast<uint16_t*>(kh) + j, kv.head_dim_k,
                            kv.block_tokens);
          fp32_to_fp16_avx2(vs,
                            reinterpret_cast<uint16_t*>(
                                row_in_head(v_head(kv, block, h), kv.type, j, kv.head_dim_v)),
                            kv.head_dim_v, 1);
          continue;
        }
        if (kv.type == quant::Type::F32) {
          float* kt = reinterpret_cast<float*>(kh);
          for (int32_t d = 0; d < kv.head_dim_k; ++d) kt[d * kv.block_tokens + j] = ks[d];
        } else if (kv.type == quant::Type::F16) {
          uint16_t* kt = reinterpret_cast<uint16_t*>(kh);
          for (int32_t d = 0; d < kv.head_dim_k; ++d)
            kt[d * kv.block_tokens + j] = quant::fp32_to_fp16(ks[d]);
        } else {
          Status st = quant::quantize_row(kv.type, ks, row_in_head(kh, kv.type, j, kv.head_dim_k),
                                          kv.head_dim_k);
          KILN_ASSERT(st.ok());
        }
        Status st = quant::quantize_row(
            kv.type, vs, row_in_head(v_head(kv, block, h), kv.type, j, kv.head_dim_v),
            kv.head_dim_v);
        KILN_ASSERT(st.ok());
      }
    }
  }
}

void attention_reference(const KvLayerView& kv, const AttnBatch& b, const float* q, float* out,
                         const AttnParams& params, util::ThreadPool* pool) {
  const int32_t n_heads = params.n_heads;
  const int32_t group = n_heads / kv.n_kv_heads;
  const int64_t n_tokens = b.qo_indptr[b.num_seqs];
  KILN_ASSERT(params.causal || params.sliding_window == 0);
  auto rows = [&](int64_t begin, int64_t end, int) {
    std::vector<float> acc(static_cast<size_t>(kv.head_dim_v));
    std::vector<float> kp(static_cast<size_t>(kv.head_dim_k));
    std::vector<float> vp(static_cast<size_t>(kv.head_dim_v));
    for (int64_t th = begin; th < end; ++th) {
      const int64_t t = th / n_heads;
      const int32_t h = static_cast<int32_t>(th % n_heads);
      const int32_t kvh = h / group;
      const int32_t s = seq_of_row(b, t);
      const int32_t pos = b.positions[t];
      KILN_ASSERT(pos < b.kv_len[s]);
      const float* qh = q + (t * n_heads + h) * kv.head_dim_k;
      // Online softmax (Milakov & Gimelshein 2018): running max m and normaliser l.
      float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      const int32_t first =
          params.sliding_window > 0 ? std::max(0, pos - params.sliding_window + 1) : 0;
      const int32_t last = params.causal ? pos : b.kv_len[s] - 1;  // the last key it sees
      for (int32_t p = first; p <= last; ++p) {
        const int64_t block = b.kv_indices[b.kv_indptr[s] + p / kv.block_tokens];
        const int32_t in_block = p % kv.block_tokens;
        kv_read_k(kv, block, in_block, kvh, kp.data());
        kv_read_v(kv, block, in_block, kvh, vp.data());
        float dot = 0.0f;
        for (int32_t i = 0; i < kv.head_dim_k; ++i) dot += qh[i] * kp[i];
        float score = dot * params.scale;
        if (params.softcap > 0) score = params.softcap * std::tanh(score / params.softcap);
        const float m_new = std::max(m, score);
        const float corr = std::exp(m - m_new);
        const float w = std::exp(score - m_new);
        l = l * corr + w;
        for (int32_t i = 0; i < kv.head_dim_v; ++i) acc[i] = acc[i] * corr + w * vp[i];
        m = m_new;
      }
      float* o = out + (t * n_heads + h) * kv.head_dim_v;
      for (int32_t i = 0; i < kv.head_dim_v; ++i) o[i] = acc[i] / l;
    }
  };
  if (pool != nullptr) {
    pool->parallel_for(n_tokens * n_heads, rows);
  } else {
    rows(0, n_tokens * n_heads, 0);
  }
}

void attention(const KvLayerView& kv, const AttnBatch& b, const float* q, float* out,
               const AttnParams& params, util::ThreadPool* pool) {
  if (use_avx2() && attention_avx2_supports(kv)) return attention_avx2(kv, b, q, out, params, pool);
  attention_reference(kv, b, q, out, params, pool);
}

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace kiln::backend::cpu
