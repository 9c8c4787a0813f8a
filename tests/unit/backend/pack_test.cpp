// Packed (interleaved) weights, pack.h: the layout byte for byte, the packed kernels
// against the scalar reference dots, bitwise batch and thread invariance (a token alone, in
// any batch, on 1 or 2 threads), and AVX2 == AVX-512 on random block bytes (every scale,
// weights of -128 included).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kiln/backend/cpu/kernels.h"
#include "kiln/backend/cpu/matmul.h"
#include "kiln/backend/cpu/pack.h"
#include "kiln/backend/cpu/quantize_act.h"
#include "kiln/quant/fp16.h"
#include "kiln/quant/types.h"
#include "kiln/util/thread_pool.h"
#include "unit/quant/random_blocks.h"

namespace kiln::backend::cpu {
namespace {

using quant::Type;

struct Packed {
  std::vector<uint8_t> bytes;   // as the file stores them
  std::vector<uint8_t> packed;  // pack_weight's copy
  Weight w;                     // both
};

// Random Q8_0 block bytes (random int8 values, finite random f16 scales).
Packed make_packed(int64_t n_in, int64_t n_out, uint64_t seed) {
  Packed p;
  p.bytes =
      quant::testing::random_blocks({34, {0, -1}, -1}, static_cast<int>(n_in / 32 * n_out), seed);
  // Keep the scales moderate so the products stay finite: exponent bits 8..22.
  for (size_t b = 0; b < p.bytes.size(); b += 34) p.bytes[b + 1] = (p.bytes[b + 1] & 0x83) | 0x20;
  p.w = Weight{Type::Q8_0, n_in, n_out, p.bytes.data(), static_cast<uint64_t>(n_in / 32 * 34)};
  p.packed.resize(packed_bytes(p.w));
  pack_weight(p.w, p.packed.data());
  p.w.packed = p.packed.data();
  return p;
}

std::vector<float> make_acts(int64_t n_tokens, int64_t n_in, uint32_t seed) {
  std::vector<float> x(static_cast<size_t>(n_tokens * n_in));
  uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (auto& v : x) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    v = static_cast<float>(static_cast<int64_t>(s % 20001) - 10000) / 1000.0f;
  }
  return x;
}

std::vector<float> run(KernelPath p, const Weight& w, const std::vector<float>& x, int64_t n,
                       util::ThreadPool* pool = nullptr) {
  std::vector<float> y(static_cast<size_t>(n * w.n_out), NAN);
  matmul_on_path(w, x.data(), y.data(), n, pool, p);
  return y;
}

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

std::vector<KernelPath> simd_paths() {
  std::vector<KernelPath> v;
  for (KernelPath k : {KernelPath::Avx2, KernelPath::Avx512}) {
    if (path_available(k)) v.push_back(k);
  }
  return v;
}

TEST(Pack, Q8LayoutByteForByte) {
  if (simd_paths().empty()) {
    GTEST_SKIP() << "no SIMD path";
  }
  const Packed p = make_packed(96, 16, 1);
  const int64_t nb = 3;
  for (int64_t r = 0; r < 16; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* src = p.bytes.data() + r * nb * 34 + b * 34;
      const uint8_t* dst = p.packed.data() + ((r / 8) * nb + b) * kPackedQ8BlockBytes;
      const int64_t i = r % 8;
      EXPECT_EQ(0, std::memcmp(dst + 2 * i, src, 2)) << r << " " << b;
      for (int64_t e = 0; e < 32; ++e) {
        ASSERT_EQ(dst[16 + 32 * (e / 4) + 4 * i + e % 4], static_cast<uint8_t>(src[2 + e] ^ 0x80))
            << "row " << r << " block " << b << " element " << e;
      }
    }
  }
}

// Each output against the scalar reference dot on the same quantized activations: the same
// exact integers per block and the same block order, so only fp32 rounding may differ
// (fma vs multiply then add).
TEST(Pack, Q8MatchesScalarReferenceDots) {
  for (KernelPath path : simd_paths()) {
    for (int64_t n_in : {32, 96, 2080}) {
      const int64_t n_out = 24;
      const Packed p = make_packed(n_in, n_out, 7 + n_in);
      for (int64_t n : {1, 3, 9, 40}) {
        const std::vector<float> x = make_acts(n, n_in, static_cast<uint32_t>(n));
        const std::vector<float> y = run(path, p.w, x, n);
        QuantizedActs a;
        quantize_acts(ActFormat::Q8_0, x.data(), n, n_in, &a, nullptr);
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t o = 0; o < n_out; ++o) {
            const float ref = vec_dot_q8_0_scalar(p.w.row(o), a.qs.data() + t * a.qs_stride,
                                                  a.d.data() + t * a.d_stride, n_in);
            // Bound: one fp32 rounding of the running sum per block, 2^-23 x sum of |terms|
            // per step (the integers are exact; fma and multiply-then-add differ by that).
            double mag = 0;
            for (int64_t b = 0; b < n_in / 32; ++b) {
              const uint8_t* blk = p.w.row(o) + b * 34;
              uint16_t h;
              std::memcpy(&h, blk, 2);
              int32_t isum = 0;
              for (int k = 0; k < 32; ++k)
                isum += static_cast<int8_t>(blk[2 + k]) * a.qs[t * a.qs_stride + b * 32 + k];
              mag += std::fabs(static_cast<double>(quant::fp16_to_fp32(h)) *
                               a.d[t * a.d_stride + b] * isum);
            }
            mag *= static_cast<double>(n_in / 32) * std::ldexp(1.0, -22);
            const float got = y[t * n_out + o];
            ASSERT_LE(std::fabs(static_cast<double>(got) - ref), mag + 1e-30)
                << path_name(path) << " n_in " << n_in << " n " << n << " t " << t << " o " << o;
          }
        }
      }
    }
  }
}

// A token's outputs are the same bits alone, inside batches of every size, at any position
// of the batch, and on 1 or 2 threads; AVX2 and AVX-512 agree bit for bit.
TEST(Pack, Q8BatchThreadAndPathInvariant) {
  util::ThreadPool pool2(2);
  const int64_t n_in = 320, n_out = 48, n_batch = 40;
  const Packed p = make_packed(n_in, n_out, 99);
  const std::vector<float> x = make_acts(n_batch, n_in, 5);
  std::vector<std::vector<float>> fulls;
  for (KernelPath path : simd_paths()) {
    const std::vector<float> full = run(path, p.w, x, n_batch);
    EXPECT_TRUE(same_bits(full.data(), run(path, p.w, x, n_batch, &pool2).data(), full.size()));
    for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 16, 17}) {
      for (int64_t t0 : {int64_t{0}, int64_t{11}, n_batch - n}) {
        const std::vector<float> xs(x.begin() + t0 * n_in, x.begin() + (t0 + n) * n_in);
        const std::vector<float> part = run(path, p.w, xs, n, n % 2 ? &pool2 : nullptr);
        ASSERT_TRUE(same_bits(part.data(), full.data() + t0 * n_out, part.size()))
            << path_name(path) << " " << n << " at " << t0;
      }
    }
    fulls.push_back(full);
  }
  if (fulls.size() == 2) {
    EXPECT_TRUE(same_bits(fulls[0].data(), fulls[1].data(), fulls[0].size()));
  }
}

// Packing changes only the SIMD kernels: the scalar path reads the rows as stored, and a
// weight whose n_out is not a multiple of 8 is not packed.
TEST(Pack, ScalarPathAndUnpackableShapes) {
  const Packed p = make_packed(64, 8, 3);
  Weight plain = p.w;
  plain.packed = nullptr;
  const std::vector<float> x = make_acts(3, 64, 4);
  EXPECT_TRUE(same_bits(run(KernelPath::Scalar, p.w, x, 3).data(),
                        run(KernelPath::Scalar, plain, x, 3).data(), 24));
  Weight odd = plain;
  odd.n_out = 7;
  EXPECT_FALSE(can_pack(odd));
  Weight k4 = plain;
  k4.type = Type::Q4_K;
  EXPECT_FALSE(can_pack(k4));
  if (!simd_paths().empty()) {
    EXPECT_TRUE(can_pack(plain));
    PackedStore store;
    Weight w = plain;
    store.pack(&w);
    ASSERT_NE(w.packed, nullptr);
    EXPECT_EQ(store.bytes(), packed_bytes(plain));
    EXPECT_EQ(0, std::memcmp(w.packed, p.packed.data(), p.packed.size()));
  }
}

}  // namespace
}  // namespace kiln::backend::cpu
