// CUDA matmul and matmul_id against cpu::matmul_reference (fp32 activations against the
// reference dequantization), on fresh random inputs: weights quantized from Gaussian rows,
// Gaussian activations. The error is |y - ref| / |ref| over the whole output (L2 norms):
//   int8 matvec (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K at n_tokens <= 8) and int8 MMA (the same types at
//   9..16 tokens by default, 9..256 when a test moves the crossover; mmq): activations rounded
//   to int8 per 32 values, 1.5e-2 (and 1e-5 on activations that int8 holds exactly);
//   direct kernels (other types at n_tokens <= 8, n_in % 8 == 0; matmul_id on other types):
//   fp32 arithmetic, 1e-5; matmul_id up to 64 pairs on the int8 matvec's types (matvec_id):
//   the matvec's bounds;
//   fp16 MMA on weights dequantized in registers (mmh: Q4_K, Q5_K, Q6_K, Q8_0 at 9..16
//   tokens, 9..128 on weights of 4096 x 4096 values or more): the weights rounded to fp16 (the
//   scale and the weight: two roundings) and the activations, fp32 sums: kFp16GemmBound, as cuBLAS;
//   grouped int8 MMA (matmul_id above 64 pairs on mmq's types; mmq_id): mmq's rounding, so
//   mmq's bounds (1.5e-2, and 1e-5 on activations that int8 holds exactly);
//   cuBLAS path with F32 weights: plain fp32 GEMM, 1e-5;
//   cuBLAS path with any other type: fp16 operands (weights and activations each rounded to
//   fp16, relative 2^-11), fp32 accumulation: 2e-3.
// Outputs are poisoned with NaN before each run; every element must be written and finite.
// A CUDA graph capture of each path must replay to the same bits as the eager call.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <random>
#include <sstream>
#include <vector>

#include "kiln/backend/cpu/matmul.h"
#include "kiln/backend/cuda/device.h"
#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/mmh.h"
#include "kiln/backend/cuda/mmq.h"
#include "kiln/quant/convert.h"
#include "test_util.h"

namespace kiln {
namespace {

using backend::Weight;
using quant::Type;

constexpr double kDirectBound = 1e-5;
constexpr double kFp32GemmBound = 1e-5;
constexpr double kFp16GemmBound = 2e-3;
// The int8 matvec path (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K at <= 8 tokens) rounds the activations
// to int8 per group of 32: ~5e-3 for Gaussian activations. Exact when the activations are
// already int8 levels times a power of two (MatvecExactOnRepresentableActivations: 1e-5).
constexpr double kMatvecBound = 1.5e-2;

const Type kAllTypes[] = {Type::F32,  Type::F16,  Type::BF16, Type::Q4_0,   Type::Q4_1,  Type::Q5_0,
                          Type::Q5_1, Type::Q8_0, Type::Q8_1, Type::Q2_K,   Type::Q3_K,  Type::Q4_K,
                          Type::Q5_K, Type::Q6_K, Type::Q8_K, Type::IQ4_NL, Type::IQ4_XS};

bool matvec_type(Type t) {
  return t == Type::Q4_0 || t == Type::Q8_0 || t == Type::Q4_K || t == Type::Q5_K ||
         t == Type::Q6_K;
}

// The bound of the path the default dispatch takes for a weight under 4096 x 4096 values: the
// int8 matvec up to 8 tokens, mmh up to 16 (Q4_K, Q5_K, Q6_K, Q8_0 with n_in % 256 == 0; fp16),
// mmq up to 16 (Q4_0, and Q8_0 rows of other lengths), cuBLAS above.
double error_bound(Type t, int64_t n_tokens, int64_t n_in) {
  if (n_tokens <= 8 && matvec_type(t)) return kMatvecBound;
  if ((t == Type::Q4_K || t == Type::Q5_K || t == Type::Q6_K || t == Type::Q8_0) && n_in % 256 == 0)
    return kFp16GemmBound;  // mmh up to 16 tokens, cuBLAS above
  if (n_tokens <= 16 && matvec_type(t)) return kMatvecBound;
  if (n_tokens <= 8 && n_in % 8 == 0) return kDirectBound;
  return t == Type::F32 ? kFp32GemmBound : kFp16GemmBound;
}

uint64_t fresh_seed() {
  return (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
}

std::vector<float> gaussian(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& f : v) f = nd(rng);
  return v;
}

// Activations that int8 levels hold exactly (each group of 32: integers in [-127, 127] with one
// of magnitude 127, times a power of two), as MatvecExactOnRepresentableActivations.
std::vector<float> representable(int64_t n, std::mt19937_64& rng) {
  std::vector<float> x(static_cast<size_t>(n));
  for (size_t g = 0; g < x.size() / 32; ++g) {
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 8) - 9);
    for (int i = 0; i < 32; ++i)
      x[g * 32 + i] = scale * static_cast<float>(static_cast<int>(rng() % 255) - 127);
    x[g * 32 + rng() % 32] = (rng() & 1 ? 127.0f : -127.0f) * scale;
  }
  return x;
}

// n_rows rows of n_in Gaussian weights quantized to `type` (host bytes).
std::vector<uint8_t> quantized_rows(Type type, int64_t n_rows, int64_t n_in, std::mt19937_64& rng) {
  const uint64_t rb = *quant::row_bytes(type, static_cast<uint64_t>(n_in));
  std::vector<uint8_t> bytes(rb * n_rows);
  const std::vector<float> f = gaussian(static_cast<size_t>(n_rows * n_in), rng, 0.05f);
  for (int64_t r = 0; r < n_rows; ++r) {
    EXPECT_TRUE(quant::quantize_row(type, f.data() + r * n_in, bytes.data() + r * rb, n_in).ok());
  }
  return bytes;
}

Weight weight_view(Type type, int64_t n_in, int64_t n_out, const uint8_t* data) {
  Weight w;
  w.type = type;
  w.n_in = n_in;
  w.n_out = n_out;
  w.row_bytes = *quant::row_bytes(type, static_cast<uint64_t>(n_in));
  w.data = data;
  return w;
}

// |a - b| / |b| (L2), or infinity when a has a non-finite element.
double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    den += double{b[i]} * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

struct Ctx {
  backend::cuda::MatmulContext* p;
  Ctx(int64_t max_tokens, int64_t max_n_in, int64_t max_n_out, int64_t max_pairs = 0,
      int64_t max_experts = 0)
      : p(backend::cuda::create_matmul_context(max_tokens, max_n_in, max_n_out, max_pairs,
                                               max_experts)) {}
  ~Ctx() { backend::cuda::destroy_matmul_context(p); }
};

void check_matmul(backend::cuda::MatmulContext* ctx, Type type, int64_t n_in, int64_t n_out,
                  std::mt19937_64& rng) {
  const std::vector<uint8_t> wb = quantized_rows(type, n_out, n_in, rng);
  test::DeviceVec<uint8_t> dw(wb);
  const Weight hw = weight_view(type, n_in, n_out, wb.data());
  const Weight w = weight_view(type, n_in, n_out, dw.get());
  for (int64_t n_tokens : {1, 2, 3, 7, 8, 9, 33, 200}) {
    SCOPED_TRACE(testing::Message() << "n_tokens=" << n_tokens);
    const std::vector<float> x = gaussian(static_cast<size_t>(n_tokens * n_in), rng);
    std::vector<float> ref(static_cast<size_t>(n_tokens * n_out));
    backend::cpu::matmul_reference(hw, x.data(), ref.data(), n_tokens, nullptr);
    test::DeviceVec<float> dx(x);
    test::DeviceVec<float> dy(ref.size());
    KILN_CUDA_OK(cudaMemset(dy.get(), 0xff, ref.size() * sizeof(float)));
    backend::cuda::matmul(ctx, w, dx.get(), dy.get(), n_tokens, nullptr);
    KILN_CUDA_OK(cudaDeviceSynchronize());
    const double err = rel_error(dy.to_host(), ref);
    EXPECT_LE(err, error_bound(type, n_tokens, n_in));
  }
}

TEST(CudaMatmul, EveryTypeMatchesReference) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  Ctx ctx(200, 2304, 67);
  ASSERT_NE(ctx.p, nullptr);
  for (Type t : kAllTypes) {
    const int64_t be = quant::traits(t).block_elems;
    // A short row (a partial chunk) and a long one (several chunks per warp, ragged tail).
    for (int64_t n_in : {be == 1 ? int64_t{24} : 3 * be, int64_t{2304}}) {
      SCOPED_TRACE(testing::Message()
                   << quant::type_name(t) << " n_in=" << n_in << " seed=" << seed);
      check_matmul(ctx.p, t, n_in, n_in == 2304 ? 67 : 37, rng);
    }
  }
}

// The F16/BF16/F32 decode matvec on long rows (the down projection's 8-28 KiB): against the
// reference at every token count, and a token's result alone equal to the same token inside a
// batch, bitwise. 8200 values: 1025 steps of 8, a ragged last step; 37 rows: the last CTA has
// one row.
TEST(CudaMatmul, HalfMatvecLongRows) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t n_in = 8200, n_out = 37;
  Ctx ctx(200, n_in, n_out);
  ASSERT_NE(ctx.p, nullptr);
  for (Type t : {Type::F16, Type::BF16, Type::F32}) {
    SCOPED_TRACE(testing::Message() << quant::type_name(t) << " seed=" << seed);
    check_matmul(ctx.p, t, n_in, n_out, rng);
    const std::vector<uint8_t> wb = quantized_rows(t, n_out, n_in, rng);
    test::DeviceVec<uint8_t> dw(wb);
    const Weight w = weight_view(t, n_in, n_out, dw.get());
    const std::vector<float> x = gaussian(static_cast<size_t>(8 * n_in), rng);
    test::DeviceVec<float> dx(x);
    test::DeviceVec<float> d8(static_cast<size_t>(8 * n_out)), d1(static_cast<size_t>(n_out));
    backend::cuda::matmul(ctx.p, w, dx.get(), d8.get(), 8, nullptr);
    backend::cuda::matmul(ctx.p, w, dx.get(), d1.get(), 1, nullptr);
    KILN_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> y8 = d8.to_host();
    EXPECT_EQ(d1.to_host(), std::vector<float>(y8.begin(), y8.begin() + n_out));
  }
}

TEST(CudaMatmul, PlainTypesWithOddRowLength) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  Ctx ctx(200, 37, 37);
  ASSERT_NE(ctx.p, nullptr);
  for (Type t : {Type::F32, Type::F16, Type::BF16}) {
    SCOPED_TRACE(testing::Message() << quant::type_name(t) << " seed=" << seed);
    check_matmul(ctx.p, t, 37, 37, rng);  // n_in % 8 != 0: the cuBLAS path at every count
  }
}

TEST(CudaMatmul, WeightLargerThanScratchIsChunked) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  // 64 MiB of fp16 scratch holds 8192 rows of 4096: 8293 rows take two chunks.
  const int64_t n_in = 4096, n_out = 8293, n_tokens = 12;
  Ctx ctx(n_tokens, n_in, n_out);
  ASSERT_NE(ctx.p, nullptr);
  backend::cuda::matmul_set_mmq(ctx.p, 0);  // the cuBLAS path at 12 tokens
  backend::cuda::matmul_set_mmh(ctx.p, 0);
  const std::vector<uint8_t> wb = quantized_rows(Type::Q4_K, n_out, n_in, rng);
  test::DeviceVec<uint8_t> dw(wb);
  const std::vector<float> x = gaussian(static_cast<size_t>(n_tokens * n_in), rng);
  std::vector<float> ref(static_cast<size_t>(n_tokens * n_out));
  backend::cpu::matmul_reference(weight_view(Type::Q4_K, n_in, n_out, wb.data()), x.data(),
                                 ref.data(), n_tokens, nullptr);
  test::DeviceVec<float> dx(x);
  test::DeviceVec<float> dy(ref.size());
  KILN_CUDA_OK(cudaMemset(dy.get(), 0xff, ref.size() * sizeof(float)));
  backend::cuda::matmul(ctx.p, weight_view(Type::Q4_K, n_in, n_out, dw.get()), dx.get(), dy.get(),
                        n_tokens, nullptr);
  KILN_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_LE(rel_error(dy.to_host(), ref), kFp16GemmBound) << "seed=" << seed;
}

// y[p] = W_{ids[p]} x[x_rows[p]] against the reference per pair.
void check_matmul_id(backend::cuda::MatmulContext* ctx, Type type, int64_t n_in, int64_t n_out,
                     int64_t n_expert, int64_t n_tokens, int64_t top_k, std::mt19937_64& rng) {
  const std::vector<uint8_t> wb = quantized_rows(type, n_expert * n_out, n_in, rng);
  test::DeviceVec<uint8_t> dw(wb);
  const int64_t n_pairs = n_tokens * top_k;
  std::vector<int32_t> ids(n_pairs), x_rows(n_pairs);
  for (int64_t p = 0; p < n_pairs; ++p) {
    ids[p] = static_cast<int32_t>(rng() % n_expert);
    x_rows[p] = static_cast<int32_t>(p / top_k);
  }
  const std::vector<float> x = gaussian(static_cast<size_t>(n_tokens * n_in), rng);
  std::vector<float> ref(static_cast<size_t>(n_pairs * n_out));
  const uint64_t expert_bytes = *quant::row_bytes(type, n_in) * n_out;
  for (int64_t p = 0; p < n_pairs; ++p) {
    backend::cpu::matmul_reference(
        weight_view(type, n_in, n_out, wb.data() + ids[p] * expert_bytes),
        x.data() + x_rows[p] * n_in, ref.data() + p * n_out, 1, nullptr);
  }
  test::DeviceVec<float> dx(x);
  test::DeviceVec<int32_t> did(ids), dxr(x_rows);
  test::DeviceVec<float> dy(ref.size());
  KILN_CUDA_OK(cudaMemset(dy.get(), 0xff, ref.size() * sizeof(float)));
  const bool q8 =
      backend::cuda::matmul_id(ctx, weight_view(type, n_in, n_out, dw.get()), n_expert, dx.get(),
                               n_tokens, dxr.get(), did.get(), dy.get(), n_pairs, nullptr);
  KILN_CUDA_OK(cudaDeviceSynchronize());
  // mmq's types take int8 activations: up to 64 pairs the int8 matvec per pair (matvec_id),
  // above the grouped int8 MMA (mmq_id); the rest the direct kernel in fp32.
  EXPECT_EQ(q8, matvec_type(type));
  EXPECT_LE(rel_error(dy.to_host(), ref), q8 ? kMatvecBound : kDirectBound);
  if (!q8 || n_in % 32 != 0) return;
  const Weight w = weight_view(type, n_in, n_out, dw.get());
  const std::vector<float> y1 = dy.to_host();
  // x quantized elsewhere (the norm's rows, in the backend) and given: the same bits.
  {
    test::DeviceVec<int8_t> xq(static_cast<size_t>(n_tokens * n_in));
    test::DeviceVec<float2> xds(static_cast<size_t>(n_tokens * n_in / 32));
    backend::cuda::quantize_q8_32(dx.get(), n_tokens, n_in, xq.get(), xds.get(), nullptr);
    KILN_CUDA_OK(cudaMemset(dy.get(), 0xff, ref.size() * sizeof(float)));
    EXPECT_TRUE(backend::cuda::matmul_id(ctx, w, n_expert, dx.get(), n_tokens, dxr.get(), did.get(),
                                         dy.get(), n_pairs, nullptr, false, xq.get(), xds.get()));
    KILN_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> y2 = dy.to_host();
    EXPECT_EQ(std::memcmp(y2.data(), y1.data(), y1.size() * sizeof(float)), 0) << "given rows";
  }
  // x quantized into the context's rows by a producer (quantize_q8_32 here; in the backend
  // swiglu_q8, whose int8 output ops_test checks against quantize_q8_32's), then x_quantized.
  const backend::cuda::MatmulQ8 rows = backend::cuda::matmul_id_q8(ctx, n_tokens, n_in);
  if (rows.xq == nullptr) return;
  backend::cuda::quantize_q8_32(dx.get(), n_tokens, n_in, rows.xq, rows.xds, nullptr);
  KILN_CUDA_OK(cudaMemset(dy.get(), 0xff, ref.size() * sizeof(float)));
  EXPECT_TRUE(backend::cuda::matmul_id(ctx, w, n_expert, dx.get(), n_tokens, dxr.get(), did.get(),
                                       dy.get(), n_pairs, nullptr, true));
  KILN_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> y3 = dy.to_host();
  EXPECT_EQ(std::memcmp(y3.data(), y1.data(), y1.size() * sizeof(float)), 0) << "context rows";
}

TEST(CudaMatmul, MatmulIdMatchesPerExpertReference) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  Ctx ctx(40, 768, 37, 160, 5);
  ASSERT_NE(ctx.p, nullptr);
  for (Type t : kAllTypes) {
    const int64_t be = quant::traits(t).block_elems;
    const int64_t n_in = be == 256 ? 768 : 3 * 32 * 8;
    SCOPED_TRACE(testing::Message() << quant::type_name(t) << " seed=" << seed);
    check_matmul_id(ctx.p, t, n_in, 37, 5, 1, 2, rng);   // decode: 2 pairs
    check_matmul_id(ctx.p, t, n_in, 37, 5, 3, 2, rng);   // 6 pairs
    check_matmul_id(ctx.p, t, n_in, 37, 5, 16, 4, rng);  // 64 pairs: the last matvec_id count
    check_matmul_id(ctx.p, t, n_in, 37, 5, 40, 4, rng);  // several tiles per expert
  }
}

// Pairs routed unevenly over 128 experts: expert 0 takes 200 (more than two 64-pair tiles),
// experts 1..9 none, experts 10..15 exactly 16, 17, 32, 33, 64 and 65 (a tile width and one
// past it, for each width), the rest at random; a few pairs have no expert (id -1: their rows
// stay unwritten). Pair order shuffled.
std::vector<int32_t> skewed_ids(int64_t n_pairs, int64_t n_expert, std::mt19937_64& rng) {
  std::vector<int32_t> ids;
  auto add = [&](int32_t e, int64_t n) { ids.insert(ids.end(), static_cast<size_t>(n), e); };
  add(0, 200);
  const int64_t exact[] = {16, 17, 32, 33, 64, 65};
  for (int i = 0; i < 6; ++i) add(10 + i, exact[i]);
  add(-1, 5);
  while (static_cast<int64_t>(ids.size()) < n_pairs)
    ids.push_back(static_cast<int32_t>(16 + rng() % (n_expert - 16)));
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

// matmul_id's grouped int8 MMA (mmq_id, > 64 pairs) against the per-pair reference: every
// type mmq takes, up and down projection shapes (ragged: 256 x 512 and 512 x 256 per expert),
// x_rows pointing at token rows (8 pairs per token, gate/up) or one row per pair (down), every
// tile width (16, 32, 64 forced, and the default). Bounds as mmq (MmqMatchesReference): 1e-5 on
// representable activations (a wrong row, nibble, scale or min shows), kMatvecBound on
// Gaussian ones; each pair's result does not depend on the tile width (bitwise equal), and a
// call reusing the int8 rows of the previous one (x_quantized) gives the same bits.
TEST(CudaMatmul, MatmulIdGroupedMmqMatchesReference) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t n_expert = 128, top_k = 8;
  Ctx ctx(3000, 512, 512, 3000, n_expert);
  ASSERT_NE(ctx.p, nullptr);
  struct Shape {
    int64_t n_out, n_in;
  };
  for (Type t : {Type::Q4_0, Type::Q8_0, Type::Q4_K, Type::Q5_K, Type::Q6_K}) {
    for (const Shape sh : {Shape{256, 512}, Shape{512, 256}}) {
      const std::vector<uint8_t> wb = quantized_rows(t, n_expert * sh.n_out, sh.n_in, rng);
      test::DeviceVec<uint8_t> dw(wb);
      const Weight w = weight_view(t, sh.n_in, sh.n_out, dw.get());
      const uint64_t expert_bytes = *quant::row_bytes(t, sh.n_in) * sh.n_out;
      for (bool per_token : {true, false}) {
        // Gate/up: 300 tokens x 8 pairs, Gaussian; down: 1500 pair rows, representable.
        const int64_t n_pairs = per_token ? 300 * top_k : 1500;
        const int64_t n_rows = per_token ? n_pairs / top_k : n_pairs;
        const bool exact = !per_token;
        SCOPED_TRACE(testing::Message()
                     << quant::type_name(t) << " " << sh.n_out << "x" << sh.n_in
                     << (per_token ? " token rows" : " pair rows") << " seed=" << seed);
        const std::vector<int32_t> ids = skewed_ids(n_pairs, n_expert, rng);
        std::vector<int32_t> x_rows(static_cast<size_t>(n_pairs));
        for (int64_t p = 0; p < n_pairs; ++p)
          x_rows[p] = static_cast<int32_t>(per_token ? p / top_k : p);
        const std::vector<float> x = exact ? representable(n_rows * sh.n_in, rng)
                                           : gaussian(static_cast<size_t>(n_rows * sh.n_in), rng);
        // The reference per expert (its pairs' rows gathered), valid pairs only.
        std::vector<float> ref(static_cast<size_t>(n_pairs * sh.n_out));
        for (int64_t e = 0; e < n_expert; ++e) {
          std::vector<int64_t> ps;
          for (int64_t p = 0; p < n_pairs; ++p)
            if (ids[p] == e) ps.push_back(p);
          if (ps.empty()) continue;
          std::vector<float> xe(ps.size() * sh.n_in), ye(ps.size() * sh.n_out);
          for (size_t i = 0; i < ps.size(); ++i)
            std::copy_n(x.data() + x_rows[ps[i]] * sh.n_in, sh.n_in, xe.data() + i * sh.n_in);
          backend::cpu::matmul_reference(
              weight_view(t, sh.n_in, sh.n_out, wb.data() + e * expert_bytes), xe.data(), ye.data(),
              static_cast<int64_t>(ps.size()), nullptr);
          for (size_t i = 0; i < ps.size(); ++i)
            std::copy_n(ye.data() + i * sh.n_out, sh.n_out, ref.data() + ps[i] * sh.n_out);
        }
        test::DeviceVec<float> dx(x);
        test::DeviceVec<int32_t> did(ids), dxr(x_rows);
        test::DeviceVec<float> dy(ref.size());
        std::vector<float> first;
        for (int tile_pairs : {0, 16, 32, 64}) {
          SCOPED_TRACE(testing::Message() << "tile_pairs=" << tile_pairs);
          backend::cuda::matmul_set_mmq_id(ctx.p, backend::cuda::kMmqIdMinPairs, tile_pairs);
          KILN_CUDA_OK(cudaMemset(dy.get(), 0xff, ref.size() * sizeof(float)));
          EXPECT_TRUE(backend::cuda::matmul_id(ctx.p, w, n_expert, dx.get(), n_rows, dxr.get(),
                                               did.get(), dy.get(), n_pairs, nullptr));
          KILN_CUDA_OK(cudaDeviceSynchronize());
          std::vector<float> y = dy.to_host();
          // Pairs without an expert stay poisoned; the others are compared with the reference.
          std::vector<float> yv, rv;
          for (int64_t p = 0; p < n_pairs; ++p) {
            for (int64_t o = 0; o < sh.n_out; ++o) {
              const float v = y[p * sh.n_out + o];
              if (ids[p] < 0) {
                uint32_t bits;
                std::memcpy(&bits, &v, 4);
                EXPECT_EQ(bits, 0xffffffffu) << "pair " << p << " without an expert was written";
              } else {
                yv.push_back(v);
                rv.push_back(ref[p * sh.n_out + o]);
              }
            }
          }
          EXPECT_LE(rel_error(yv, rv), exact ? kDirectBound : kMatvecBound);
          // Bitwise (the unwritten rows hold NaN bits, which == would call unequal).
          if (first.empty()) {
            first = y;
          } else {
            EXPECT_EQ(std::memcmp(y.data(), first.data(), y.size() * sizeof(float)), 0)
                << "the result depends on the tile width";
          }
        }
        // The int8 rows the last call left reused for another product of the same x.
        test::DeviceVec<float> dy2(ref.size());
        KILN_CUDA_OK(cudaMemset(dy2.get(), 0xff, ref.size() * sizeof(float)));
        EXPECT_TRUE(backend::cuda::matmul_id(ctx.p, w, n_expert, dx.get(), n_rows, dxr.get(),
                                             did.get(), dy2.get(), n_pairs, nullptr, true));
        KILN_CUDA_OK(cudaDeviceSynchronize());
        const std::vector<float> y1 = dy.to_host(), y2 = dy2.to_host();
        EXPECT_EQ(std::memcmp(y2.data(), y1.data(), y1.size() * sizeof(float)), 0) << "x_quantized";
      }
    }
  }
  backend::cuda::matmul_set_mmq_id(ctx.p, backend::cuda::kMmqIdMinPairs, 0);
}

// Captures f on a stream into a graph and replays it; returns the output after the replay.
template <typename F>
std::vector<float> replay(F f, test::DeviceVec<float>& y, size_t n) {
  cudaStream_t s;
  EXPECT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  EXPECT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  f(s);
  EXPECT_EQ(cudaSuccess, cudaStreamEndCapture(s, &g));
  EXPECT_EQ(cudaSuccess, cudaGraphInstantiate(&ge, g, 0));
  EXPECT_EQ(cudaSuccess, cudaMemset(y.get(), 0xff, n * sizeof(float)));
  EXPECT_EQ(cudaSuccess, cudaGraphLaunch(ge, s));
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  return y.to_host();
}

TEST(CudaMatmul, GraphReplayEqualsEager) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t n_in = 1024, n_out = 301, n_expert = 4;
  Ctx ctx(64, n_in, n_out, 64, n_expert);
  ASSERT_NE(ctx.p, nullptr);
  const std::vector<uint8_t> wb = quantized_rows(Type::Q4_K, n_out * n_expert, n_in, rng);
  test::DeviceVec<uint8_t> dw(wb);
  const Weight w = weight_view(Type::Q4_K, n_in, n_out, dw.get());
  const std::vector<float> x = gaussian(static_cast<size_t>(64 * n_in), rng);
  test::DeviceVec<float> dx(x);
  backend::cuda::matmul_set_mmq(ctx.p, 64, 0, 2);  // mmq at 64 tokens, with split-K
  for (int64_t n_tokens : {1, 5, 64}) {            // matvec, matvec masked, mmq (split-K)
    const size_t n = static_cast<size_t>(n_tokens * n_out);
    test::DeviceVec<float> dy(n);
    auto run = [&](cudaStream_t s) {
      backend::cuda::matmul(ctx.p, w, dx.get(), dy.get(), n_tokens, s);
    };
    run(nullptr);
    KILN_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> eager = dy.to_host();
    EXPECT_EQ(replay(run, dy, n), eager) << "n_tokens=" << n_tokens << " seed=" << seed;
  }
  {  // mmh at 64 tokens with split-K (its activations' layout pass in the graph too)
    backend::cuda::matmul_set_mmh(ctx.p, 64, 0, 2);
    const size_t n = static_cast<size_t>(64 * n_out);
    test::DeviceVec<float> dy(n);
    auto run = [&](cudaStream_t s) { backend::cuda::matmul(ctx.p, w, dx.get(), dy.get(), 64, s); };
    run(nullptr);
    KILN_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> eager = dy.to_host();
    EXPECT_EQ(replay(run, dy, n), eager) << "mmh seed=" << seed;
    backend::cuda::matmul_set_mmh(ctx.p, 0);
  }
  std::vector<int32_t> ids(64), x_rows(64);
  for (int p = 0; p < 64; ++p) ids[p] = static_cast<int32_t>(rng() % n_expert), x_rows[p] = p / 2;
  test::DeviceVec<int32_t> did(ids), dxr(x_rows);
  test::DeviceVec<float> dy(64 * n_out);
  auto run_id = [&](cudaStream_t s) {
    backend::cuda::matmul_id(ctx.p, w, n_expert, dx.get(), 32, dxr.get(), did.get(), dy.get(), 64,
                             s);
  };
  // 64 pairs: the int8 matvec per pair; then the grouped int8 MMA (moved to take 64 pairs).
  for (int64_t min_pairs : {backend::cuda::kMmqIdMinPairs, int64_t{0}}) {
    backend::cuda::matmul_set_mmq_id(ctx.p, min_pairs);
    run_id(nullptr);
    KILN_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> eager = dy.to_host();
    EXPECT_EQ(replay(run_id, dy, 64 * n_out), eager)
        << "matmul_id min_pairs=" << min_pairs << " seed=" << seed;
  }
}

// A quantized weight (host bytes, device copy, view) and the same view with its fp16 copy in
// `prepared`, as the CUDA backend makes it at load.
struct CopiedWeight {
  std::vector<uint8_t> host;
  test::DeviceVec<uint8_t> dev;
  test::DeviceVec<uint16_t> copy;
  Weight w, with_copy;
  CopiedWeight(Type type, int64_t n_out, int64_t n_in, std::mt19937_64& rng)
      : host(quantized_rows(type, n_out, n_in, rng)),
        dev(host),
        copy(static_cast<size_t>(n_out * n_in)),
        w(weight_view(type, n_in, n_out, dev.get())),
        with_copy(w) {
    backend::cuda::dequantize_rows_f16(w, 0, n_out, copy.get(), nullptr);
    with_copy.prepared = copy.get();
  }
};

// A quantized weight whose `prepared` holds its fp16 copy (the CUDA backend's, made at load)
// is multiplied in place on the cuBLAS path: the bits of dequantizing it there (one chunk: the
// same GEMM shape), and within the fp16 GEMM's bound of the reference; decode sizes ignore it.
TEST(CudaMatmul, Fp16CopyEqualsDequantizedChunks) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t n_in = 1024, n_out = 300;
  Ctx ctx(300, n_in, n_out);
  ASSERT_NE(ctx.p, nullptr);
  for (Type type : {Type::Q4_K, Type::Q6_K, Type::Q8_0, Type::Q4_0}) {
    SCOPED_TRACE(testing::Message() << quant::type_name(type) << " seed=" << seed);
    const CopiedWeight cw(type, n_out, n_in, rng);
    const std::vector<uint8_t>& wb = cw.host;
    const Weight &w = cw.w, &wc = cw.with_copy;
    for (int64_t n_tokens : {1, 300}) {
      const std::vector<float> x = gaussian(static_cast<size_t>(n_tokens * n_in), rng);
      test::DeviceVec<float> dx(x);
      test::DeviceVec<float> dy(static_cast<size_t>(n_tokens * n_out));
      auto run = [&](const Weight& ww) -> std::vector<float> {
        EXPECT_EQ(cudaSuccess,
                  cudaMemset(dy.get(), 0xff, static_cast<size_t>(n_tokens * n_out) * 4));
        backend::cuda::matmul(ctx.p, ww, dx.get(), dy.get(), n_tokens, nullptr);
        EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
        return dy.to_host();
      };
      const std::vector<float> chunked = run(w), copied = run(wc);
      EXPECT_EQ(std::memcmp(chunked.data(), copied.data(), chunked.size() * sizeof(float)), 0)
          << "n_tokens=" << n_tokens;
      std::vector<float> ref(static_cast<size_t>(n_tokens * n_out));
      backend::cpu::matmul_reference(weight_view(type, n_in, n_out, wb.data()), x.data(),
                                     ref.data(), n_tokens, nullptr);
      EXPECT_LE(rel_error(copied, ref), n_tokens == 1 ? kMatvecBound : kFp16GemmBound);
    }
  }
}

// KILN_CUDA_F16_COPY_TOKENS=N: steps of N+ tokens multiply a weight's fp16 copy on cuBLAS
// instead of taking mmh or mmq (batched decode): bit for bit the dequantize + cuBLAS path.
TEST(CudaMatmul, Fp16CopyTakesBatchedDecodeSteps) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t n_in = 4096, n_out = 4096, n_tokens = 64;
  setenv("KILN_CUDA_F16_COPY_TOKENS", "9", 1);  // read when a context is made
  Ctx with_copy(n_tokens, n_in, n_out);
  unsetenv("KILN_CUDA_F16_COPY_TOKENS");
  Ctx chunks(n_tokens, n_in, n_out);
  ASSERT_NE(with_copy.p, nullptr);
  ASSERT_NE(chunks.p, nullptr);
  backend::cuda::matmul_set_mmq(chunks.p, 0);  // dequantize + cuBLAS at 64 tokens
  backend::cuda::matmul_set_mmh(chunks.p, 0);
  for (Type type : {Type::Q4_K, Type::Q6_K}) {
    SCOPED_TRACE(testing::Message() << quant::type_name(type) << " seed=" << seed);
    const CopiedWeight cw(type, n_out, n_in, rng);
    const std::vector<uint8_t>& wb = cw.host;
    const Weight &w = cw.w, &wc = cw.with_copy;
    const std::vector<float> x = gaussian(static_cast<size_t>(n_tokens * n_in), rng);
    test::DeviceVec<float> dx(x);
    test::DeviceVec<float> dy(static_cast<size_t>(n_tokens * n_out));
    auto run = [&](backend::cuda::MatmulContext* ctx, const Weight& ww) -> std::vector<float> {
      EXPECT_EQ(cudaSuccess, cudaMemset(dy.get(), 0xff, static_cast<size_t>(n_tokens * n_out) * 4));
      backend::cuda::matmul(ctx, ww, dx.get(), dy.get(), n_tokens, nullptr);
      EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
      return dy.to_host();
    };
    const std::vector<float> copied = run(with_copy.p, wc), chunked = run(chunks.p, w);
    EXPECT_EQ(std::memcmp(copied.data(), chunked.data(), copied.size() * sizeof(float)), 0);
    std::vector<float> ref(static_cast<size_t>(n_tokens * n_out));
    backend::cpu::matmul_reference(weight_view(type, n_in, n_out, wb.data()), x.data(), ref.data(),
                                   n_tokens, nullptr);
    EXPECT_LE(rel_error(copied, ref), kFp16GemmBound);
  }
}

TEST(CudaMatmul, ContextReportsItsBytes) {
  KILN_REQUIRE_GPU();
  Ctx ctx(16, 4096, 4096);
  ASSERT_NE(ctx.p, nullptr);
  // The cuBLAS workspace (32 MiB), 16 x 4096 fp16 activations, 4096 x 4096 fp16 weights, the
  // matvec's and mmq's 16 x 4096 int8 activations with 16 x 128 (d, sum) pairs, and mmq's
  // split-K scratch: 4 x 16 x 4096 partial sums and 16384 tile counters.
  const uint64_t dense = (uint64_t{32} << 20) + 16 * 4096 * 2 + 4096 * 4096 * 2 + 16 * 4096 +
                         16 * 128 * 8 + 4 * 16 * 4096 * 4 + 16384 * 4;
  EXPECT_EQ(backend::cuda::matmul_context_bytes(ctx.p), dense);
  // With matmul_id (128 pairs, 8 experts): the plan (perm [128], the tile count, 3 words per
  // tile slot: 128 / 8 + 8 slots) and the grouped mmq's int8 rows, max(16, 128) x 4096 levels
  // and their (d, sum) pairs.
  Ctx moe(16, 4096, 4096, 128, 8);
  ASSERT_NE(moe.p, nullptr);
  EXPECT_EQ(backend::cuda::matmul_context_bytes(moe.p),
            dense + (128 + 1 + 3 * 24) * 4 + 128 * 4096 + 128 * 128 * 8);
}

// Activations that int8 levels hold exactly (each group of 32: integers in [-127, 127] with
// one of magnitude 127, times a power of two): the matvec path is then exact up to fp32
// summation, so it must match the reference to 1e-5 (a wrong nibble, scale or min shows).
TEST(CudaMatmul, MatvecExactOnRepresentableActivations) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  Ctx ctx(8, 2304, 67);
  ASSERT_NE(ctx.p, nullptr);
  for (Type t : {Type::Q4_0, Type::Q8_0, Type::Q4_K, Type::Q5_K, Type::Q6_K}) {
    const int64_t be = quant::traits(t).block_elems;
    for (int64_t n_in : {3 * be, int64_t{2304}}) {
      SCOPED_TRACE(testing::Message()
                   << quant::type_name(t) << " n_in=" << n_in << " seed=" << seed);
      const int64_t n_out = 67;
      const std::vector<uint8_t> wb = quantized_rows(t, n_out, n_in, rng);
      test::DeviceVec<uint8_t> dw(wb);
      for (int64_t n_tokens : {1, 2, 3, 5, 8}) {
        const std::vector<float> x = representable(n_tokens * n_in, rng);
        std::vector<float> ref(static_cast<size_t>(n_tokens * n_out));
        backend::cpu::matmul_reference(weight_view(t, n_in, n_out, wb.data()), x.data(), ref.data(),
                                       n_tokens, nullptr);
        test::DeviceVec<float> dx(x);
        test::DeviceVec<float> dy(ref.size());
        KILN_CUDA_OK(cudaMemset(dy.get(), 0xff, ref.size() * sizeof(float)));
        backend::cuda::matmul(ctx.p, weight_view(t, n_in, n_out, dw.get()), dx.get(), dy.get(),
                              n_tokens, nullptr);
        KILN_CUDA_OK(cudaDeviceSynchronize());
        const std::vector<float> y = dy.to_host();
        EXPECT_LE(rel_error(y, ref), kDirectBound) << "n_tokens=" << n_tokens;
        // Token 0's outputs do not depend on the batch: alone equals inside the batch.
        test::DeviceVec<float> d1(static_cast<size_t>(n_out));
        backend::cuda::matmul(ctx.p, weight_view(t, n_in, n_out, dw.get()), dx.get(), d1.get(), 1,
                              nullptr);
        KILN_CUDA_OK(cudaDeviceSynchronize());
        EXPECT_EQ(d1.to_host(), std::vector<float>(y.begin(), y.begin() + n_out))
            << "n_tokens=" << n_tokens;
      }
    }
  }
}

// The streaming matvec (each warp's rows bulk-copied into a ring of shared-memory slots of its
// own) on the shapes that exercise its layout: 40000 rows of 512 and 20001 of 2048 (four slots
// a warp and more rows a warp than slots on the H200's grid: the ring wraps, its barriers
// change parity; Q6_K rows of 512 are not 16-byte multiples and take the per-warp kernel), 37
// rows of 14336 and 19 of 28672 (two slots a warp, up to 120 KiB of shared memory). Runs
// crossing from one weight into the next are SharedInputEqualsSeparateCalls's. Against the
// reference on representable activations (within kDirectBound), a token alone equal to the
// same token in the batch, and each result bit for bit the per-warp kernel's (streaming off).
TEST(CudaMatmul, StreamMatvecRingsAndLongRows) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  Ctx ctx(8, 28672, 40000);
  ASSERT_NE(ctx.p, nullptr);
  struct Shape {
    int64_t n_out, n_in;
  };
  for (Type t : {Type::Q4_0, Type::Q8_0, Type::Q4_K, Type::Q5_K, Type::Q6_K}) {
    for (const Shape sh :
         {Shape{40000, 512}, Shape{20001, 2048}, Shape{37, 14336}, Shape{19, 28672}}) {
      SCOPED_TRACE(testing::Message()
                   << quant::type_name(t) << " " << sh.n_out << "x" << sh.n_in << " seed=" << seed);
      const std::vector<uint8_t> wb = quantized_rows(t, sh.n_out, sh.n_in, rng);
      test::DeviceVec<uint8_t> dw(wb);
      const Weight w = weight_view(t, sh.n_in, sh.n_out, dw.get());
      for (int64_t n_tokens : {1, 3, 8}) {
        const std::vector<float> x = representable(n_tokens * sh.n_in, rng);
        std::vector<float> ref(static_cast<size_t>(n_tokens * sh.n_out));
        backend::cpu::matmul_reference(weight_view(t, sh.n_in, sh.n_out, wb.data()), x.data(),
                                       ref.data(), n_tokens, nullptr);
        test::DeviceVec<float> dx(x);
        test::DeviceVec<float> dy(ref.size());
        KILN_CUDA_OK(cudaMemset(dy.get(), 0xff, ref.size() * sizeof(float)));
        backend::cuda::matmul(ctx.p, w, dx.get(), dy.get(), n_tokens, nullptr);
        KILN_CUDA_OK(cudaDeviceSynchronize());
        const std::vector<float> y = dy.to_host();
        EXPECT_LE(rel_error(y, ref), kDirectBound) << "n_tokens=" << n_tokens;
        test::DeviceVec<float> d1(static_cast<size_t>(sh.n_out));
        backend::cuda::matmul(ctx.p, w, dx.get(), d1.get(), 1, nullptr);
        KILN_CUDA_OK(cudaDeviceSynchronize());
        EXPECT_EQ(d1.to_host(), std::vector<float>(y.begin(), y.begin() + sh.n_out))
            << "n_tokens=" << n_tokens;
        const bool was = backend::cuda::matvec_stream();
        backend::cuda::matvec_set_stream(!was);
        test::DeviceVec<float> d2(ref.size());
        backend::cuda::matmul(ctx.p, w, dx.get(), d2.get(), n_tokens, nullptr);
        KILN_CUDA_OK(cudaDeviceSynchronize());
        backend::cuda::matvec_set_stream(was);
        EXPECT_EQ(d2.to_host(), y) << "streaming on and off differ, n_tokens=" << n_tokens;
      }
    }
  }
}

// Weights of the given types and heights over n_in (Gaussian rows, quantized): host bytes, device
// copies and views; what matmul_shared gives each of them on one input (outputs filled with NaN
// first: a row it leaves unwritten shows), and what matmul gives one alone (read back to the
// host).
struct WeightSet {
  std::vector<std::vector<uint8_t>> host;
  std::deque<test::DeviceVec<uint8_t>> dev;
  std::vector<Weight> ws;

  WeightSet(const std::vector<Type>& types, const std::vector<int64_t>& outs, int64_t n_in,
            std::mt19937_64& rng) {
    for (size_t i = 0; i < types.size(); ++i) {
      host.push_back(quantized_rows(types[i], outs[i], n_in, rng));
      dev.emplace_back(host[i]);
      ws.push_back(weight_view(types[i], n_in, outs[i], dev[i].get()));
    }
  }
  std::vector<std::vector<float>> shared(backend::cuda::MatmulContext* ctx, const float* dx,
                                         int64_t n_tokens) const {
    std::deque<test::DeviceVec<float>> ys;
    std::vector<const Weight*> wp;
    std::vector<float*> yp;
    for (const Weight& w : ws) {
      ys.emplace_back(static_cast<size_t>(n_tokens * w.n_out));
      EXPECT_EQ(cudaSuccess, cudaMemset(ys.back().get(), 0xff, n_tokens * w.n_out * sizeof(float)));
      wp.push_back(&w);
      yp.push_back(ys.back().get());
    }
    backend::cuda::matmul_shared(ctx, wp.data(), yp.data(), static_cast<int>(ws.size()), dx,
                                 n_tokens, nullptr);
    EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize()) << cudaGetErrorString(cudaGetLastError());
    std::vector<std::vector<float>> out;
    for (const auto& y : ys) out.push_back(y.to_host());
    return out;
  }
  std::vector<float> lone(backend::cuda::MatmulContext* ctx, size_t i, const float* dx,
                          int64_t n_tokens) const {
    test::DeviceVec<float> y(static_cast<size_t>(n_tokens * ws[i].n_out));
    backend::cuda::matmul(ctx, ws[i], dx, y.get(), n_tokens, nullptr);
    EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize()) << cudaGetErrorString(cudaGetLastError());
    return y.to_host();
  }
};

// Two type groups in one launch (KILN_CUDA_MATVEC_MIXED: default; one token): q and k in Q4_K or
// Q5_K with v in Q6_K, in either order, give the two launches' bits; other mixes and more tokens
// keep their launches.
TEST(CudaMatmul, MixedTypesInOneLaunchEqualTwoLaunches) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t n_in = 2048;
  Ctx ctx(8, n_in, 4096);
  ASSERT_NE(ctx.p, nullptr);
  struct Case {
    std::vector<Type> types;
    std::vector<int64_t> outs;
    bool mixed;  // expected to take the one launch at one token
  };
  const bool was = backend::cuda::matvec_stream(), mixed_was = backend::cuda::matvec_mixed();
  backend::cuda::matvec_set_stream(false);
  for (const Case& c : {Case{{Type::Q4_K, Type::Q4_K, Type::Q6_K}, {4096, 1024, 1024}, true},
                        Case{{Type::Q6_K, Type::Q5_K, Type::Q5_K}, {513, 2048, 37}, true},
                        Case{{Type::Q4_K, Type::Q6_K}, {3, 5}, true},
                        Case{{Type::Q4_K, Type::Q8_0, Type::Q6_K}, {256, 256, 256}, false},
                        Case{{Type::Q8_0, Type::Q6_K}, {256, 256}, false}}) {
    std::ostringstream what;
    for (size_t i = 0; i < c.types.size(); ++i)
      what << quant::type_name(c.types[i]) << "x" << c.outs[i] << " ";
    SCOPED_TRACE(what.str() + "seed=" + std::to_string(seed));
    const WeightSet set(c.types, c.outs, n_in, rng);
    for (int64_t n_tokens : {1, 2}) {
      const std::vector<float> x = representable(n_tokens * n_in, rng);
      test::DeviceVec<float> dx(x);
      std::vector<std::vector<float>> got[2];
      for (int mixed = 0; mixed < 2; ++mixed) {
        backend::cuda::matvec_set_mixed(mixed == 1);
        const int64_t launched = backend::cuda::matvec_mixed_launched();
        got[mixed] = set.shared(ctx.p, dx.get(), n_tokens);
        EXPECT_EQ(backend::cuda::matvec_mixed_launched() > launched,
                  mixed == 1 && n_tokens == 1 && c.mixed);
      }
      for (size_t i = 0; i < c.outs.size(); ++i)
        EXPECT_EQ(got[1][i], got[0][i]) << "weight " << i << ", n_tokens=" << n_tokens;
    }
  }
  backend::cuda::matvec_set_stream(was);
  backend::cuda::matvec_set_mixed(mixed_was);
}

// matmul_shared (one input quantized once for several weights, of mixed paths) equals a matmul
// per weight, bitwise.
TEST(CudaMatmul, SharedInputEqualsSeparateCalls) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t n_in = 1024;
  Ctx ctx(200, n_in, 300);
  ASSERT_NE(ctx.p, nullptr);
  // Weights of one type share a launch (rows numbered across them; a CTA's warps may span
  // two weights): three Q4_K of ragged heights, two F16, one Q6_K between them. At 200 tokens
  // every weight takes cuBLAS, the activations rounded to fp16 once for all of them.
  const WeightSet set({Type::Q4_K, Type::Q6_K, Type::Q4_K, Type::F16, Type::Q4_K, Type::F16},
                      {300, 77, 61, 64, 5, 33}, n_in, rng);
  for (int64_t n_tokens : {1, 3, 8, 16, 64, 200}) {
    const std::vector<float> x = gaussian(static_cast<size_t>(n_tokens * n_in), rng);
    test::DeviceVec<float> dx(x);
    const std::vector<std::vector<float>> shared = set.shared(ctx.p, dx.get(), n_tokens);
    for (size_t i = 0; i < set.ws.size(); ++i)
      EXPECT_EQ(shared[i], set.lone(ctx.p, i, dx.get(), n_tokens))
          << "weight " << i << " n_tokens=" << n_tokens << " seed=" << seed;
  }
}

// matmul_shared's grouped mmh (9..128 tokens): the weights mmh takes launched together by type,
// the short ones of a type a long one has included (a 1,024-row k projection beside a 4,096 x
// 4,096 q). Each weight's result bit for bit what mmh alone gives it (a context with mmh forced
// for every size), including when the split-K scratch cannot hold a launch's partial sums at
// once (128 tokens: a second launch); the F16 weight keeps its own path; the short Q4_K weight
// against the reference.
TEST(CudaMatmul, SharedInputGroupedMmhEqualsLoneMmh) {
  KILN_REQUIRE_GPU();
  if (backend::cuda::current_cc_major() != 9) GTEST_SKIP() << "mmh runs on sm_90 GPUs (wgmma)";
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t n_in = 4096;
  Ctx ctx(128, n_in, 4096);
  Ctx lone(128, n_in, 4096);
  ASSERT_NE(ctx.p, nullptr);
  ASSERT_NE(lone.p, nullptr);
  backend::cuda::matmul_set_mmh(lone.p, 128);
  // Two long weights (4,096 rows: Q4_K and Q6_K), short ones of both types (ragged heights:
  // a partial 128-row tile), an F16 between them.
  const WeightSet set({Type::Q4_K, Type::Q6_K, Type::Q4_K, Type::F16, Type::Q4_K, Type::Q6_K},
                      {4096, 77, 1024, 33, 61, 4096}, n_in, rng);
  for (int64_t n_tokens : {9, 16, 17, 64, 100, 128}) {
    const std::vector<float> x = gaussian(static_cast<size_t>(n_tokens * n_in), rng);
    test::DeviceVec<float> dx(x);
    const std::vector<std::vector<float>> shared = set.shared(ctx.p, dx.get(), n_tokens);
    for (size_t i = 0; i < set.ws.size(); ++i)
      EXPECT_EQ(shared[i],
                set.lone(set.ws[i].type == Type::F16 ? ctx.p : lone.p, i, dx.get(), n_tokens))
          << "weight " << i << " n_tokens=" << n_tokens << " seed=" << seed;
    std::vector<float> ref(static_cast<size_t>(n_tokens * set.ws[4].n_out));
    backend::cpu::matmul_reference(
        weight_view(set.ws[4].type, n_in, set.ws[4].n_out, set.host[4].data()), x.data(),
        ref.data(), n_tokens, nullptr);
    EXPECT_LE(rel_error(shared[4], ref), kFp16GemmBound)
        << "n_tokens=" << n_tokens << " seed=" << seed;
  }
}

// The int8 MMA path (mmq, 9..256 tokens) on every tiling (16, 32 or 64 tokens per CTA; one
// K split or several), ragged heights (a partial 64-row tile) and ragged K steps (Q4_0/Q8_0
// rows of 3 blocks, or 9 steps and a tail): on representable activations within 1e-5 of the
// reference (a wrong nibble, scale or min shows), on Gaussian ones within kMatvecBound.
TEST(CudaMatmul, MmqMatchesReference) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  Ctx ctx(256, 2336, 200);
  ASSERT_NE(ctx.p, nullptr);
  backend::cuda::matmul_set_mmh(ctx.p, 0);  // Q4_K and Q6_K to mmq too
  struct Tiling {
    int tile_tokens, splits;
  };
  const Tiling tilings[] = {{0, 0}, {16, 1}, {32, 3}, {64, 2}};
  for (Type t : {Type::Q4_0, Type::Q8_0, Type::Q4_K, Type::Q5_K, Type::Q6_K}) {
    const int64_t be = quant::traits(t).block_elems;
    for (int64_t n_in : {3 * be, be == 32 ? int64_t{2336} : int64_t{2304}}) {
      const int64_t n_out = n_in == 3 * be ? 67 : 200;
      const std::vector<uint8_t> wb = quantized_rows(t, n_out, n_in, rng);
      test::DeviceVec<uint8_t> dw(wb);
      const Weight hw = weight_view(t, n_in, n_out, wb.data());
      const Weight w = weight_view(t, n_in, n_out, dw.get());
      for (int64_t n_tokens : {9, 16, 17, 31, 64, 100, 128, 256}) {
        for (const Tiling& tl : tilings) {
          SCOPED_TRACE(testing::Message() << quant::type_name(t) << " n_in=" << n_in
                                          << " n_tokens=" << n_tokens << " tile=" << tl.tile_tokens
                                          << " splits=" << tl.splits << " seed=" << seed);
          backend::cuda::matmul_set_mmq(ctx.p, 256, tl.tile_tokens, tl.splits);
          for (bool exact : {true, false}) {
            const std::vector<float> x = exact
                                             ? representable(n_tokens * n_in, rng)
                                             : gaussian(static_cast<size_t>(n_tokens * n_in), rng);
            std::vector<float> ref(static_cast<size_t>(n_tokens * n_out));
            backend::cpu::matmul_reference(hw, x.data(), ref.data(), n_tokens, nullptr);
            test::DeviceVec<float> dx(x);
            test::DeviceVec<float> dy(ref.size());
            KILN_CUDA_OK(cudaMemset(dy.get(), 0xff, ref.size() * sizeof(float)));
            backend::cuda::matmul(ctx.p, w, dx.get(), dy.get(), n_tokens, nullptr);
            KILN_CUDA_OK(cudaDeviceSynchronize());
            EXPECT_LE(rel_error(dy.to_host(), ref), exact ? kDirectBound : kMatvecBound)
                << (exact ? "representable" : "gaussian");
          }
        }
      }
    }
  }
}

// mmh (fp16 MMA on weights dequantized in registers) against the reference on Q4_K, Q5_K, Q6_K
// and Q8_0,
// every tiling (16, 32 or 64 tokens a CTA; one K split or several), ragged heights (67 rows: a
// part-filled 128-row tile; 300: three tiles) and K of 3 or 9 blocks, 9..256 tokens: within
// the fp16 bound. A wrong nibble, scale, min or fragment position costs far more. The matmul's
// dispatch to mmh gives the direct call's bits.
TEST(CudaMatmul, MmhMatchesReference) {
  KILN_REQUIRE_GPU();
  if (backend::cuda::current_cc_major() != 9) GTEST_SKIP() << "mmh runs on sm_90 GPUs (wgmma)";
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  Ctx ctx(256, 2304, 300);
  ASSERT_NE(ctx.p, nullptr);
  constexpr int64_t kPartials = 8 * 256 * 300;
  test::DeviceVec<float> partials(static_cast<size_t>(kPartials));
  test::DeviceVec<int32_t> counters(1024);
  KILN_CUDA_OK(cudaMemset(counters.get(), 0, 1024 * sizeof(int32_t)));
  test::DeviceVec<__half> xh(static_cast<size_t>(256 * 2304));
  struct Tiling {
    int tile_tokens, splits;
  };
  const Tiling tilings[] = {{0, 0}, {16, 1}, {32, 3}, {64, 2}, {64, 8}};
  for (Type t : {Type::Q4_K, Type::Q5_K, Type::Q6_K, Type::Q8_0}) {
    for (int64_t n_in : {int64_t{768}, int64_t{2304}}) {
      for (int64_t n_out : {int64_t{67}, int64_t{300}}) {
        const std::vector<uint8_t> wb = quantized_rows(t, n_out, n_in, rng);
        test::DeviceVec<uint8_t> dw(wb);
        const Weight hw = weight_view(t, n_in, n_out, wb.data());
        const Weight w = weight_view(t, n_in, n_out, dw.get());
        ASSERT_TRUE(backend::cuda::mmh_supports(w));
        for (int64_t n_tokens : {9, 16, 17, 31, 64, 100, 256}) {
          const std::vector<float> x = gaussian(static_cast<size_t>(n_tokens * n_in), rng);
          std::vector<float> ref(static_cast<size_t>(n_tokens * n_out));
          backend::cpu::matmul_reference(hw, x.data(), ref.data(), n_tokens, nullptr);
          test::DeviceVec<float> dx(x);
          test::DeviceVec<float> dy(ref.size());
          backend::cuda::mmh_prepare(dx.get(), n_tokens, n_in, xh.get(), nullptr);
          std::vector<float> first;
          for (const Tiling& tl : tilings) {
            SCOPED_TRACE(testing::Message()
                         << quant::type_name(t) << " n_in=" << n_in << " n_out=" << n_out
                         << " n_tokens=" << n_tokens << " tile=" << tl.tile_tokens
                         << " splits=" << tl.splits << " seed=" << seed);
            backend::cuda::MmqScratch sc;
            sc.partials = partials.get();
            sc.partial_floats = kPartials;
            sc.counters = counters.get();
            sc.n_counters = 1024;
            sc.tile_tokens = tl.tile_tokens;
            sc.splits = tl.splits;
            KILN_CUDA_OK(cudaMemset(dy.get(), 0xff, ref.size() * sizeof(float)));
            backend::cuda::mmh(w, dy.get(), xh.get(), n_tokens, sc, nullptr);
            KILN_CUDA_OK(cudaDeviceSynchronize());
            const std::vector<float> y = dy.to_host();
            EXPECT_LE(rel_error(y, ref), kFp16GemmBound);
            if (tl.tile_tokens == 0) first = y;
          }
          {  // the matmul's dispatch (mmh forced for every size) with mmh's own tiling
            backend::cuda::matmul_set_mmh(ctx.p, 256);
            KILN_CUDA_OK(cudaMemset(dy.get(), 0xff, ref.size() * sizeof(float)));
            backend::cuda::matmul(ctx.p, w, dx.get(), dy.get(), n_tokens, nullptr);
            KILN_CUDA_OK(cudaDeviceSynchronize());
            EXPECT_EQ(dy.to_host(), first)
                << quant::type_name(t) << " n_tokens=" << n_tokens << " seed=" << seed;
          }
        }
      }
    }
  }
}

// The int8 activations a producer wrote (matmul_shared's x_quantized, here quantize_q8_32 into
// the context's buffers) give the same bits as the matmul quantizing x itself; and with mmq
// off, the same product comes from dequantize + cuBLAS within its fp16 bound.
TEST(CudaMatmul, MmqProducerQuantizedAndSwitch) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t n_in = 4096, n_out = 1000, n_tokens = 48;
  Ctx ctx(n_tokens, n_in, n_out);
  ASSERT_NE(ctx.p, nullptr);
  backend::cuda::matmul_set_mmq(ctx.p, n_tokens);  // mmq at 48 tokens for this 1000-row weight
  const std::vector<uint8_t> wb = quantized_rows(Type::Q4_K, n_out, n_in, rng);
  test::DeviceVec<uint8_t> dw(wb);
  const Weight w = weight_view(Type::Q4_K, n_in, n_out, dw.get());
  const std::vector<float> x = gaussian(static_cast<size_t>(n_tokens * n_in), rng);
  test::DeviceVec<float> dx(x);
  test::DeviceVec<float> d1(static_cast<size_t>(n_tokens * n_out));
  test::DeviceVec<float> d2(static_cast<size_t>(n_tokens * n_out));
  backend::cuda::matmul(ctx.p, w, dx.get(), d1.get(), n_tokens, nullptr);
  const backend::cuda::MatmulQ8 q = backend::cuda::matmul_q8(ctx.p);
  ASSERT_GE(q.max_tokens, n_tokens);
  backend::cuda::quantize_q8_32(dx.get(), n_tokens, n_in, q.xq, q.xds, nullptr);
  const Weight* wp[1] = {&w};
  float* yp[1] = {d2.get()};
  EXPECT_TRUE(backend::cuda::matmul_shared(ctx.p, wp, yp, 1, dx.get(), n_tokens, nullptr, true));
  KILN_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> y = d1.to_host();
  EXPECT_EQ(y, d2.to_host()) << "seed=" << seed;
  std::vector<float> ref(y.size());
  backend::cpu::matmul_reference(weight_view(Type::Q4_K, n_in, n_out, wb.data()), x.data(),
                                 ref.data(), n_tokens, nullptr);
  EXPECT_LE(rel_error(y, ref), kMatvecBound) << "seed=" << seed;
  backend::cuda::matmul_set_mmq(ctx.p, 0);
  backend::cuda::matmul(ctx.p, w, dx.get(), d2.get(), n_tokens, nullptr);
  KILN_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_LE(rel_error(d2.to_host(), ref), kFp16GemmBound) << "seed=" << seed;
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The deterministic mode (matmul_set_deterministic): a token's row the same bits whatever
// n_tokens and the other tokens, for every type (mmh with splits by shape on sm_90 for Q4_K,
// Q5_K, Q6_K and Q8_0; the direct kernels in runs of 8 for the rest), and still within the
// bound of the path against the reference. 300 tokens: more than the split-K scratch of a
// context made for 1,024-row weights holds at 4 splits (so the tokens go in runs); n_in 4096:
// 16 stages, up to 4 splits on 1,024 rows; sub-batches at odd offsets and lengths across the
// 8-token groups and the 16/32/64-token tiles.
TEST(CudaMatmul, DeterministicRowsDoNotDependOnTheBatch) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t n_tokens = 300, n_in = 4096, n_out = 1024;
  Ctx ctx(n_tokens, n_in, n_out);
  ASSERT_NE(ctx.p, nullptr);
  backend::cuda::matmul_set_deterministic(ctx.p, true);
  const std::vector<float> x = gaussian(static_cast<size_t>(n_tokens * n_in), rng);
  test::DeviceVec<float> dx(x);
  const std::pair<int64_t, int64_t> subs[] = {{0, 1},  {5, 1},    {17, 2},   {3, 5},   {0, 8},
                                              {40, 9}, {100, 16}, {7, 17},   {50, 33}, {64, 64},
                                              {1, 65}, {10, 128}, {150, 150}};
  for (Type t : {Type::Q4_K, Type::Q5_K, Type::Q6_K, Type::Q8_0, Type::F16, Type::BF16, Type::Q4_0,
                 Type::Q3_K, Type::F32}) {
    SCOPED_TRACE(testing::Message() << quant::type_name(t) << " seed=" << seed);
    const std::vector<uint8_t> wb = quantized_rows(t, n_out, n_in, rng);
    test::DeviceVec<uint8_t> dw(wb);
    const Weight hw = weight_view(t, n_in, n_out, wb.data());
    const Weight w = weight_view(t, n_in, n_out, dw.get());
    std::vector<float> ref(static_cast<size_t>(n_tokens * n_out));
    backend::cpu::matmul_reference(hw, x.data(), ref.data(), n_tokens, nullptr);
    test::DeviceVec<float> dy(ref.size());
    KILN_CUDA_OK(cudaMemset(dy.get(), 0xff, ref.size() * sizeof(float)));
    backend::cuda::matmul(ctx.p, w, dx.get(), dy.get(), n_tokens, nullptr);
    KILN_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> all = dy.to_host();
    const bool mmh = backend::cuda::mmh_supports(w);
    EXPECT_LE(rel_error(all, ref), mmh ? kFp16GemmBound : kDirectBound) << "mmh " << mmh;
    for (auto [off, n] : subs) {
      SCOPED_TRACE(testing::Message() << "tokens " << off << ".." << off + n);
      test::DeviceVec<float> ds(static_cast<size_t>(n * n_out));
      backend::cuda::matmul(ctx.p, w, dx.get() + off * n_in, ds.get(), n, nullptr);
      KILN_CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(ds.to_host(),
                std::vector<float>(all.begin() + off * n_out, all.begin() + (off + n) * n_out));
    }
    // Beside another weight of the type in one call (mmh's shared launch): the same bits.
    const std::vector<uint8_t> wb2 = quantized_rows(t, 256, n_in, rng);
    test::DeviceVec<uint8_t> dw2(wb2);
    const Weight w2 = weight_view(t, n_in, 256, dw2.get());
    test::DeviceVec<float> dp(ref.size()), dq(static_cast<size_t>(n_tokens * 256));
    const Weight* ws[2] = {&w2, &w};
    float* ys[2] = {dq.get(), dp.get()};
    EXPECT_FALSE(backend::cuda::matmul_shared(ctx.p, ws, ys, 2, dx.get(), n_tokens, nullptr));
    KILN_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(dp.to_host(), all);
  }
}

// matmul_id in the deterministic mode: a pair's row the same bits whatever the other pairs
// (the direct kernels for every pair count, where the default takes matvec_id or mmq_id by
// count), within the direct kernels' bound of the per-pair reference.
TEST(CudaMatmul, DeterministicMatmulIdRowsDoNotDependOnThePairs) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t n_in = 512, n_out = 96, n_expert = 6, n_rows = 60, n_pairs = 180;
  Ctx ctx(n_rows, n_in, n_out, n_pairs, n_expert);
  ASSERT_NE(ctx.p, nullptr);
  backend::cuda::matmul_set_deterministic(ctx.p, true);
  const std::vector<float> x = gaussian(static_cast<size_t>(n_rows * n_in), rng);
  std::vector<int32_t> rows(n_pairs), ids(n_pairs);
  for (int64_t p = 0; p < n_pairs; ++p) {
    rows[p] = static_cast<int32_t>(p / 3);
    ids[p] = static_cast<int32_t>(rng() % n_expert);
  }
  test::DeviceVec<float> dx(x);
  test::DeviceVec<int32_t> drows(rows), dids(ids);
  for (Type t : {Type::Q4_K, Type::Q8_0, Type::F16}) {
    SCOPED_TRACE(testing::Message() << quant::type_name(t) << " seed=" << seed);
    const std::vector<uint8_t> wb = quantized_rows(t, n_expert * n_out, n_in, rng);
    test::DeviceVec<uint8_t> dw(wb);
    Weight w = weight_view(t, n_in, n_out, dw.get());
    w.n_mats = n_expert;
    std::vector<float> ref(static_cast<size_t>(n_pairs * n_out));
    for (int64_t p = 0; p < n_pairs; ++p) {
      const Weight he = weight_view(t, n_in, n_out, wb.data() + ids[p] * n_out * w.row_bytes);
      backend::cpu::matmul_reference(he, x.data() + rows[p] * n_in, ref.data() + p * n_out, 1,
                                     nullptr);
    }
    test::DeviceVec<float> dy(ref.size());
    EXPECT_FALSE(backend::cuda::matmul_id(ctx.p, w, n_expert, dx.get(), n_rows, drows.get(),
                                          dids.get(), dy.get(), n_pairs, nullptr));
    KILN_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> all = dy.to_host();
    EXPECT_LE(rel_error(all, ref), kDirectBound);
    for (auto [off, n] : {std::pair<int64_t, int64_t>{0, 1}, {7, 2}, {30, 64}, {100, 80}}) {
      SCOPED_TRACE(testing::Message() << "pairs " << off << ".." << off + n);
      test::DeviceVec<float> ds(static_cast<size_t>(n * n_out));
      backend::cuda::matmul_id(ctx.p, w, n_expert, dx.get(), n_rows, drows.get() + off,
                               dids.get() + off, ds.get(), n, nullptr);
      KILN_CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(ds.to_host(),
                std::vector<float>(all.begin() + off * n_out, all.begin() + (off + n) * n_out));
    }
  }
}

}  // namespace
}  // namespace kiln
