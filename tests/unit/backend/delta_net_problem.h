// Random problems for the gated delta net tests (CPU and CUDA): a layer's weights, whole
// token streams of inputs per sequence, and steps cut from them (parts of sequences in slots),
// with the step metadata a backend uploads.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kiln/backend/backend.h"

namespace kiln::test {

using backend::DeltaParams;
using backend::HostStep;
using backend::StateSpec;

struct Shape {
  int32_t hk = 2, hv = 4, dk = 8, dv = 6, conv_k = 4;
  bool tiled = true;  // DeltaParams::tiled_heads (false: qwen3next's grouped value heads)
  int32_t key_head(int32_t h) const { return tiled ? h % hk : h / (hv / hk); }
  int32_t conv_dim() const { return 2 * hk * dk + hv * dv; }
};

inline StateSpec spec_of(const Shape& s, int32_t n_layer = 2) {
  StateSpec sp;
  sp.n_layer = n_layer;
  sp.conv_dim = s.conv_dim();
  sp.conv_k = s.conv_k;
  sp.n_k_heads = s.hk;
  sp.n_v_heads = s.hv;
  sp.head_k_dim = s.dk;
  sp.head_v_dim = s.dv;
  return sp;
}

inline DeltaParams params_of(const Shape& s) {
  DeltaParams p;
  p.n_k_heads = s.hk;
  p.n_v_heads = s.hv;
  p.head_k_dim = s.dk;
  p.head_v_dim = s.dv;
  p.tiled_heads = s.tiled;
  return p;
}

inline std::vector<float> uniform(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A layer's weights and, per sequence, the whole token stream of its inputs.
struct Problem {
  Shape shape;
  std::vector<float> conv_w;          // [conv_dim, conv_k]
  std::vector<float> ssm_a, dt_bias;  // [hv]
  struct Seq {
    int32_t len = 0;
    std::vector<float> x;            // [len, conv_dim]: the conv's or the rule's input
    std::vector<float> alpha, beta;  // [len, hv]
  };
  std::vector<Seq> seqs;

  Problem(const Shape& s, const std::vector<int32_t>& lens, uint32_t seed) : shape(s) {
    std::mt19937 rng(seed);
    conv_w = uniform(rng, size_t(s.conv_dim()) * s.conv_k, -0.7f, 0.7f);
    // Decays from exp(-4) per token to ~exp(-0.01) (long memory), as trained layers have.
    ssm_a = uniform(rng, s.hv, -1.5f, -0.01f);
    dt_bias = uniform(rng, s.hv, -1.0f, 1.0f);
    for (int32_t len : lens) {
      Seq q;
      q.len = len;
      q.x = uniform(rng, size_t(len) * s.conv_dim(), -1.0f, 1.0f);
      q.alpha = uniform(rng, size_t(len) * s.hv, -3.0f, 2.0f);
      q.beta = uniform(rng, size_t(len) * s.hv, -3.0f, 3.0f);
      seqs.push_back(std::move(q));
    }
  }
};

// Sequence `seq`'s rows [pos0, pos0 + n) in state slot `slot`.
struct Part {
  int32_t seq = 0, slot = 0, pos0 = 0, n = 0;
};

// A step over parts, its flat inputs, and its metadata in host vectors.
struct Step {
  std::vector<int32_t> tokens, positions, qo{0}, kv_indptr{0}, kv_len, slots;
  std::vector<float> x, alpha, beta;
  int64_t n = 0;

  Step(const Problem& pr, const std::vector<Part>& parts) {
    const int64_t c = pr.shape.conv_dim(), hv = pr.shape.hv;
    for (const Part& p : parts) {
      const Problem::Seq& s = pr.seqs[p.seq];
      for (int32_t i = 0; i < p.n; ++i) {
        tokens.push_back(0);
        positions.push_back(p.pos0 + i);
      }
      x.insert(x.end(), s.x.begin() + p.pos0 * c, s.x.begin() + (p.pos0 + p.n) * c);
      alpha.insert(alpha.end(), s.alpha.begin() + p.pos0 * hv,
                   s.alpha.begin() + (p.pos0 + p.n) * hv);
      beta.insert(beta.end(), s.beta.begin() + p.pos0 * hv, s.beta.begin() + (p.pos0 + p.n) * hv);
      qo.push_back(qo.back() + p.n);
      kv_indptr.push_back(0);
      kv_len.push_back(p.pos0 + p.n);
      slots.push_back(p.slot);
    }
    n = static_cast<int64_t>(tokens.size());
  }
  HostStep host() const {
    HostStep h;
    h.tokens = tokens;
    h.attn.num_seqs = static_cast<int32_t>(slots.size());
    h.attn.qo_indptr = qo.data();
    h.attn.kv_indptr = kv_indptr.data();
    h.attn.kv_indices = nullptr;
    h.attn.kv_len = kv_len.data();
    h.attn.positions = positions.data();
    h.state_slots = slots;
    return h;
  }
};

inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(double(x)));
  return m;
}

// |got - want| <= tol * scale everywhere (NaN fails), scale = max(max|want|, floor); prints the
// worst error over scale.
inline void expect_near_scaled(const std::vector<float>& got, const std::vector<float>& want,
                               double tol, const std::string& what, double floor = 0.0) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double scale = std::max({max_abs(want), floor, 1e-30});
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - want[i]) / scale;
    ASSERT_TRUE(e <= tol) << what << ": element " << i << " got " << got[i] << " want " << want[i];
    worst = std::max(worst, e);
  }
  std::printf("  %-50s worst %.2e of the scale (bound %.0e)\n", what.c_str(), worst, tol);
}

// The error scale of a delta rule output: o[j] = sum_i q[i] S[i][j] with |q| = 1 / sqrt(dk) and
// state columns about as large as v (|v| <= 1 here), so rounding errors are relative to
// 1 / sqrt(dk) even where the sum cancels (q . k of a step's only row can be ~0).
inline double out_floor(const Shape& s) {
  return 1.0 / std::sqrt(double(s.dk));
}

}  // namespace kiln::test
