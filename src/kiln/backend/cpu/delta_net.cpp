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
  std::vector<float> q, k, u, kv, o;  // chunk rows of q, k, u; a row of kv / o
  std::vector<float> beta;
  std::vector<float> to_end;  // exp(G_n - G_t): a chunk row's decay to the chunk's end
  std::vector<double> g_cum;
  explicit DeltaScratch(const DeltaParams& p)
      : q(static_cast<size_t>(kDeltaChunkRows) * p.head_k_dim),
        k(static_cast<size_t>(kDeltaChunkRows) * p.head_k_dim),
        u(static_cast<size_t>(kDeltaChunkRows) * p.head_v_dim),
        kv(static_cast<size_t>(p.head_v_dim)),
        o(static_cast<size_t>(p.head_v_dim)),
        beta(kDeltaChunkRows),
        to_end(kDeltaChunkRows),
        g_cum(kDeltaChunkRows) {}
};

// The inner loops over j (contiguous; restrict lets the compiler vectorise them, which keeps
// each element's arithmetic as written).
// s[j] *= decay, then kv[j] += s[j] * k.
void decay_dot(float* __restrict s, float* __restrict kv, float decay, float k, int32_t n) {
  for (int32_t j = 0; j < n; ++j) {
    s[j] *= decay;
    kv[j] += s[j] * k;
  }
}
// s[j] += k * delta[j], then o[j] += s[j] * q.
void update_out(float* __restrict s, float* __restrict o, const float* __restrict delta, float k,
                float q, int32_t n) {
  for (int32_t j = 0; j < n; ++j) {
    s[j] += k * delta[j];
    o[j] += s[j] * q;
  }
}
// y[j] += a * x[j].
void axpy(float* __restrict y, const float* __restrict x, float a, int32_t n) {
  for (int32_t j = 0; j < n; ++j) y[j] += a * x[j];
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

float dot(const float* a, const float* b, int32_t n) {
  float acc = 0.0f;
  for (int32_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// y[j] = sum_i x[i] s[i][j] over the state [dk, dv].
void times_state(const float* x, const float* s, int32_t dk, int32_t dv, float* y) {
  std::fill(y, y + dv, 0.0f);
  for (int32_t i = 0; i < dk; ++i) axpy(y, s + int64_t{i} * dv, x[i], dv);
}

// Rows [begin, end) of value head h in chunks of kDeltaChunkRows (the form derived at the top
// of this file); s as recurrent_rows.
void chunked_rows(const DeltaInputs& in, int64_t begin, int64_t end, int32_t h, float* s,
                  DeltaScratch& sc) {
  const int32_t dk = in.p.head_k_dim, dv = in.p.head_v_dim;
  float* kv = sc.kv.data();
  for (int64_t c0 = begin; c0 < end; c0 += kDeltaChunkRows) {
    const int32_t n = static_cast<int32_t>(std::min<int64_t>(kDeltaChunkRows, end - c0));
    double g_cum = 0.0;
    for (int32_t t = 0; t < n; ++t) {
      float* qt = sc.q.data() + int64_t{t} * dk;
      float* kt = sc.k.data() + int64_t{t} * dk;
      const RowInputs r = prepare_row(in, c0 + t, h, qt, kt);
      sc.beta[t] = r.beta;
      sc.g_cum[t] = g_cum += r.g;
      // The right-hand side beta_t (v_t - exp(G_t) S0^T k_t).
      times_state(kt, s, dk, dv, kv);
      const float e = static_cast<float>(std::exp(g_cum));
      float* ut = sc.u.data() + int64_t{t} * dv;
      for (int32_t j = 0; j < dv; ++j) ut[j] = r.beta * (r.v[j] - e * kv[j]);
    }
    // Forward substitution: u_t -= beta_t exp(G_t - G_s) (k_t . k_s) u_s for s < t.
    for (int32_t t = 1; t < n; ++t) {
      const float* kt = sc.k.data() + int64_t{t} * dk;
      float* ut = sc.u.data() + int64_t{t} * dv;
      for (int32_t s_ = 0; s_ < t; ++s_) {
        const float a = sc.beta[t] * static_cast<float>(std::exp(sc.g_cum[t] - sc.g_cum[s_])) *
                        dot(kt, sc.k.data() + int64_t{s_} * dk, dk);
        axpy(ut, sc.u.data() + int64_t{s_} * dv, -a, dv);
      }
    }
    // Outputs, from S0 and the chunk's updates.
    for (int32_t t = 0; t < n; ++t) {
      const float* qt = sc.q.data() + int64_t{t} * dk;
      float* o = sc.o.data();
      times_state(qt, s, dk, dv, kv);
      const float e = static_cast<float>(std::exp(sc.g_cum[t]));
      for (int32_t j = 0; j < dv; ++j) o[j] = e * kv[j];
      for (int32_t s_ = 0; s_ <= t; ++s_) {
        const float a = static_cast<float>(std::exp(sc.g_cum[t] - sc.g_cum[s_])) *
                        dot(qt, sc.k.data() + int64_t{s_} * dk, dk);
        axpy(o, sc.u.data() + int64_t{s_} * dv, a, dv);
      }
      std::copy_n(o, dv, in.out + ((c0 + t) * in.p.n_v_heads + h) * dv);
    }
    // The state after the chunk: exp(G_n) S0 + sum_s exp(G_n - G_s) k_s u_s^T.
    const double g_last = sc.g_cum[n - 1];
    const float e = static_cast<float>(std::exp(g_last));
    for (int32_t t = 0; t < n; ++t)
      sc.to_end[t] = static_cast<float>(std::exp(g_last - sc.g_cum[t]));
    for (int32_t i = 0; i < dk; ++i) {
      float* si = s + int64_t{i} * dv;
      for (int32_t j = 0; j < dv; ++j) si[j] *= e;
      for (int32_t t = 0; t < n; ++t)
        axpy(si, sc.u.data() + int64_t{t} * dv, sc.to_end[t] * sc.k[int64_t{t} * dk + i], dv);
    }
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
