// Fast matmul kernels against their oracles:
//  - each SIMD path against the scalar reference dots (exactly, when every scale is 1 so all
//    arithmetic is on integers below 2^24; within a rounding bound on realistic data);
//  - the full matmul against matmul_reference (dequantize + fp32 dot) within a per-type
//    bound relative to the output norm (Q8 activation rounding);
//  - batch invariance: a token's outputs are bitwise the same alone, inside batches of any
//    size, and with 1 or 2 threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kiln/backend/cpu/kernels.h"
#include "kiln/backend/cpu/matmul.h"
#include "kiln/backend/cpu/ops.h"
#include "kiln/backend/cpu/quantize_act.h"
#include "kiln/quant/convert.h"
#include "kiln/quant/types.h"
#include "kiln/util/thread_pool.h"
#include "unit/quant/random_blocks.h"

namespace kiln::backend::cpu {
namespace {

using quant::Type;

const Type kTypes[] = {Type::Q4_K, Type::Q6_K, Type::Q8_0, Type::F16,
                       Type::BF16, Type::F32,  Type::Q5_K, Type::Q4_0};

std::vector<KernelPath> available_paths() {
  std::vector<KernelPath> p;
  for (KernelPath k : {KernelPath::Scalar, KernelPath::Avx2, KernelPath::Avx512})
    if (path_available(k)) p.push_back(k);
  return p;
}

int64_t block_of(Type t) {
  return quant::traits(t).block_elems;
}

// A weight matrix: n_out rows quantized from N(0, 1) * row scale (scales from 1e-3 to 1e3
// so rows exercise very different d values).
struct TestWeight {
  std::vector<uint8_t> bytes;
  Weight w;
};

TestWeight make_weight(Type type, int64_t n_in, int64_t n_out, uint32_t seed,
                       bool vary_scales = true) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  TestWeight tw;
  const uint64_t rb = *quant::row_bytes(type, static_cast<uint64_t>(n_in));
  tw.bytes.resize(rb * static_cast<uint64_t>(n_out));
  std::vector<float> row(static_cast<size_t>(n_in));
  for (int64_t o = 0; o < n_out; ++o) {
    const float scale = vary_scales ? std::pow(10.0f, static_cast<float>(o % 7) - 3.0f) : 1.0f;
    for (auto& v : row) v = nd(rng) * scale;
    EXPECT_TRUE(quant::quantize_row(type, row.data(), tw.bytes.data() + o * rb, n_in).ok());
  }
  tw.w = Weight{type, n_in, n_out, tw.bytes.data(), rb};
  return tw;
}

std::vector<float> make_acts(int64_t n_tokens, int64_t n_in, uint32_t seed, float outlier = 30) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_tokens * n_in));
  for (auto& v : x) v = nd(rng);
  // One large outlier per token, as real activations have.
  for (int64_t t = 0; t < n_tokens; ++t)
    x[static_cast<size_t>(t * n_in + (t * 7) % n_in)] *= outlier;
  return x;
}

// Runs a path's kernel on all rows directly (no thread pool, no fallback).
std::vector<float> run_kernel(KernelPath p, const Weight& w, const std::vector<float>& x,
                              int64_t n_tokens) {
  std::vector<float> y(static_cast<size_t>(n_tokens * w.n_out), NAN);
  matmul_on_path(w, x.data(), y.data(), n_tokens, nullptr, p);
  return y;
}

float scalar_dot(Type t, const uint8_t* row, const QuantizedActs& a, const float* x, int64_t tok,
                 int64_t n) {
  const int8_t* q = a.qs.data() + tok * a.qs_stride;
  const float* d = a.d.data() + tok * a.d_stride;
  switch (t) {
    case Type::Q8_0:
      return vec_dot_q8_0_scalar(row, q, d, n);
    case Type::Q4_0:
      return vec_dot_q4_0_scalar(row, q, d, n);
    case Type::Q4_K:
      return vec_dot_q4_k_scalar(row, q, d, n);
    case Type::Q5_K:
      return vec_dot_q5_k_scalar(row, q, d, n);
    case Type::Q6_K:
      return vec_dot_q6_k_scalar(row, q, d, n);
    case Type::F32:
      return vec_dot_f32_scalar(row, x + tok * n, n);
    case Type::F16:
      return vec_dot_f16_scalar(row, x + tok * n, n);
    case Type::BF16:
      return vec_dot_bf16_scalar(row, x + tok * n, n);
    default:
      ADD_FAILURE();
      return 0;
  }
}

// sum_i |w_i| * |x^_i| with x^ the activations the kernel sees (dequantized Q8, or x).
double abs_dot(const Weight& w, int64_t o, const QuantizedActs* a, const float* x, int64_t tok) {
  std::vector<float> wr(static_cast<size_t>(w.n_in));
  EXPECT_TRUE(quant::dequantize_row(w.type, w.row(o), wr.data(), w.n_in).ok());
  double s = 0;
  for (int64_t i = 0; i < w.n_in; ++i) {
    double xi = x[tok * w.n_in + i];
    if (a != nullptr) {
      const int64_t block = act_block_elems(a->format);
      xi = static_cast<double>(a->qs[static_cast<size_t>(tok * a->qs_stride + i)]) *
           a->d[static_cast<size_t>(tok * a->d_stride + i / block)];
    }
    s += std::fabs(wr[static_cast<size_t>(i)] * xi);
  }
  return s;
}

// ---- activation quantization -------------------------------------------------------------

TEST(QuantizeAct, RoundTripAndSums) {
  const int64_t n = 512;
  std::vector<float> x = make_acts(1, n, 5);
  x[3] = 0;
  for (int i = 256; i < 288; ++i) x[static_cast<size_t>(i)] = 0;  // an all-zero Q8_0 block
  for (ActFormat f : {ActFormat::Q8_0, ActFormat::Q8_K}) {
    QuantizedActs a;
    quantize_acts(f, x.data(), 1, n, &a, nullptr);
    const int block = act_block_elems(f);
    for (int64_t i = 0; i < n; ++i) {
      const float d = a.d[static_cast<size_t>(i / block)];
      const int q = a.qs[static_cast<size_t>(i)];
      ASSERT_LE(std::abs(q), 127);
      ASSERT_LE(std::fabs(q * d - x[static_cast<size_t>(i)]), 0.5f * d * 1.0001f) << i;
    }
    if (f == ActFormat::Q8_0) {
      EXPECT_EQ(a.d[8], 0.0f);
    }
    if (f == ActFormat::Q8_K) {
      for (int64_t g = 0; g < n / 16; ++g) {
        int s = 0;
        for (int i = 0; i < 16; ++i) s += a.qs[static_cast<size_t>(g * 16 + i)];
        ASSERT_EQ(a.bsums[static_cast<size_t>(g)], s);
      }
    }
  }
}

// ---- SIMD paths vs the scalar reference dots ---------------------------------------------

// Every scale 1 and activations that quantize to themselves: all arithmetic is on integers
// below 2^24, so every path must give exactly the scalar reference's value.
TEST(Kernels, IntegerPartsExactWithUnitScales) {
  for (Type type : {Type::Q8_0, Type::Q4_0, Type::Q4_K, Type::Q5_K, Type::Q6_K}) {
    const int64_t blk = block_of(type);
    const int64_t n_in = blk == 256 ? 768 : 160, n_out = 5, n_tokens = 3;
    std::mt19937 rng(11);
    const uint64_t rb = *quant::row_bytes(type, n_in);
    std::vector<uint8_t> bytes(rb * n_out);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    const uint64_t bb = quant::traits(type).block_bytes;
    for (uint64_t off = 0; off < bytes.size(); off += bb) {
      uint8_t* p = bytes.data() + off;
      const uint16_t one = 0x3c00;
      if (type == Type::Q6_K) {
        std::memcpy(p + 208, &one, 2);
        for (int g = 0; g < 16; ++g)
          p[192 + g] = static_cast<uint8_t>(static_cast<int8_t>(rng() % 31) - 15);
      } else {
        std::memcpy(p, &one, 2);
        if (blk == 256) std::memcpy(p + 2, &one, 2);  // dmin
      }
    }
    const Weight w{type, n_in, n_out, bytes.data(), rb};
    // |x| <= 6 except one +-127 per 32 elements: every activation block has d = 1, q = x.
    std::vector<float> x(static_cast<size_t>(n_tokens * n_in));
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = i % 32 == 5 ? (rng() % 2 ? 127.0f : -127.0f) : static_cast<float>(rng() % 13) - 6;
    QuantizedActs a;
    quantize_acts(act_format(type), x.data(), n_tokens, n_in, &a, nullptr);
    for (KernelPath p : available_paths()) {
      const std::vector<float> y = run_kernel(p, w, x, n_tokens);
      for (int64_t t = 0; t < n_tokens; ++t)
        for (int64_t o = 0; o < n_out; ++o)
          ASSERT_EQ(y[static_cast<size_t>(t * n_out + o)],
                    scalar_dot(type, w.row(o), a, x.data(), t, n_in))
              << quant::type_name(type) << " " << path_name(p) << " t" << t << " o" << o;
    }
  }
}

// Realistic data: |simd - scalar| <= 1e-5 * sum_i |w_i x^_i| (fp32 rounding of a few hundred
// block terms summed in a different order; the bound is ~100x the typical difference).
TEST(Kernels, SimdMatchesScalarDots) {
  for (Type type : kTypes) {
    const int64_t blk = block_of(type) == 1 ? 16 : block_of(type);
    for (int64_t n_in : {blk, 3 * blk, 5 * blk + (blk == 16 ? 7 : 0)}) {
      const int64_t n_out = 7, n_tokens = 5;
      TestWeight tw = make_weight(type, n_in, n_out, 3);
      const std::vector<float> x = make_acts(n_tokens, n_in, 4);
      QuantizedActs a;
      const bool q = act_format(type) != ActFormat::F32;
      if (q) quantize_acts(act_format(type), x.data(), n_tokens, n_in, &a, nullptr);
      for (KernelPath p : available_paths()) {
        const std::vector<float> y = run_kernel(p, tw.w, x, n_tokens);
        for (int64_t t = 0; t < n_tokens; ++t) {
          for (int64_t o = 0; o < n_out; ++o) {
            const float ref = scalar_dot(type, tw.w.row(o), a, x.data(), t, n_in);
            const double bound = 1e-5 * abs_dot(tw.w, o, q ? &a : nullptr, x.data(), t);
            ASSERT_LE(std::fabs(y[static_cast<size_t>(t * n_out + o)] - ref), bound)
                << quant::type_name(type) << " " << path_name(p) << " n_in " << n_in;
          }
        }
      }
    }
  }
}

// Random block bytes with random finite f16 scales over the whole f16 range (subnormals up
// to 65504): every path within 1e-5 * sum |w x^| of the scalar dots (both may be inf only
// together, for rows whose true value overflows fp32).
TEST(Kernels, SimdMatchesScalarOnRandomBlocksWithExtremeScales) {
  struct Case {
    Type type;
    quant::testing::RandomLayout layout;
  };
  const Case cases[] = {{Type::Q8_0, {34, {0, -1}, -1}},
                        {Type::Q4_0, {18, {0, -1}, -1}},
                        {Type::Q4_K, {144, {0, 2}, -1}},
                        {Type::Q5_K, {176, {0, 2}, -1}},
                        {Type::Q6_K, {210, {208, -1}, -1}}};
  for (const Case& c : cases) {
    const int64_t blk = block_of(c.type);
    const int64_t n_in = 3 * (blk == 256 ? 256 : 96), n_out = 11, n_tokens = 3;
    const int num_blocks = static_cast<int>(n_in / blk * n_out);
    std::vector<uint8_t> bytes = quant::testing::random_blocks(c.layout, num_blocks, 99);
    const Weight w{c.type, n_in, n_out, bytes.data(), *quant::row_bytes(c.type, n_in)};
    const std::vector<float> x = make_acts(n_tokens, n_in, 5);
    QuantizedActs a;
    quantize_acts(act_format(c.type), x.data(), n_tokens, n_in, &a, nullptr);
    for (KernelPath p : available_paths()) {
      const std::vector<float> y = run_kernel(p, w, x, n_tokens);
      for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t o = 0; o < n_out; ++o) {
          const float ref = scalar_dot(c.type, w.row(o), a, x.data(), t, n_in);
          const float got = y[static_cast<size_t>(t * n_out + o)];
          const double bound = 1e-5 * abs_dot(w, o, &a, x.data(), t);
          if (!std::isfinite(ref) || !std::isfinite(bound)) {
            EXPECT_FALSE(std::isfinite(got)) << quant::type_name(c.type) << " " << path_name(p);
            continue;
          }
          ASSERT_LE(std::fabs(got - ref), bound)
              << quant::type_name(c.type) << " " << path_name(p) << " t " << t << " o " << o;
        }
      }
    }
  }
}

// ---- full matmul vs the reference op -----------------------------------------------------

// Two bounds against the reference (same dequantized weights, fp32 activations):
//  - per output: the Q8 activation rounding error sum_i w_i * e_i, e_i uniform in
//    +-d_x(i)/2, has sigma = sqrt(sum_i w_i^2 d_x(i)^2 / 12); allow 6 sigma, plus 1e-5 *
//    sum_i |w_i x_i| for fp32 reordering (the whole bound for F32/F16/BF16);
//  - per token, over n_out = 17 outputs of N(0, 1) activations without outliers:
//    ||y - y_ref||_2 <= bound * ||y_ref||_2 with bound 2e-2 for Q8_0/Q4_0 (typical 0.3%),
//    also 2e-2 for the K-quants (Q8_K blocks of 256 have a larger amax: typical 0.7%), 1e-5
//    for the float types. (Weights N(0, 1) here, so all 17 outputs weigh in the norm.) (With a
//    30-sigma outlier in a block the block's step grows 10x and so does the error: the per-output
//    bound covers that case.)
double elem_bound(const Weight& w, int64_t o, const float* x, int64_t tok) {
  std::vector<float> wr(static_cast<size_t>(w.n_in));
  EXPECT_TRUE(quant::dequantize_row(w.type, w.row(o), wr.data(), w.n_in).ok());
  const int block = act_block_elems(act_format(w.type));
  double var = 0, abs = 0;
  for (int64_t b = 0; b < w.n_in / block; ++b) {
    double amax = 0;
    for (int64_t i = b * block; i < (b + 1) * block; ++i)
      amax = std::max(amax, std::fabs(static_cast<double>(x[tok * w.n_in + i])));
    const double d = block == 1 ? 0.0 : amax / 127;
    for (int64_t i = b * block; i < (b + 1) * block; ++i) {
      const double wi = wr[static_cast<size_t>(i)];
      var += wi * wi * d * d / 12;
      abs += std::fabs(wi * x[tok * w.n_in + i]);
    }
  }
  return 6 * std::sqrt(var) + 1e-5 * abs;
}

double norm_bound(Type t) {
  switch (act_format(t)) {
    case ActFormat::F32:
      return 1e-5;
    case ActFormat::Q8_0:
    case ActFormat::Q8_K:
      return 2e-2;
  }
  return 0;
}

TEST(Matmul, MatchesReferenceOnRaggedShapes) {
  for (Type type : kTypes) {
    const int64_t blk = block_of(type) == 1 ? 16 : block_of(type);
    const int64_t tail = blk == 16 ? 5 : 0;
    for (int64_t n_in : {blk * 3 + tail, blk * 5 + tail}) {
      for (int64_t n_out : {1, 3, 17}) {
        for (int64_t n_tokens : {1, 2, 5, 33}) {
          TestWeight tw = make_weight(type, n_in, n_out, static_cast<uint32_t>(n_in + n_out));
          const std::vector<float> x = make_acts(n_tokens, n_in, static_cast<uint32_t>(n_tokens));
          std::vector<float> ref(static_cast<size_t>(n_tokens * n_out));
          matmul_reference(tw.w, x.data(), ref.data(), n_tokens, nullptr);
          std::vector<double> bound(ref.size());
          for (int64_t t = 0; t < n_tokens; ++t)
            for (int64_t o = 0; o < n_out; ++o)
              bound[static_cast<size_t>(t * n_out + o)] = elem_bound(tw.w, o, x.data(), t);
          const TestWeight twn = make_weight(type, n_in, n_out, 78, false);
          const std::vector<float> xn = make_acts(n_tokens, n_in, 77, 1.0f);
          std::vector<float> refn(ref.size());
          matmul_reference(twn.w, xn.data(), refn.data(), n_tokens, nullptr);
          for (KernelPath p : available_paths()) {
            const std::vector<float> y = run_kernel(p, tw.w, x, n_tokens);
            const std::vector<float> yn = run_kernel(p, twn.w, xn, n_tokens);
            for (int64_t t = 0; t < n_tokens; ++t) {
              double num = 0, den = 0;
              for (int64_t o = 0; o < n_out; ++o) {
                const size_t i = static_cast<size_t>(t * n_out + o);
                const double d = y[i] - static_cast<double>(ref[i]);
                ASSERT_LE(std::fabs(d), bound[i])
                    << quant::type_name(type) << " " << path_name(p) << " n_in " << n_in
                    << " n_out " << n_out << " n_tokens " << n_tokens << " t " << t << " o " << o;
                const double dn = yn[i] - static_cast<double>(refn[i]);
                num += dn * dn;
                den += static_cast<double>(refn[i]) * refn[i];
              }
              if (n_out == 17) {
                ASSERT_LE(std::sqrt(num), norm_bound(type) * std::sqrt(den))
                    << quant::type_name(type) << " " << path_name(p) << " n_in " << n_in
                    << " n_tokens " << n_tokens << " t " << t;
              }
            }
          }
        }
      }
    }
  }
}

// ops.h's matmul (what the model forward calls) is the fast path; MatmulMode::Reference
// turns it into matmul_reference.
TEST(Matmul, OpsMatmulDispatchAndReferenceMode) {
  TestWeight tw = make_weight(Type::Q4_K, 512, 9, 3);
  const std::vector<float> x = make_acts(4, 512, 4);
  std::vector<float> fast(36), op(36), ref(36), op_ref(36);
  matmul_fast(tw.w, x.data(), fast.data(), 4, nullptr);
  matmul_reference(tw.w, x.data(), ref.data(), 4, nullptr);
  matmul(tw.w, x.data(), op.data(), 4, nullptr);
  EXPECT_EQ(0, std::memcmp(fast.data(), op.data(), 36 * 4));
  EXPECT_NE(0, std::memcmp(fast.data(), ref.data(), 36 * 4));  // Q8 activations differ
  set_matmul_mode(MatmulMode::Reference);
  matmul(tw.w, x.data(), op_ref.data(), 4, nullptr);
  set_matmul_mode(MatmulMode::Fast);
  EXPECT_EQ(0, std::memcmp(ref.data(), op_ref.data(), 36 * 4));
}

TEST(Matmul, UnsupportedTypeFallsBackToReference) {
  TestWeight tw = make_weight(Type::Q4_1, 64, 5, 1);
  const std::vector<float> x = make_acts(3, 64, 2);
  std::vector<float> a(15), b(15);
  matmul_reference(tw.w, x.data(), a.data(), 3, nullptr);
  matmul_fast(tw.w, x.data(), b.data(), 3, nullptr);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4));
}

// ---- batch invariance ---------------------------------------------------------------------

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

TEST(Matmul, BatchAndThreadInvariant) {
  util::ThreadPool pool2(2);
  for (Type type : kTypes) {
    const int64_t blk = block_of(type) == 1 ? 16 : block_of(type);
    const int64_t n_in = blk * 3 + (blk == 16 ? 3 : 0), n_out = 37, n_max = 64;
    TestWeight tw = make_weight(type, n_in, n_out, 9);
    const std::vector<float> x = make_acts(n_max, n_in, 10);
    for (KernelPath p : available_paths()) {
      const std::string what = std::string(quant::type_name(type)) + " " + path_name(p);
      std::vector<float> full(static_cast<size_t>(n_max * n_out));
      matmul_on_path(tw.w, x.data(), full.data(), n_max, nullptr, p);
      std::vector<float> threaded(full.size());
      matmul_on_path(tw.w, x.data(), threaded.data(), n_max, &pool2, p);
      EXPECT_TRUE(same_bits(full.data(), threaded.data(), full.size())) << what;
      // Each token alone, and inside batches of 7 starting at it.
      for (int64_t t = 0; t < n_max; ++t) {
        std::vector<float> one(static_cast<size_t>(n_out));
        matmul_on_path(tw.w, x.data() + t * n_in, one.data(), 1, nullptr, p);
        ASSERT_TRUE(same_bits(one.data(), full.data() + t * n_out, static_cast<size_t>(n_out)))
            << what << " token " << t << " alone vs in 64";
      }
      for (int64_t t0 = 0; t0 + 7 <= n_max; t0 += 9) {
        std::vector<float> seven(static_cast<size_t>(7 * n_out));
        matmul_on_path(tw.w, x.data() + t0 * n_in, seven.data(), 7, &pool2, p);
        ASSERT_TRUE(same_bits(seven.data(), full.data() + t0 * n_out, seven.size()))
            << what << " batch of 7 at " << t0;
      }
    }
  }
}

// Decode and small batches (up to 8 or 16 tokens: the K-quants' register dots, no panel)
// against prefill (40 tokens: the panel and register tiles) on random block bytes, i.e. every
// 6-bit scale / min pattern and f16 scales over the whole range: the same bits for every
// token, on every path.
TEST(Matmul, DecodeEqualsPrefillBitwiseOnRandomBlocks) {
  struct Case {
    Type type;
    quant::testing::RandomLayout layout;
  };
  const Case cases[] = {{Type::Q8_0, {34, {0, -1}, -1}},
                        {Type::Q4_0, {18, {0, -1}, -1}},
                        {Type::Q4_K, {144, {0, 2}, -1}},
                        {Type::Q5_K, {176, {0, 2}, -1}},
                        {Type::Q6_K, {210, {208, -1}, -1}}};
  for (const Case& c : cases) {
    const int64_t blk = block_of(c.type);
    const int64_t n_in = 5 * blk, n_out = 23, n_batch = 40;
    std::vector<uint8_t> bytes =
        quant::testing::random_blocks(c.layout, static_cast<int>(n_in / blk * n_out), 123);
    const Weight w{c.type, n_in, n_out, bytes.data(), *quant::row_bytes(c.type, n_in)};
    const std::vector<float> x = make_acts(n_batch, n_in, 6);
    for (KernelPath p : available_paths()) {
      const std::vector<float> full = run_kernel(p, w, x, n_batch);
      for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17}) {
        for (int64_t t0 : {int64_t{0}, n_batch - n}) {
          const std::vector<float> xs(x.begin() + t0 * n_in, x.begin() + (t0 + n) * n_in);
          const std::vector<float> part = run_kernel(p, w, xs, n);
          ASSERT_TRUE(same_bits(part.data(), full.data() + t0 * n_out, part.size()))
              << quant::type_name(c.type) << " " << path_name(p) << " " << n << " at " << t0;
        }
      }
    }
  }
}

// Decode over many rows: the rows go to the threads in dynamic chunks; 1 and 2 threads and
// the single-token and batched results agree bit for bit.
TEST(Matmul, ThreadedDecodeOverManyRows) {
  util::ThreadPool pool2(2);
  for (Type type : {Type::Q8_0, Type::Q4_K, Type::Q6_K}) {
    const int64_t n_in = 512, n_out = 600, n_batch = 4;
    TestWeight tw = make_weight(type, n_in, n_out, 31);
    const std::vector<float> x = make_acts(n_batch, n_in, 32);
    std::vector<float> batched(static_cast<size_t>(n_batch * n_out));
    matmul_fast(tw.w, x.data(), batched.data(), n_batch, nullptr);
    for (int64_t t = 0; t < n_batch; ++t) {
      std::vector<float> one(static_cast<size_t>(n_out)), one2(one.size());
      matmul_fast(tw.w, x.data() + t * n_in, one.data(), 1, nullptr);
      matmul_fast(tw.w, x.data() + t * n_in, one2.data(), 1, &pool2);
      ASSERT_TRUE(same_bits(one.data(), one2.data(), one.size())) << quant::type_name(type);
      ASSERT_TRUE(same_bits(one.data(), batched.data() + t * n_out, one.size()))
          << quant::type_name(type) << " token " << t;
    }
  }
}

// The AVX-512 path runs the AVX2 kernel bodies with VNNI instructions that compute the same
// integers, so the two paths agree bit for bit (skipped where the CPU lacks AVX-512 VNNI).
TEST(Matmul, Avx512EqualsAvx2Bitwise) {
  if (!path_available(KernelPath::Avx512) || !path_available(KernelPath::Avx2)) {
    GTEST_SKIP() << "needs AVX-512 VNNI";
  }
  for (Type type : kTypes) {
    const int64_t blk = block_of(type) == 1 ? 16 : block_of(type);
    const int64_t n_in = blk * 5 + (blk == 16 ? 9 : 0), n_out = 19, n_tokens = 9;
    TestWeight tw = make_weight(type, n_in, n_out, 21);
    const std::vector<float> x = make_acts(n_tokens, n_in, 22);
    const std::vector<float> a = run_kernel(KernelPath::Avx2, tw.w, x, n_tokens);
    const std::vector<float> b = run_kernel(KernelPath::Avx512, tw.w, x, n_tokens);
    EXPECT_TRUE(same_bits(a.data(), b.data(), a.size())) << quant::type_name(type);
    // One token: the decode kernels.
    const std::vector<float> x1(x.begin(), x.begin() + n_in);
    const std::vector<float> a1 = run_kernel(KernelPath::Avx2, tw.w, x1, 1);
    const std::vector<float> b1 = run_kernel(KernelPath::Avx512, tw.w, x1, 1);
    EXPECT_TRUE(same_bits(a1.data(), b1.data(), a1.size())) << quant::type_name(type) << " decode";
  }
}

}  // namespace
}  // namespace kiln::backend::cpu
