// The device block decoders (backend/cuda/quant_blocks.cuh) compiled for the host and checked
// bit for bit against quant::dequantize_row, so they are tested on every machine, GPU or not
// (the GPU tests check the same code on the device). The CUDA built-ins they use map to plain
// fp32 arithmetic, which rounds the same way (IEEE single, nearest even; the host build does
// not contract, -std=c++20). This file must not include a CUDA header: it defines the
// qualifiers itself.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#define __device__
#define __forceinline__ inline
namespace {
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace
#include "kiln/backend/cuda/quant_blocks.cuh"
#include "kiln/quant/convert.h"
#include "unit/quant/random_blocks.h"

namespace kiln {
namespace {

using quant::testing::RandomLayout;
namespace qb = backend::cuda::qb;

// Decodes num_blocks random blocks of D with every dec8 flavour and counts the elements that
// differ from the reference: the exact flavour on every value, the fast one (kExact = false,
// the matmul's) on the finite ones.
template <class D>
int64_t count_mismatches(const RandomLayout& l, int num_blocks, uint64_t seed) {
  constexpr bool kPlain =
      D::kType == quant::Type::F32 || D::kType == quant::Type::F16 || D::kType == quant::Type::BF16;
  const int elems = num_blocks * D::kElems;
  const std::vector<uint8_t> bytes =
      quant::testing::random_blocks(l, kPlain ? elems : num_blocks, seed);
  // 16-byte aligned, as the direct kernel's shared-memory chunks are.
  std::vector<uint8_t> buf(bytes.size() + 16);
  uint8_t* p = buf.data() + (16 - (reinterpret_cast<uintptr_t>(buf.data()) & 15));
  std::memcpy(p, bytes.data(), bytes.size());
  std::vector<float> ref(static_cast<size_t>(elems));
  EXPECT_TRUE(quant::dequantize_row(D::kType, p, ref.data(), elems).ok());
  int64_t bad = 0;
  for (int b = 0; b < num_blocks; ++b) {
    for (int j = 0; j < D::kElems / 8; ++j) {
      float exact[8], fast[8], fast2[8];
      const uint8_t* blk = p + b * D::kBytes;
      D::template dec8<2, true>(blk, j, exact);
      D::template dec8<16, false>(blk, j, fast);
      D::template dec8<2, false>(blk, j, fast2);
      for (int k = 0; k < 8; ++k) {
        const float r = ref[b * D::kElems + 8 * j + k];
        // F16's dec8 is the matmul's (finite values only); dequantization uses elem().
        if (D::kType != quant::Type::F16) bad += std::memcmp(&exact[k], &r, 4) != 0;
        if (std::isfinite(r)) {
          bad += std::memcmp(&fast[k], &r, 4) != 0;
          bad += std::memcmp(&fast2[k], &r, 4) != 0;
        }
      }
    }
  }
  if constexpr (kPlain) {
    for (int i = 0; i < elems; ++i) {
      const float e = D::elem(p, i);
      bad += std::memcmp(&e, &ref[i], 4) != 0;
    }
  }
  return bad;
}

TEST(CudaQuantBlocksOnHost, DecodersMatchReferenceBitForBit) {
  const uint64_t seed = 0x5eed;
  EXPECT_EQ(count_mismatches<qb::F32>({4, {-1, -1}, -1}, 40, seed), 0);
  EXPECT_EQ(count_mismatches<qb::F16>({2, {-1, -1}, -1}, 40, seed), 0);
  EXPECT_EQ(count_mismatches<qb::BF16>({2, {-1, -1}, -1}, 40, seed), 0);
  EXPECT_EQ(count_mismatches<qb::Q4_0>({18, {0, -1}, -1}, 40, seed), 0);
  EXPECT_EQ(count_mismatches<qb::Q4_1>({20, {0, 2}, -1}, 40, seed), 0);
  EXPECT_EQ(count_mismatches<qb::Q5_0>({22, {0, -1}, -1}, 40, seed), 0);
  EXPECT_EQ(count_mismatches<qb::Q5_1>({24, {0, 2}, -1}, 40, seed), 0);
  EXPECT_EQ(count_mismatches<qb::Q8_0>({34, {0, -1}, -1}, 40, seed), 0);
  EXPECT_EQ(count_mismatches<qb::Q8_1>({36, {0, 2}, -1}, 40, seed), 0);
  EXPECT_EQ(count_mismatches<qb::Q2_K>({84, {80, 82}, -1}, 40, seed), 0);
  EXPECT_EQ(count_mismatches<qb::Q3_K>({110, {108, -1}, -1}, 40, seed), 0);
  EXPECT_EQ(count_mismatches<qb::Q4_K>({144, {0, 2}, -1}, 40, seed), 0);
  EXPECT_EQ(count_mismatches<qb::Q5_K>({176, {0, 2}, -1}, 40, seed), 0);
  EXPECT_EQ(count_mismatches<qb::Q6_K>({210, {208, -1}, -1}, 40, seed), 0);
  EXPECT_EQ(count_mismatches<qb::Q8_K>({292, {-1, -1}, 0}, 40, seed), 0);
  EXPECT_EQ(count_mismatches<qb::IQ4_NL>({18, {0, -1}, -1}, 40, seed), 0);
  EXPECT_EQ(count_mismatches<qb::IQ4_XS>({136, {0, -1}, -1}, 40, seed), 0);
}

}  // namespace
}  // namespace kiln
