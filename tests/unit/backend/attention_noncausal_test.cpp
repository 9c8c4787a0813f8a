// Non-causal paged attention on the CPU (AttnParams::causal false, as an encoder attends):
// the scalar reference, the AVX2 kernel and the dispatching attention() against a plain
// long-double softmax over the same stored (decoded) K/V, on batches of several sequences
// (F32, F16 and Q8_0 caches, head dims 40, 64 and 128, GQA). Bound: 2e-6 of max |V| (fp32 dot
// products and online softmax; measured up to 6e-7). The data tells the masks apart: the causal
// result differs by more than 0.05, so a kept causal mask fails. Also the AVX2 kernel's batch
// invariance without the mask, and the refusal of a sliding window without the order.
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

// A paged cache with random contents written by kv_write, and the query batch: seqs are
// (kv_len, n_queries), the queries the last n_queries positions of each sequence.
struct PagedCase {
  std::vector<uint8_t> k, v;
  KvLayerView view;
  std::vector<int32_t> qo{0}, kv_ptr{0}, kv_idx, kv_len, pos;
  std::vector<float> q, vf;
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

PagedCase make_case(std::mt19937& rng, Type type, int32_t n_kv_heads, int32_t n_heads, int32_t d,
                    const std::vector<std::pair<int32_t, int32_t>>& seqs) {
  PagedCase s;
  int32_t n_blocks = 2;  // spare blocks, never read
  for (auto [len, nq] : seqs) n_blocks += (len + 15) / 16;
  const int64_t row = static_cast<int64_t>(*quant::row_bytes(type, d));
  s.k.assign(static_cast<size_t>(n_blocks) * 16 * n_kv_heads * row, 0);
  s.v.assign(static_cast<size_t>(n_blocks) * 16 * n_kv_heads * row, 0);
  s.view = make_kv_view(type, s.k.data(), s.v.data(), 16, n_kv_heads, d, d);
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  size_t next = 0;
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
  const std::vector<float> kf = random_vec(rng, w_qo.back() * n_kv_heads * d, -1, 1);
  s.vf = random_vec(rng, w_qo.back() * n_kv_heads * d, -1, 1);
  const AttnBatch wb{static_cast<int32_t>(seqs.size()),
                     w_qo.data(),
                     s.kv_ptr.data(),
                     s.kv_idx.data(),
                     s.kv_len.data(),
                     w_pos.data()};
  kv_write(s.view, wb, kf.data(), s.vf.data());
  // Sharp scores (|q| up to 3), so the softmax weights differ a lot between keys.
  s.q = random_vec(rng, s.n_rows() * n_heads * d, -3, 3);
  return s;
}

// Softmax attention in long double over the stored (decoded) K/V: row t of sequence s sees
// keys 0 .. kv_len[s] - 1, or 0 .. pos[t] when causal.
std::vector<double> attention_ld(const PagedCase& c, int32_t n_heads, int32_t d, float scale,
                                 bool causal) {
  const KvLayerView& kv = c.view;
  const int32_t group = n_heads / kv.n_kv_heads;
  std::vector<double> out(static_cast<size_t>(c.n_rows() * n_heads * d));
  std::vector<float> kr(d), vr(d);
  for (int32_t s = 0; s < static_cast<int32_t>(c.kv_len.size()); ++s) {
    for (int32_t t = c.qo[s]; t < c.qo[s + 1]; ++t) {
      const int32_t n_keys = causal ? c.pos[t] + 1 : c.kv_len[s];
      for (int32_t h = 0; h < n_heads; ++h) {
        const float* qh = c.q.data() + (int64_t{t} * n_heads + h) * d;
        std::vector<long double> score(n_keys), acc(d, 0.0L);
        long double mx = -INFINITY, sum = 0;
        for (int32_t p = 0; p < n_keys; ++p) {
          kv_read_k(kv, c.kv_idx[c.kv_ptr[s] + p / 16], p % 16, h / group, kr.data());
          long double dot = 0;
          for (int32_t i = 0; i < d; ++i) dot += static_cast<long double>(qh[i]) * kr[i];
          score[p] = dot * scale;
          mx = std::max(mx, score[p]);
        }
        for (int32_t p = 0; p < n_keys; ++p) {
          const long double e = std::exp(score[p] - mx);
          sum += e;
          kv_read_v(kv, c.kv_idx[c.kv_ptr[s] + p / 16], p % 16, h / group, vr.data());
          for (int32_t i = 0; i < d; ++i) acc[i] += e * vr[i];
        }
        for (int32_t i = 0; i < d; ++i)
          out[(int64_t{t} * n_heads + h) * d + i] = static_cast<double>(acc[i] / sum);
      }
    }
  }
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) w = std::max(w, std::fabs(a[i] - b[i]));
  return w;
}

// Both CPU attention paths with causal = false, against the long-double reference, on batches
// of several sequences: whole-sequence encoder rows (1 token, off the block size, block-exact,
// several blocks), a chunk of queries after cached keys and a lone query before the end.
TEST(NonCausalAttention, MatchesLongDoubleReference) {
  std::mt19937 rng(35);
  util::ThreadPool pool(2);
  struct Geo {
    Type type;
    int32_t group, d;
  };
  const Geo geos[] = {{Type::F32, 1, 64},  {Type::F16, 4, 64},  {Type::F16, 1, 128},
                      {Type::F32, 4, 128}, {Type::Q8_0, 2, 64}, {Type::F16, 3, 40}};
  const std::vector<std::pair<int32_t, int32_t>> seqs = {{1, 1},   {37, 37}, {16, 16}, {100, 100},
                                                         {53, 11}, {40, 1},  {5, 5}};
  for (const Geo& g : geos) {
    const int32_t n_kv = 2, n_heads = n_kv * g.group;
    const PagedCase c = make_case(rng, g.type, n_kv, n_heads, g.d, seqs);
    AttnParams p;
    p.n_heads = n_heads;
    p.scale = 1.0f / std::sqrt(static_cast<float>(g.d));
    p.causal = false;
    const std::vector<double> want = attention_ld(c, n_heads, g.d, p.scale, false);
    const std::vector<double> causal = attention_ld(c, n_heads, g.d, p.scale, true);
    const std::string what = std::string(quant::type_name(g.type)) + " group " +
                             std::to_string(g.group) + " d " + std::to_string(g.d);
    // The data tells the masks apart: keeping the causal mask would be far outside the bound.
    EXPECT_GT(max_abs_diff(std::vector<float>(want.begin(), want.end()), causal), 0.05) << what;
    float v_max = 0;
    for (float v : c.vf) v_max = std::max(v_max, std::fabs(v));
    const int64_t n_out = c.n_rows() * n_heads * g.d;
    std::vector<float> ref(n_out, NAN), fast(n_out, NAN);
    attention_reference(c.view, c.batch(), c.q.data(), ref.data(), p, &pool);
    EXPECT_LE(max_abs_diff(ref, want), 2e-6 * v_max) << what << " reference";
    if (avx2_ops_available() && attention_avx2_supports(c.view)) {
      attention_avx2(c.view, c.batch(), c.q.data(), fast.data(), p, &pool);
      EXPECT_LE(max_abs_diff(fast, want), 2e-6 * v_max) << what << " avx2";
      std::printf("%s: max |ref - exact| %.3g, |avx2 - exact| %.3g\n", what.c_str(),
                  max_abs_diff(ref, want), max_abs_diff(fast, want));
    }
    // The dispatching op too.
    std::vector<float> op(n_out, NAN);
    attention(c.view, c.batch(), c.q.data(), op.data(), p, nullptr);
    EXPECT_LE(max_abs_diff(op, want), 2e-6 * v_max) << what << " attention()";
    // causal = true is unchanged (and differs).
    p.causal = true;
    attention(c.view, c.batch(), c.q.data(), op.data(), p, nullptr);
    EXPECT_LE(max_abs_diff(op, causal), 2e-6 * v_max) << what << " causal";
  }
}

// A non-causal row's output is bitwise the same computed alone or in a batch over two threads
// (the AVX2 kernel's batch invariance, kept without the mask).
TEST(NonCausalAttention, Avx2BatchInvariant) {
  if (!avx2_ops_available()) GTEST_SKIP() << "no AVX2+FMA+F16C on this CPU";
  std::mt19937 rng(36);
  for (int32_t group : {1, 4}) {
    const int32_t n_kv = 2, n_heads = n_kv * group, d = 64;
    const PagedCase c = make_case(rng, Type::F16, n_kv, n_heads, d, {{45, 45}, {70, 23}, {9, 1}});
    AttnParams p;
    p.n_heads = n_heads;
    p.scale = 0.125f;
    p.causal = false;
    util::ThreadPool pool(2);
    const int64_t row_out = int64_t{n_heads} * d;
    std::vector<float> all(c.n_rows() * row_out);
    attention_avx2(c.view, c.batch(), c.q.data(), all.data(), p, &pool);
    for (int32_t seq = 0; seq < 3; ++seq) {
      for (int32_t t = c.qo[seq]; t < c.qo[seq + 1]; ++t) {
        const int32_t qo[2] = {0, 1};
        const AttnBatch one{
            1, qo, c.kv_ptr.data() + seq, c.kv_idx.data(), c.kv_len.data() + seq, c.pos.data() + t};
        std::vector<float> alone(row_out);
        attention_avx2(c.view, one, c.q.data() + t * row_out, alone.data(), p, nullptr);
        ASSERT_EQ(0, std::memcmp(alone.data(), all.data() + t * row_out, row_out * 4))
            << "group " << group << " seq " << seq << " row " << t;
      }
    }
  }
}

// A sliding window has no meaning without the order: refused, not silently applied.
TEST(NonCausalAttentionDeathTest, SlidingWindowIsRefused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::mt19937 rng(37);
  const PagedCase c = make_case(rng, Type::F32, 1, 1, 64, {{20, 20}});
  AttnParams p;
  p.n_heads = 1;
  p.causal = false;
  p.sliding_window = 8;
  std::vector<float> out(c.n_rows() * 64);
  EXPECT_DEATH(attention_reference(c.view, c.batch(), c.q.data(), out.data(), p, nullptr),
               "causal");
  if (avx2_ops_available()) {
    EXPECT_DEATH(attention_avx2(c.view, c.batch(), c.q.data(), out.data(), p, nullptr), "causal");
  }
}

}  // namespace
}  // namespace kiln::backend::cpu
