// The AVX2 attention and small ops against their scalar references (attention.h), the KV
// write/read round trip per cache type, and batch invariance of the fast attention.
//
// Bounds (stated in attention.h): exp relative 4e-7 on [-87, 88]; attention outputs within
// 1e-6 of the largest |V| (1e-5 with softcap): scores and softmax in another order,
// per-block online softmax, vector exp; swiglu/geglu within 2e-6 * |gate * up|; rmsnorm within 1e-6
// relative; add and scale bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kiln/backend/cpu/attention.h"
#include "kiln/backend/cpu/ops.h"
#include "kiln/quant/convert.h"
#include "kiln/quant/fp16.h"
#include "kiln/quant/types.h"
#include "kiln/util/thread_pool.h"

namespace kiln::backend::cpu {
namespace {

using quant::Type;

std::vector<float> random_vec(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

#define SKIP_WITHOUT_AVX2() \
  if (!avx2_ops_available()) GTEST_SKIP() << "no AVX2+FMA+F16C on this CPU"

TEST(VecMath, ExpRelativeErrorBelow4e7) {
  SKIP_WITHOUT_AVX2();
  std::vector<float> x;
  for (double v = -87.0; v <= 88.0; v += 0.000731) x.push_back(static_cast<float>(v));
  for (float v : {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 1e-8f, -1e-8f}) x.push_back(v);
  std::vector<float> y(x.size());
  exp_avx2(x.data(), y.data(), static_cast<int64_t>(x.size()));
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    worst = std::max(worst, std::fabs(y[i] - want) / want);
  }
  EXPECT_LT(worst, 4e-7);
  std::printf("exp_avx2: max relative error %.3g over %zu points\n", worst, x.size());
  // Underflow to exactly 0; exp(0) exactly 1 (the softmax relies on both).
  const float special[8] = {-INFINITY, -1000.0f, -87.5f, 0.0f, -87.0f, 88.0f, 100.0f, -0.0f};
  float out[8];
  exp_avx2(special, out, 8);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[3], 1.0f);
  EXPECT_GT(out[4], 0.0f);
  EXPECT_TRUE(std::isfinite(out[5]));
  EXPECT_TRUE(std::isfinite(out[6]));  // clamped, never inf
  EXPECT_EQ(out[7], 1.0f);
}

TEST(SmallOps, SwigluGegluMatchReference) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(1);
  for (int64_t n : {1, 7, 8, 9, 31, 64, 4099}) {
    const std::vector<float> g = random_vec(rng, n, -20, 20), u = random_vec(rng, n, -3, 3);
    std::vector<float> a(n), b(n);
    for (int which = 0; which < 2; ++which) {
      if (which == 0) {
        swiglu_avx2(g.data(), u.data(), a.data(), n);
        swiglu_reference(g.data(), u.data(), b.data(), n);
      } else {
        geglu_avx2(g.data(), u.data(), a.data(), n);
        geglu_reference(g.data(), u.data(), b.data(), n);
      }
      for (int64_t i = 0; i < n; ++i)
        ASSERT_LE(std::fabs(a[i] - b[i]), 2e-6f * std::fabs(g[i] * u[i]) + 1e-30f)
            << (which ? "geglu" : "swiglu") << " n " << n << " gate " << g[i];
    }
  }
  // In place (the forward writes over gate).
  std::vector<float> g = random_vec(rng, 21, -5, 5), u = random_vec(rng, 21, -1, 1), want(21);
  swiglu_reference(g.data(), u.data(), want.data(), 21);
  swiglu_avx2(g.data(), u.data(), g.data(), 21);
  for (int i = 0; i < 21; ++i) EXPECT_NEAR(g[i], want[i], 2e-6f * std::fabs(want[i]) + 1e-30f);
}

TEST(SmallOps, RmsnormAddScaleMatchReference) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(2);
  for (int64_t n : {1, 5, 8, 13, 64, 1024, 1027}) {
    const int64_t rows = 3;
    const std::vector<float> x = random_vec(rng, rows * n, -4, 4), w = random_vec(rng, n, -2, 2);
    for (const float* wp : {w.data(), static_cast<const float*>(nullptr)}) {
      std::vector<float> a(rows * n), b(rows * n);
      rmsnorm_avx2(x.data(), wp, a.data(), rows, n, 1e-6f);
      rmsnorm_reference(x.data(), wp, b.data(), rows, n, 1e-6f);
      for (int64_t i = 0; i < rows * n; ++i)
        ASSERT_LE(std::fabs(a[i] - b[i]), 1e-6f * std::fabs(b[i]) + 1e-30f) << n;
    }
    std::vector<float> s1 = x, s2 = x;
    add_avx2(s1.data(), w.data(), n);
    for (int64_t i = 0; i < n; ++i) s2[i] += w[i];
    scale_avx2(s1.data(), 0.37f, rows * n);
    for (int64_t i = 0; i < rows * n; ++i) s2[i] *= 0.37f;
    EXPECT_EQ(0, std::memcmp(s1.data(), s2.data(), s1.size() * 4)) << n;
  }
}

TEST(SmallOps, Fp16ConversionEqualsReference) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(7);
  std::vector<float> x = random_vec(rng, 1000, -70000, 70000);
  const std::vector<float> small = random_vec(rng, 1000, -1e-4f, 1e-4f);  // subnormal f16
  x.insert(x.end(), small.begin(), small.end());
  for (float v : {0.0f, -0.0f, 65504.0f, 65520.0f, 1e9f, -INFINITY, 5.96e-8f, 2.98e-8f})
    x.push_back(v);
  std::vector<uint16_t> y(x.size() * 3, 0xABCD);
  fp32_to_fp16_avx2(x.data(), y.data(), static_cast<int64_t>(x.size()), 3);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(y[i * 3], quant::fp32_to_fp16(x[i])) << x[i];
    ASSERT_EQ(y[i * 3 + 1], 0xABCD);  // the stride's gaps are untouched
  }
}

// A paged cache with random contents and a batch of sequences over scattered blocks.
struct PagedCase {
  std::vector<uint8_t> k, v;
  KvLayerView view;
  std::vector<int32_t> qo{0}, kv_ptr{0}, kv_idx, kv_len, pos;
  std::vector<float> q;
  AttnBatch batch() const {
    return {static_cast<int32_t>(kv_len.size()),
            qo.data(),
            kv_ptr.data(),
            kv_idx.data(),
            kv_len.data(),
            pos.data()};
  }
  int64_t n_rows() const { return qo.back(); }
};

// seqs: (kv_len, n_queries); queries are the last n_queries positions of each sequence.
PagedCase make_setup(std::mt19937& rng, Type type, int32_t n_kv_heads, int32_t n_heads, int32_t dk,
                     int32_t dv, const std::vector<std::pair<int32_t, int32_t>>& seqs) {
  PagedCase s;
  int32_t n_blocks = 0;
  for (auto [len, nq] : seqs) n_blocks += (len + 15) / 16;
  n_blocks += 3;  // spare blocks, never read
  std::vector<uint8_t> k_bytes, v_bytes;
  const int64_t k_row = static_cast<int64_t>(*quant::row_bytes(type, dk));
  const int64_t v_row = static_cast<int64_t>(*quant::row_bytes(type, dv));
  s.k.assign(static_cast<size_t>(n_blocks) * 16 * n_kv_heads * k_row, 0);
  s.v.assign(static_cast<size_t>(n_blocks) * 16 * n_kv_heads * v_row, 0);
  s.view = make_kv_view(type, s.k.data(), s.v.data(), 16, n_kv_heads, dk, dv);
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  size_t next = 0;
  // Write every position of every sequence through kv_write (one batch of all positions).
  std::vector<int32_t> w_qo{0}, w_pos;
  for (auto [len, nq] : seqs) {
    for (int32_t b = 0; b < (len + 15) / 16; ++b) s.kv_idx.push_back(perm[next++]);
    s.kv_ptr.push_back(static_cast<int32_t>(s.kv_idx.size()));
    s.kv_len.push_back(len);
    s.qo.push_back(s.qo.back() + nq);
    for (int32_t p = len - nq; p < len; ++p) s.pos.push_back(p);
    w_qo.push_back(w_qo.back() + len);
    for (int32_t p = 0; p < len; ++p) w_pos.push_back(p);
  }
  const int64_t n_w = w_qo.back();
  const std::vector<float> kf = random_vec(rng, n_w * n_kv_heads * dk, -1, 1);
  const std::vector<float> vf = random_vec(rng, n_w * n_kv_heads * dv, -1, 1);
  const AttnBatch wb{static_cast<int32_t>(seqs.size()),
                     w_qo.data(),
                     s.kv_ptr.data(),
                     s.kv_idx.data(),
                     s.kv_len.data(),
                     w_pos.data()};
  kv_write(s.view, wb, kf.data(), vf.data());
  s.q = random_vec(rng, s.n_rows() * n_heads * dk, -1, 1);
  return s;
}

TEST(KvWrite, RoundTripPerType) {
  std::mt19937 rng(3);
  for (Type type : {Type::F32, Type::F16, Type::Q8_0}) {
    const int32_t dk = 64, dv = 32, heads = 2, len = 37;
    PagedCase s = make_setup(rng, type, heads, heads, dk, dv, {{len, 1}});
    // Rewrite known values at position 21 and read them back.
    const std::vector<float> kf = random_vec(rng, heads * dk, -3, 3);
    const std::vector<float> vf = random_vec(rng, heads * dv, -3, 3);
    const int32_t qo[2] = {0, 1}, p21[1] = {21};
    const AttnBatch b{1, qo, s.kv_ptr.data(), s.kv_idx.data(), s.kv_len.data(), p21};
    kv_write(s.view, b, kf.data(), vf.data());
    const int64_t block = s.kv_idx[21 / 16];
    for (int32_t h = 0; h < heads; ++h) {
      std::vector<float> kr(dk), vr(dv), kwant(dk), vwant(dv);
      std::vector<uint8_t> tmp(*quant::row_bytes(type, dk));
      ASSERT_TRUE(quant::quantize_row(type, kf.data() + h * dk, tmp.data(), dk).ok());
      ASSERT_TRUE(quant::dequantize_row(type, tmp.data(), kwant.data(), dk).ok());
      ASSERT_TRUE(quant::quantize_row(type, vf.data() + h * dv, tmp.data(), dv).ok());
      ASSERT_TRUE(quant::dequantize_row(type, tmp.data(), vwant.data(), dv).ok());
      kv_read_k(s.view, block, 21 % 16, h, kr.data());
      kv_read_v(s.view, block, 21 % 16, h, vr.data());
      EXPECT_EQ(kr, kwant) << quant::type_name(type);
      EXPECT_EQ(vr, vwant) << quant::type_name(type);
      if (type == Type::F32) {
        EXPECT_EQ(0, std::memcmp(kr.data(), kf.data() + h * dk, dk * 4));
      }
    }
  }
}

struct AttnCase {
  Type type;
  int32_t group, dk, window;
  float softcap;
};

TEST(Attention, Avx2MatchesReference) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(4);
  const AttnCase cases[] = {
      {Type::F32, 1, 64, 0, 0},   {Type::F16, 2, 128, 0, 0},   {Type::Q8_0, 4, 64, 0, 0},
      {Type::F32, 8, 256, 0, 0},  {Type::F16, 2, 64, 20, 0},   {Type::Q8_0, 1, 128, 0, 30},
      {Type::F16, 4, 256, 0, 50}, {Type::F32, 2, 128, 33, 20}, {Type::Q8_0, 8, 128, 17, 0},
      {Type::F16, 8, 64, 0, 0},   {Type::F32, 4, 128, 0, 0},   {Type::Q8_0, 2, 256, 0, 0},
      {Type::F16, 1, 256, 0, 0},
  };
  util::ThreadPool pool(2);
  for (const AttnCase& c : cases) {
    const int32_t n_kv = 2, n_heads = n_kv * c.group;
    // Ragged: prefill from 0, a chunk after a cached prefix, one decode, a block-exact one.
    PagedCase s =
        make_setup(rng, c.type, n_kv, n_heads, c.dk, c.dk, {{19, 19}, {53, 11}, {40, 1}, {32, 3}});
    AttnParams p;
    p.n_heads = n_heads;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.dk)) * 2.0f;  // sharper than 1/sqrt(d)
    p.softcap = c.softcap;
    p.sliding_window = c.window;
    const int64_t n_out = s.n_rows() * n_heads * c.dk;
    std::vector<float> fast(n_out), ref(n_out);
    const AttnBatch b = s.batch();
    attention_avx2(s.view, b, s.q.data(), fast.data(), p, &pool);
    attention_reference(s.view, b, s.q.data(), ref.data(), p, nullptr);
    float worst = 0;
    for (int64_t i = 0; i < n_out; ++i) worst = std::max(worst, std::fabs(fast[i] - ref[i]));
    // |V| <= 1: bound 1e-6 absolute, 1e-5 with softcap (tanh8's absolute error times the cap
    // moves the scores); measured 1.5e-7..2.4e-7 and 0.9e-6..3.8e-6.
    EXPECT_LE(worst, c.softcap > 0 ? 1e-5f : 1e-6f)
        << quant::type_name(c.type) << " group " << c.group << " dk " << c.dk << " window "
        << c.window << " softcap " << c.softcap;
    EXPECT_GT(worst, 0.0f);  // different arithmetic: equality would mean a path was not run
    std::printf("%s group %d dk %d window %d softcap %g: max |fast - ref| %.3g\n",
                std::string(quant::type_name(c.type)).c_str(), c.group, c.dk, c.window, c.softcap,
                worst);
  }
}

// A token's output is bitwise the same computed alone (one row, no pool) or inside a batch
// of sequences split into tiles over two threads.
TEST(Attention, Avx2BatchInvariant) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(5);
  for (int32_t group : {1, 2, 8}) {
    const int32_t n_kv = 2, n_heads = n_kv * group, d = 64;
    PagedCase s = make_setup(rng, Type::F16, n_kv, n_heads, d, d, {{45, 45}, {70, 23}, {9, 1}});
    AttnParams p;
    p.n_heads = n_heads;
    p.scale = 0.125f;
    p.sliding_window = group == 2 ? 21 : 0;
    util::ThreadPool pool(2);
    const int64_t row_out = int64_t{n_heads} * d;
    std::vector<float> all(s.n_rows() * row_out);
    attention_avx2(s.view, s.batch(), s.q.data(), all.data(), p, &pool);
    for (int32_t seq = 0; seq < 3; ++seq) {
      for (int32_t t = s.qo[seq]; t < s.qo[seq + 1]; ++t) {
        const int32_t qo[2] = {0, 1};
        const AttnBatch one{
            1, qo, s.kv_ptr.data() + seq, s.kv_idx.data(), s.kv_len.data() + seq, s.pos.data() + t};
        std::vector<float> alone(row_out);
        attention_avx2(s.view, one, s.q.data() + t * n_heads * d, alone.data(), p, nullptr);
        ASSERT_EQ(0, std::memcmp(alone.data(), all.data() + t * row_out, row_out * 4))
            << "group " << group << " seq " << seq << " row " << t;
      }
    }
  }
}

}  // namespace
}  // namespace kiln::backend::cpu
