// The gated delta net ops of ops.h (qwen35/qwen3next linear attention): the causal conv1d,
// the gated delta rule (the token-by-token recurrence, the scalar oracle, and a chunked form
// for prefill), the output gate and the query/gate split.
//
// The chunked form (Yang et al. 2024, "Gated Delta Networks", the WY/UT representation):
// within a chunk of C tokens starting from state S0, with G_t = g_1 + ... + g_t (cumulative log
// decays) and u_t = beta_t (v_t - S'^T k_t) the update each token adds (S' the state after its
// decay), the recurrence unrolls to
//   S_t = exp(G_t) S0 + sum_{s<=t} exp(G_t - G_s) k_s u_s^T
//   u_t = beta_t (v_t - exp(G_t) S0^T k_t) - sum_{s<t} beta_t exp(G_t - G_s) (k_t . k_s) u_s
//   o_t = exp(G_t) S0^T q_t + sum_{s<=t} exp(G_t - G_s) (q_t . k_s) u_s
// so the u_t solve a unit lower-triangular system (forward substitution) and everything else is
// matrix products; the chunk's last S_t carries to the next chunk. Every exp takes a difference
// G_t - G_s <= 0 (no overflow), and G is summed in double so a long run of large decays keeps
// the differences exact to fp32.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kiln/backend/cpu/ops.h"
#include "kiln/util/status.h"

namespace kiln::backend::cpu {

void sigmoid_mul(const float* x, const float* gate, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] / (1.0f + std::exp(-gate[i]));
}

void deinterleave(const float* src, int64_t n_rows, int64_t n_groups, int64_t width, float* a,
                  float* b) {
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t g = 0; g < n_groups; ++g) {
      const float* in = src + (r * n_groups + g) * 2 * width;
      std::copy_n(in, width, a + (r * n_groups + g) * width);
      std::copy_n(in + width, width, b + (r * n_groups + g) * width);
    }
  }
}

namespace {

// Sequence s's rows [begin, end) of the step, its state slot, and whether it starts from a
// zero state (its first row is position 0).
struct SeqRows {
  int64_t begin = 0, end = 0;
  int32_t slot = 0;
  bool fresh = false;
};

SeqRows seq_rows(const AttnBatch& b, const int32_t* slots, int32_t s) {
  SeqRows r;
  r.begin = b.qo_indptr[s];
  r.end = b.qo_indptr[s + 1];
  r.slot = slots[s];
  r.fresh = r.end > r.begin && b.positions[r.begin] == 0;
  return r;
}

// Channels [c0, c1) of one sequence. The slot's conv state is the sliding window itself:
// row t reads it, then it shifts by one and takes x[t].
void conv_channels(const DeltaLayerView& st, const SeqRows& r, const float* x, const float* w,
                   float* out, int64_t c0, int64_t c1) {
  const int64_t n_c = st.conv_dim, k = st.conv_k;
  float* win = st.conv + r.slot * st.slot_stride;  // [k - 1, n_c]
  if (r.fresh)
    for (int64_t j = 0; j + 1 < k; ++j) std::fill(win + j * n_c + c0, win + j * n_c + c1, 0.0f);
  for (int64_t t = r.begin; t < r.end; ++t) {
    const float* xt = x + t * n_c;
    float* ot = out + t * n_c;
    for (int64_t c = c0; c < c1; ++c) {
      const float* wc = w + c * k;
      float a = 0.0f;
      for (int64_t j = 0; j + 1 < k; ++j) a += wc[j] * win[j * n_c + c];
      a += wc[k - 1] * xt[c];
      ot[c] = a / (1.0f + std::exp(-a));
    }
    for (int64_t j = 0; j + 2 < k; ++j)
      std::copy(win + (j + 1) * n_c + c0, win + (j + 1) * n_c + c1, win + j * n_c + c0);
    if (k > 1) std::copy(xt + c0, xt + c1, win + (k - 2) * n_c + c0);
  }
}

}  // namespace

void conv1d_silu(const DeltaLayerView& st, const AttnBatch& b, const int32_t* slots, const float* x,
                 const float* w, float* out, util::ThreadPool* pool) {
  for (int32_t s = 0; s < b.num_seqs; ++s) {
    const SeqRows r = seq_rows(b, slots, s);
    if (r.end == r.begin) continue;
    // Blocks of 64 channels: a thread's columns of the window share few cache lines.
    const int64_t n_blocks = (st.conv_dim + 63) / 64;
    auto blocks = [&](int64_t first, int64_t last, int) {
      conv_channels(st, r, x, w, out, first * 64, std::min<int64_t>(last * 64, st.conv_dim));
    };
    if (pool != nullptr && (r.end - r.begin) * st.conv_dim >= (1 << 16)) {
      pool->parallel_for(n_blocks, blocks);
    } else {
      blocks(0, n_blocks, 0);
    }
  }
}

namespace {

// The step's inputs of one layer, as both forms read them.
struct DeltaInputs {
  const float* qkv;
  const float* alpha;
  const float* beta;
  const float* ssm_a;
  const float* dt_bias;
  float* out;
  DeltaParams p;
  int64_t conv_dim;
};

float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

// x * (1 / sqrt(sum x^2 + eps)) * scale, the sum in double.
void l2_normalise(const float* x, int32_t n, float eps, float scale, float* y) {
  double sum = 0.0;
  for (int32_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(sum + eps));
  for (int32_t i = 0; i < n; ++i) y[i] = x[i] * inv * scale;
}

// Row t's inputs of value head h: q and k normalised (q scaled), the row's v, beta and g.
struct RowInputs {
  const float* v;
  float beta;
  float g;
};

RowInputs prepare_row(const DeltaInputs& in, int64_t t, int32_t h, float* qn, float* kn) {
  const DeltaParams& p = in.p;
  const int32_t hk = p.key_head(h), dk = p.head_k_dim;
  const float* row = in.qkv + t * in.conv_dim;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  l2_normalise(row + int64_t{hk} * dk, dk, p.norm_eps, q_scale, qn);
  l2_normalise(row + int64_t{p.n_k_heads + hk} * dk, dk, p.norm_eps, 1.0f, kn);
  RowInputs r;
  r.v = row + 2 * int64_t{p.n_k_heads} * dk + int64_t{h} * p.head_v_dim;
  const int64_t ah = t * p.n_v_heads + h;
  r.beta = 1.0f / (1.0f + std::exp(-in.beta[ah]));
  r.g = in.ssm_a[h] * softplus(in.alpha[ah] + in.dt_bias[h]);
  return r;
}

// Per-thread scratch of both forms.
struct DeltaScratch {
  // Chunk rows: q, k [C, dk]; u, and q S0 / k S0 then the outputs [C, dv]; the decayed
  // products q_t . k_s (m) and beta_t k_t . k_s (kk) [C, C]; K^T, then k scaled by its decay to
  // the chunk's end [C, dk].
  std::vector<float> q, k, u, qs, ks, m, kk, k_end;
  std::vector<float> kv, o;  // a row [dv]
  std::vector<float> beta;
  std::vector<double> g_cum;
  explicit DeltaScratch(const DeltaParams& p)
      : q(static_cast<size_t>(kDeltaChunkRows) * p.head_k_dim),
        k(q.size()),
        u(static_cast<size_t>(kDeltaChunkRows) * p.head_v_dim),
        qs(u.size()),
        ks(u.size()),
        m(static_cast<size_t>(kDeltaChunkRows) * kDeltaChunkRows),
        kk(m.size()),
        k_end(q.size()),
        kv(static_cast<size_t>(p.head_v_dim)),
        o(kv.size()),
        beta(kDeltaChunkRows),
        g_cum(kDeltaChunkRows) {}
};

// Four floats in one SSE register (the GCC/clang vector extension). The inner loops run on
// these because -O2 leaves loops of unknown length scalar; each lane does the scalar code's
// arithmetic (x86-64's baseline has no FMA to contract into), so results are unchanged.
using f32x4 = float __attribute__((vector_size(16)));
f32x4 load4(const float* p) {
  f32x4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void store4(float* p, f32x4 v) {
  std::memcpy(p, &v, sizeof v);
}

// The inner loops over j (contiguous).
// s[j] *= decay, then kv[j] += s[j] * k.
void decay_dot(float* __restrict s, float* __restrict kv, float decay, float k, int32_t n) {
  int32_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const f32x4 sj = load4(s + j) * decay;
    store4(s + j, sj);
    store4(kv + j, load4(kv + j) + sj * k);
  }
  for (; j < n; ++j) {
    s[j] *= decay;
    kv[j] += s[j] * k;
  }
}
// s[j] += k * delta[j], then o[j] += s[j] * q.
void update_out(float* __restrict s, float* __restrict o, const float* __restrict delta, float k,
                float q, int32_t n) {
  int32_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const f32x4 sj = load4(s + j) + k * load4(delta + j);
    store4(s + j, sj);
    store4(o + j, load4(o + j) + sj * q);
  }
  for (; j < n; ++j) {
    s[j] += k * delta[j];
    o[j] += s[j] * q;
  }
}
// y[j] += a * x[j].
void axpy(float* __restrict y, const float* __restrict x, float a, int32_t n) {
  int32_t j = 0;
  for (; j + 4 <= n; j += 4) store4(y + j, load4(y + j) + a * load4(x + j));
  for (; j < n; ++j) y[j] += a * x[j];
}

// y[r][j] += sum over p in order of a(r, p) * b[p][j] for r < m, j < n, p < k, with
// a(r, p) = a[r * a_rs + p * a_ps]; b and y rows of n floats. Blocks of 4 rows x 8 columns stay
// in registers while p runs (the chunked form's matrix products).
void gemm_acc(int32_t m, int32_t n, int32_t k, const float* a, int64_t a_rs, int64_t a_ps,
              const float* __restrict b, float* __restrict y) {
  int32_t r = 0;
  for (; r + 4 <= m; r += 4) {
    int32_t j = 0;
    // The 8 accumulators written out: -O2 keeps an array of them in memory.
    float* y0 = y + int64_t{r} * n;
    float* y1 = y0 + n;
    float* y2 = y1 + n;
    float* y3 = y2 + n;
    const float* a0 = a + r * a_rs;
    for (; j + 8 <= n; j += 8) {
      f32x4 c00 = load4(y0 + j), c01 = load4(y0 + j + 4), c10 = load4(y1 + j),
            c11 = load4(y1 + j + 4), c20 = load4(y2 + j), c21 = load4(y2 + j + 4),
            c30 = load4(y3 + j), c31 = load4(y3 + j + 4);
      for (int32_t p = 0; p < k; ++p) {
        const f32x4 b0 = load4(b + int64_t{p} * n + j), b1 = load4(b + int64_t{p} * n + j + 4);
        const float* ap = a0 + p * a_ps;
        const float v0 = ap[0], v1 = ap[a_rs], v2 = ap[2 * a_rs], v3 = ap[3 * a_rs];
        c00 += v0 * b0;
        c01 += v0 * b1;
        c10 += v1 * b0;
        c11 += v1 * b1;
        c20 += v2 * b0;
        c21 += v2 * b1;
        c30 += v3 * b0;
        c31 += v3 * b1;
      }
      store4(y0 + j, c00);
      store4(y0 + j + 4, c01);
      store4(y1 + j, c10);
      store4(y1 + j + 4, c11);
      store4(y2 + j, c20);
      store4(y2 + j + 4, c21);
      store4(y3 + j, c30);
      store4(y3 + j + 4, c31);
    }
    for (int rr = 0; rr < 4; ++rr)
      for (int32_t jj = j; jj < n; ++jj)
        for (int32_t p = 0; p < k; ++p)
          y[int64_t{r + rr} * n + jj] += a[(r + rr) * a_rs + p * a_ps] * b[int64_t{p} * n + jj];
  }
  for (; r < m; ++r)
    for (int32_t p = 0; p < k; ++p)
      axpy(y + int64_t{r} * n, b + int64_t{p} * n, a[r * a_rs + p * a_ps], n);
}

// Rows [begin, end) of value head h token by token; s: the head's state [dk, dv]. The loops run
// j innermost while each sum still adds its terms in order of i.
void recurrent_rows(const DeltaInputs& in, int64_t begin, int64_t end, int32_t h, float* s,
                    DeltaScratch& sc) {
  const int32_t dk = in.p.head_k_dim, dv = in.p.head_v_dim;
  float* qn = sc.q.data();
  float* kn = sc.k.data();
  float* kv = sc.kv.data();
  float* o = sc.o.data();
  for (int64_t t = begin; t < end; ++t) {
    const RowInputs r = prepare_row(in, t, h, qn, kn);
    const float decay = std::exp(r.g);
    std::fill(kv, kv + dv, 0.0f);
    for (int32_t i = 0; i < dk; ++i) decay_dot(s + int64_t{i} * dv, kv, decay, kn[i], dv);
    for (int32_t j = 0; j < dv; ++j) kv[j] = (r.v[j] - kv[j]) * r.beta;  // kv becomes delta
    std::fill(o, o + dv, 0.0f);
    for (int32_t i = 0; i < dk; ++i) update_out(s + int64_t{i} * dv, o, kv, kn[i], qn[i], dv);
    std::copy_n(o, dv, in.out + (t * in.p.n_v_heads + h) * dv);
  }
}

// Rows [begin, end) of value head h in chunks of kDeltaChunkRows (the form derived at the top
// of this file); s as recurrent_rows. Per chunk of n rows: Q S0 and K S0 [n, dv], the
// right-hand sides, the forward substitution (row by row), the outputs exp(G_t) Q S0 + M U with
// M[t][s] = exp(G_t - G_s) (q_t . k_s) for s <= t, and the state exp(G_n) S0 + K_end^T U.
void chunked_rows(const DeltaInputs& in, int64_t begin, int64_t end, int32_t h, float* s,
                  DeltaScratch& sc) {
  const int32_t dk = in.p.head_k_dim, dv = in.p.head_v_dim, c = kDeltaChunkRows;
  float* q = sc.q.data();
  float* k = sc.k.data();
  float* u = sc.u.data();
  for (int64_t c0 = begin; c0 < end; c0 += c) {
    const int32_t n = static_cast<int32_t>(std::min<int64_t>(c, end - c0));
    double g_cum = 0.0;
    for (int32_t t = 0; t < n; ++t) {
      const RowInputs r = prepare_row(in, c0 + t, h, q + int64_t{t} * dk, k + int64_t{t} * dk);
      sc.beta[t] = r.beta;
      sc.g_cum[t] = g_cum += r.g;
      std::copy_n(r.v, dv, u + int64_t{t} * dv);
    }
    std::fill_n(sc.qs.data(), int64_t{n} * dv, 0.0f);
    std::fill_n(sc.ks.data(), int64_t{n} * dv, 0.0f);
    gemm_acc(n, dv, dk, q, dk, 1, s, sc.qs.data());
    gemm_acc(n, dv, dk, k, dk, 1, s, sc.ks.data());
    // q_t . k_s and k_t . k_s as products with K^T [dk, n], each times exp(G_t - G_s) (the
    // difference exact in double; its rounding to float moves exp by a relative 6e-8 |G_t - G_s|,
    // below 3e-8 of the largest decay).
    float* kt = sc.k_end.data();
    for (int32_t t = 0; t < n; ++t)
      for (int32_t i = 0; i < dk; ++i) kt[int64_t{i} * n + t] = k[int64_t{t} * dk + i];
    float* qk = sc.m.data();
    float* kk = sc.kk.data();
    std::fill_n(qk, int64_t{n} * n, 0.0f);
    std::fill_n(kk, int64_t{n} * n, 0.0f);
    gemm_acc(n, n, dk, q, dk, 1, kt, qk);
    gemm_acc(n, n, dk, k, dk, 1, kt, kk);
    for (int32_t t = 0; t < n; ++t)
      for (int32_t s_ = 0; s_ < n; ++s_) {
        const float d = s_ > t ? 0.0f : std::exp(static_cast<float>(sc.g_cum[t] - sc.g_cum[s_]));
        qk[t * n + s_] *= d;
        kk[t * n + s_] *= d * sc.beta[t];
      }
    // The right-hand sides beta_t (v_t - exp(G_t) S0^T k_t), then the forward substitution
    // u_t -= beta_t exp(G_t - G_s) (k_t . k_s) u_s for s < t.
    for (int32_t t = 0; t < n; ++t) {
      float* ut = u + int64_t{t} * dv;
      const float* kst = sc.ks.data() + int64_t{t} * dv;
      const float e = static_cast<float>(std::exp(sc.g_cum[t]));
      for (int32_t j = 0; j < dv; ++j) ut[j] = sc.beta[t] * (ut[j] - e * kst[j]);
      for (int32_t s_ = 0; s_ < t; ++s_) axpy(ut, u + int64_t{s_} * dv, -kk[t * n + s_], dv);
    }
    // Outputs exp(G_t) Q S0 + M U, M = qk masked and decayed (sc.qs becomes the outputs).
    for (int32_t t = 0; t < n; ++t) {
      const float e = static_cast<float>(std::exp(sc.g_cum[t]));
      float* ot = sc.qs.data() + int64_t{t} * dv;
      for (int32_t j = 0; j < dv; ++j) ot[j] *= e;
    }
    gemm_acc(n, dv, n, qk, n, 1, u, sc.qs.data());
    for (int32_t t = 0; t < n; ++t)
      std::copy_n(sc.qs.data() + int64_t{t} * dv, dv,
                  in.out + ((c0 + t) * in.p.n_v_heads + h) * dv);
    // The state after the chunk: exp(G_n) S0 + sum_t exp(G_n - G_t) k_t u_t^T.
    const double g_last = sc.g_cum[n - 1];
    for (int32_t t = 0; t < n; ++t) {
      const float to_end = static_cast<float>(std::exp(g_last - sc.g_cum[t]));
      for (int32_t i = 0; i < dk; ++i)
        sc.k_end[int64_t{t} * dk + i] = to_end * k[int64_t{t} * dk + i];
    }
    const float e = static_cast<float>(std::exp(g_last));
    for (int64_t i = 0; i < int64_t{dk} * dv; ++i) s[i] *= e;
    gemm_acc(dk, dv, n, sc.k_end.data(), 1, dk, u, s);
  }
}

DeltaInputs delta_inputs(const DeltaLayerView& st, const float* qkv, const float* alpha,
                         const float* beta, const float* ssm_a, const float* dt_bias, float* out,
                         const DeltaParams& p) {
  KILN_ASSERT(st.conv_dim ==
              2 * int64_t{p.n_k_heads} * p.head_k_dim + int64_t{p.n_v_heads} * p.head_v_dim);
  KILN_ASSERT(p.n_k_heads > 0 && p.n_v_heads % p.n_k_heads == 0);
  return {qkv, alpha, beta, ssm_a, dt_bias, out, p, st.conv_dim};
}

int64_t head_values(const DeltaParams& p) {
  return int64_t{p.head_k_dim} * p.head_v_dim;
}

}  // namespace

void gated_delta_rule_reference(const DeltaLayerView& st, const AttnBatch& b, const int32_t* slots,
                                const float* qkv, const float* alpha, const float* beta,
                                const float* ssm_a, const float* dt_bias, float* out,
                                const DeltaParams& p) {
  const DeltaInputs in = delta_inputs(st, qkv, alpha, beta, ssm_a, dt_bias, out, p);
  DeltaScratch sc(p);
  for (int32_t s = 0; s < b.num_seqs; ++s) {
    const SeqRows r = seq_rows(b, slots, s);
    if (r.end == r.begin) continue;
    float* ssm = st.ssm + r.slot * st.slot_stride;
    if (r.fresh) std::fill(ssm, ssm + p.n_v_heads * head_values(p), 0.0f);
    for (int32_t h = 0; h < p.n_v_heads; ++h)
      recurrent_rows(in, r.begin, r.end, h, ssm + h * head_values(p), sc);
  }
}

void gated_delta_rule(const DeltaLayerView& st, const AttnBatch& b, const int32_t* slots,
                      const float* qkv, const float* alpha, const float* beta, const float* ssm_a,
                      const float* dt_bias, float* out, const DeltaParams& p,
                      util::ThreadPool* pool, DeltaForm form) {
  const DeltaInputs in = delta_inputs(st, qkv, alpha, beta, ssm_a, dt_bias, out, p);
  auto items = [&](int64_t first, int64_t last, int) {
    DeltaScratch sc(p);
    for (int64_t item = first; item < last; ++item) {
      const int32_t h = static_cast<int32_t>(item % p.n_v_heads);
      const SeqRows r = seq_rows(b, slots, static_cast<int32_t>(item / p.n_v_heads));
      if (r.end == r.begin) continue;
      float* s = st.ssm + r.slot * st.slot_stride + h * head_values(p);
      if (r.fresh) std::fill(s, s + head_values(p), 0.0f);
      const bool chunked = form == DeltaForm::kChunked ||
                           (form == DeltaForm::kAuto && r.end - r.begin >= kDeltaChunkMinRows);
      if (chunked) {
        chunked_rows(in, r.begin, r.end, h, s, sc);
      } else {
        recurrent_rows(in, r.begin, r.end, h, s, sc);
      }
    }
  };
  const int64_t n_items = int64_t{b.num_seqs} * p.n_v_heads;
  if (pool != nullptr) {
    pool->parallel_for(n_items, items);
  } else {
    items(0, n_items, 0);
  }
}

}  // namespace kiln::backend::cpu
