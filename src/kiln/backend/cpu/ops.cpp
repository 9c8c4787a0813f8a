#include "kiln/backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/backend/cpu/matmul.h"
#include "kiln/quant/convert.h"
#include "kiln/util/status.h"

namespace kiln::backend::cpu {

void embed(const Weight& table, const int32_t* tokens, int64_t n_tokens, float* out) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    KILN_ASSERT(tokens[t] >= 0 && tokens[t] < table.n_out);
    Status st =
        quant::dequantize_row(table.type, table.row(tokens[t]), out + t * table.n_in, table.n_in);
    KILN_ASSERT(st.ok());
  }
}

void rmsnorm(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * (w ? w[i] : 1.0f);
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

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void geglu(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void scale(float* x, float s, int64_t n) {
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

void kv_write(const KvLayerView& kv, const AttnBatch& b, const float* k, const float* v) {
  const int64_t k_row = int64_t{kv.n_kv_heads} * kv.head_dim_k;
  const int64_t v_row = int64_t{kv.n_kv_heads} * kv.head_dim_v;
  for (int32_t s = 0; s < b.num_seqs; ++s) {
    for (int32_t t = b.qo_indptr[s]; t < b.qo_indptr[s + 1]; ++t) {
      const int32_t pos = b.positions[t];
      const int32_t slot = b.kv_indptr[s] + pos / kv.block_tokens;
      KILN_ASSERT(slot < b.kv_indptr[s + 1]);
      const int64_t block = b.kv_indices[slot];
      const int32_t in_block = pos % kv.block_tokens;
      float* kd = kv.k + block * kv.k_block_elems + in_block * k_row;
      float* vd = kv.v + block * kv.v_block_elems + in_block * v_row;
      for (int64_t i = 0; i < k_row; ++i) kd[i] = k[t * k_row + i];
      for (int64_t i = 0; i < v_row; ++i) vd[i] = v[t * v_row + i];
    }
  }
}

void attention(const KvLayerView& kv, const AttnBatch& b, const float* q, float* out,
               const AttnParams& params, util::ThreadPool* pool) {
  const int32_t n_heads = params.n_heads;
  const int32_t group = n_heads / kv.n_kv_heads;
  const int64_t k_row = int64_t{kv.n_kv_heads} * kv.head_dim_k;
  const int64_t v_row = int64_t{kv.n_kv_heads} * kv.head_dim_v;
  const int64_t n_tokens = b.qo_indptr[b.num_seqs];
  auto rows = [&](int64_t begin, int64_t end, int) {
    std::vector<float> acc(static_cast<size_t>(kv.head_dim_v));
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
      for (int32_t p = first; p <= pos; ++p) {
        const int64_t block = b.kv_indices[b.kv_indptr[s] + p / kv.block_tokens];
        const int32_t in_block = p % kv.block_tokens;
        const float* kp = kv.k + block * kv.k_block_elems + in_block * k_row + kvh * kv.head_dim_k;
        const float* vp = kv.v + block * kv.v_block_elems + in_block * v_row + kvh * kv.head_dim_v;
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

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace kiln::backend::cpu
