// Packed (interleaved) weights, pack.h: the layout byte for byte for 8- and 16-row groups,
// the packed kernels against the scalar reference dots, bitwise batch and thread invariance
// (a token alone, in any batch, on 1 or 2 threads), and AVX2 (8 rows) == AVX-512 (16 rows)
// on random block bytes (every scale, weights of -128 included).
#include <gtest/gtest.h>

#include <memory>

#include <cmath>
#include <cstring>
#include <vector>

#include "kiln/backend/cpu/kernels.h"
#include "kiln/backend/cpu/matmul.h"
#include "kiln/backend/cpu/pack.h"
#include "kiln/backend/cpu/quantize_act.h"
#include "kiln/quant/blocks.h"
#include "kiln/quant/fp16.h"
#include "kiln/quant/types.h"
#include "kiln/util/thread_pool.h"
#include "unit/quant/random_blocks.h"

namespace kiln::backend::cpu {
namespace {

using quant::Type;

struct Packed {
  std::vector<uint8_t> bytes;                                         // as the file stores them
  std::vector<uint8_t> packed;                                        // pack_weight's copy
  std::unique_ptr<PackedCopy> copy = std::make_unique<PackedCopy>();  // w.prepared
  Weight w;                                                           // both
};

// Random block bytes (random quants and scales, finite random f16 d / dmin), packed in groups
// of `rows`.
Packed make_packed(Type type, int64_t n_in, int64_t n_out, uint64_t seed, int64_t rows) {
  Packed p;
  const bool q8 = type == Type::Q8_0, q6 = type == Type::Q6_K;
  const int64_t blk = q8 ? 32 : 256, bb = q8 ? 34 : q6 ? 210 : 144;
  quant::testing::RandomLayout layout{144, {0, 2}, -1};
  if (q8) layout = {34, {0, -1}, -1};
  if (q6) layout = {210, {208, -1}, -1};
  p.bytes = quant::testing::random_blocks(layout, static_cast<int>(n_in / blk * n_out), seed);
  p.w = Weight{type, n_in, n_out, p.bytes.data(), static_cast<uint64_t>(n_in / blk * bb)};
  p.packed.resize(packed_bytes(p.w, rows));
  pack_weight(p.w, rows, p.packed.data());
  *p.copy = PackedCopy{p.packed.data(), static_cast<int32_t>(rows)};
  p.w.prepared = p.copy.get();
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
  for (const int64_t R : {8, 16}) {
    const Packed p = make_packed(Type::Q8_0, 96, 32, 1, R);
    const int64_t nb = 3;
    for (int64_t r = 0; r < 32; ++r) {
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* src = p.bytes.data() + r * nb * 34 + b * 34;
        const uint8_t* dst = p.packed.data() + ((r / R) * nb + b) * 34 * R;
        const int64_t i = r % R;
        EXPECT_EQ(0, std::memcmp(dst + 2 * i, src, 2)) << r << " " << b;
        for (int64_t e = 0; e < 32; ++e) {
          ASSERT_EQ(dst[2 * R + 4 * R * (e / 4) + 4 * i + e % 4],
                    static_cast<uint8_t>(src[2 + e] ^ 0x80))
              << "R " << R << " row " << r << " block " << b << " element " << e;
        }
      }
    }
  }
}

TEST(Pack, Q4KLayoutMatchesTheBlockFields) {
  for (const int64_t R : {8, 16}) {
    const Packed p = make_packed(Type::Q4_K, 512, R, 2, R);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t b = 0; b < 2; ++b) {
        const uint8_t* src = p.bytes.data() + r * 288 + b * 144;
        const uint8_t* dst = p.packed.data() + b * 148 * R;
        EXPECT_EQ(0, std::memcmp(dst + 2 * r, src, 2));
        EXPECT_EQ(0, std::memcmp(dst + 2 * R + 2 * r, src + 2, 2));
        for (int j = 0; j < 8; ++j) {
          uint8_t sc, mn;
          quant::unpack_scale_min_k4(j, src + 4, &sc, &mn);
          EXPECT_EQ(dst[4 * R + R * j + r], sc);
          EXPECT_EQ(dst[12 * R + 2 * R * (j / 2) + 2 * r + j % 2], mn);
          for (int l = 0; l < 32; ++l) {
            const uint8_t byte = src[16 + 32 * (j / 2) + l];
            const int q = j % 2 == 0 ? byte & 15 : byte >> 4;
            const int v = (l % 16) / 4, e = l % 4;
            const uint8_t packed = dst[20 * R + 16 * R * j + 4 * R * v + 4 * r + e];
            ASSERT_EQ(l < 16 ? packed & 15 : packed >> 4, q)
                << R << " " << r << " " << b << " " << j << " " << l;
          }
        }
      }
    }
  }
}

// Element e of a Q6_K block, read the way ggml's dequantize_row_q6_K does.
int q6_value(const uint8_t* blk, int e) {
  const int n = e / 128, j = (e % 128) / 32, l = e % 32;
  const int lo = blk[64 * n + l + 32 * (j & 1)] >> (j >= 2 ? 4 : 0) & 15;
  return lo | ((blk[128 + 32 * n + l] >> (2 * j)) & 3) << 4;
}

TEST(Pack, Q6KLayoutMatchesTheBlockFields) {
  for (const int R : {8, 16}) {
    const Packed p = make_packed(Type::Q6_K, 256, R, 3, R);
    for (int r = 0; r < R; ++r) {
      const uint8_t* src = p.bytes.data() + r * 210;
      const uint8_t* dst = p.packed.data();
      EXPECT_EQ(0, std::memcmp(dst + 2 * r, src + 208, 2));
      for (int k = 0; k < 16; ++k) EXPECT_EQ(dst[2 * R + R * k + r], src[192 + k]);
      for (int e = 0; e < 256; ++e) {
        const int v = e / 4, k = v / 4, c = v % 4, at = 4 * r + e % 4;
        const uint8_t* sub = dst + 18 * R + 12 * R * k;
        const int lo = sub[4 * R * (c / 2) + at] >> (4 * (c % 2)) & 15;
        const int hi = sub[8 * R + at] >> (2 * c) & 3;
        ASSERT_EQ(lo | hi << 4, q6_value(src, e)) << "R " << R << " row " << r << " element " << e;
      }
    }
  }
}

// Sum over the row of |each element's contribution| (Q8_0: |d q x|; Q4_K: |d sc q x| +
// |dmin m x|), the scale of the fp32 rounding the kernels may add.
double magnitude(Type type, const uint8_t* row, const QuantizedActs& a, int64_t t, int64_t n_in) {
  const int8_t* xq = a.qs.data() + t * a.qs_stride;
  const float* xd = a.d.data() + t * a.d_stride;
  double mag = 0;
  if (type == Type::Q8_0) {
    for (int64_t b = 0; b < n_in / 32; ++b) {
      uint16_t h;
      std::memcpy(&h, row + b * 34, 2);
      for (int k = 0; k < 32; ++k) {
        mag += std::fabs(static_cast<double>(quant::fp16_to_fp32(h)) * xd[b] *
                         static_cast<int8_t>(row[b * 34 + 2 + k]) * xq[b * 32 + k]);
      }
    }
    return mag;
  }
  if (type == Type::Q6_K) {
    for (int64_t b = 0; b < n_in / 256; ++b) {
      const uint8_t* blk = row + b * 210;
      uint16_t h;
      std::memcpy(&h, blk + 208, 2);
      for (int e = 0; e < 256; ++e) {
        const int sc = static_cast<int8_t>(blk[192 + e / 16]);
        mag += std::fabs(static_cast<double>(quant::fp16_to_fp32(h)) * sc *
                         (q6_value(blk, e) - 32) * xq[b * 256 + e] * xd[b]);
      }
    }
    return mag;
  }
  for (int64_t b = 0; b < n_in / 256; ++b) {
    const uint8_t* blk = row + b * 144;
    uint16_t h[2];
    std::memcpy(h, blk, 4);
    const double d = quant::fp16_to_fp32(h[0]), dmin = quant::fp16_to_fp32(h[1]);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, mn;
      quant::unpack_scale_min_k4(j, blk + 4, &sc, &mn);
      for (int l = 0; l < 32; ++l) {
        const uint8_t byte = blk[16 + 32 * (j / 2) + l];
        const int q = j % 2 == 0 ? byte & 15 : byte >> 4;
        const int x = xq[b * 256 + 32 * j + l];
        mag += (std::fabs(d * sc * q * x) + std::fabs(dmin * mn * x)) * xd[b];
      }
    }
  }
  return mag;
}

// Each output against the scalar reference dot on the same quantized activations: the same
// exact integers per block, so only fp32 rounding may differ: a few roundings per block,
// each at most 2^-23 of the magnitude.
TEST(Pack, MatchesScalarReferenceDots) {
  for (Type type : {Type::Q8_0, Type::Q4_K, Type::Q6_K}) {
    for (KernelPath path : simd_paths()) {
      for (int64_t n_in : {256, 768, 2048}) {
        const int64_t n_out = 48;
        const Packed p = make_packed(type, n_in, n_out, 7 + n_in, pack_rows(path));
        for (int64_t n : {1, 3, 9, 40}) {
          const std::vector<float> x = make_acts(n, n_in, static_cast<uint32_t>(n));
          const std::vector<float> y = run(path, p.w, x, n);
          QuantizedActs a;
          quantize_acts(act_format(type), x.data(), n, n_in, &a, nullptr);
          const int64_t steps = type == Type::Q8_0 ? n_in / 32 : n_in / 256;
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t o = 0; o < n_out; ++o) {
              const int8_t* xq = a.qs.data() + t * a.qs_stride;
              const float* xd = a.d.data() + t * a.d_stride;
              const float ref = type == Type::Q8_0 ? vec_dot_q8_0_scalar(p.w.row(o), xq, xd, n_in)
                                : type == Type::Q4_K
                                    ? vec_dot_q4_k_scalar(p.w.row(o), xq, xd, n_in)
                                    : vec_dot_q6_k_scalar(p.w.row(o), xq, xd, n_in);
              const double bound = (4.0 * static_cast<double>(steps) + 4.0) * std::ldexp(1.0, -23) *
                                   magnitude(type, p.w.row(o), a, t, n_in);
              ASSERT_LE(std::fabs(static_cast<double>(y[t * n_out + o]) - ref), bound + 1e-30)
                  << quant::type_name(type) << " " << path_name(path) << " n_in " << n_in << " n "
                  << n << " t " << t << " o " << o << " ref " << ref;
            }
          }
        }
      }
    }
  }
}

// A token's outputs are the same bits alone, inside batches of every size, at any position
// of the batch, and on 1 or 2 threads; AVX2 (8-row groups) and AVX-512 (16-row groups) agree
// bit for bit.
TEST(Pack, BatchThreadAndPathInvariant) {
  util::ThreadPool pool2(2);
  for (Type type : {Type::Q8_0, Type::Q4_K, Type::Q6_K}) {
    const int64_t n_in = type == Type::Q8_0 ? 320 : 768, n_out = 48, n_batch = 40;
    const std::vector<float> x = make_acts(n_batch, n_in, 5);
    std::vector<std::vector<float>> fulls;
    for (KernelPath path : simd_paths()) {
      const Packed p = make_packed(type, n_in, n_out, 99, pack_rows(path));
      const std::vector<float> full = run(path, p.w, x, n_batch);
      EXPECT_TRUE(same_bits(full.data(), run(path, p.w, x, n_batch, &pool2).data(), full.size()));
      for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 16, 17}) {
        for (int64_t t0 : {int64_t{0}, int64_t{11}, n_batch - n}) {
          const std::vector<float> xs(x.begin() + t0 * n_in, x.begin() + (t0 + n) * n_in);
          const std::vector<float> part = run(path, p.w, xs, n, n % 2 ? &pool2 : nullptr);
          ASSERT_TRUE(same_bits(part.data(), full.data() + t0 * n_out, part.size()))
              << quant::type_name(type) << " " << path_name(path) << " " << n << " at " << t0;
        }
      }
      fulls.push_back(full);
    }
    if (fulls.size() == 2) {
      EXPECT_TRUE(same_bits(fulls[0].data(), fulls[1].data(), fulls[0].size()))
          << quant::type_name(type);
    }
  }
}

// Packing changes only the SIMD kernels: the scalar path reads the rows as stored, a path
// whose packed kernels take another row count uses its row-major kernels (the same bits as
// the unpacked weight), and a weight whose n_out is not a multiple of R is not packed.
TEST(Pack, ScalarPathOtherRowCountsAndUnpackableShapes) {
  const Packed p = make_packed(Type::Q8_0, 64, 16, 3, 8);
  Weight plain = p.w;
  plain.prepared = nullptr;
  const std::vector<float> x = make_acts(3, 64, 4);
  EXPECT_TRUE(same_bits(run(KernelPath::Scalar, p.w, x, 3).data(),
                        run(KernelPath::Scalar, plain, x, 3).data(), 48));
  if (path_available(KernelPath::Avx512)) {
    EXPECT_TRUE(same_bits(run(KernelPath::Avx512, p.w, x, 3).data(),
                          run(KernelPath::Avx512, plain, x, 3).data(), 48));
  }
  Weight odd = plain;
  odd.n_out = 7;
  EXPECT_FALSE(can_pack(odd, 8));
  Weight eight = plain;
  eight.n_out = 8;
  EXPECT_TRUE(can_pack(eight, 8));
  EXPECT_FALSE(can_pack(eight, 16));
  EXPECT_FALSE(can_pack(plain, 4));
  Weight k5 = plain;
  k5.type = Type::Q5_K;
  k5.n_in = 256;
  EXPECT_FALSE(can_pack(k5, 8));
  EXPECT_EQ(pack_rows(KernelPath::Scalar), 0);
  const int64_t rows = pack_rows(best_kernel_path());
  if (rows > 0) {
    EXPECT_TRUE(can_pack(plain, rows));
    PackedStore store;
    Weight w = plain;
    store.pack(&w);
    ASSERT_NE(packed_copy(w), nullptr);
    EXPECT_EQ(packed_copy(w)->rows, rows);
    EXPECT_EQ(store.bytes(), packed_bytes(plain, rows));
    const Packed q = make_packed(Type::Q8_0, 64, 16, 3, rows);
    EXPECT_EQ(0, std::memcmp(packed_copy(w)->data, q.packed.data(), q.packed.size()));
  }
}

}  // namespace
}  // namespace kiln::backend::cpu
