// Bit-exactness against ggml itself: the hashes below were recorded by running ggml's own
// dequantize_row_* (ggml-org/ggml src/ggml-quants.c, commit d99724f2, built out of tree and
// not part of kiln) on the blocks random_blocks.h generates (seed 42, 64 blocks per type).
// A single differing float bit changes the hash.
#include <gtest/gtest.h>

#include <vector>

#include "kiln/quant/convert.h"
#include "unit/quant/random_blocks.h"

namespace kiln::quant {
namespace {

using testing::hash_floats;
using testing::random_blocks;
using testing::RandomLayout;

struct Golden {
  Type type;
  RandomLayout layout;
  uint64_t hash;
};

const Golden kGolden[] = {
    {Type::Q4_0, {18, {0, -1}, -1}, 0x1defc86b874583cdULL},
    {Type::Q4_1, {20, {0, 2}, -1}, 0x908524123e30d0a4ULL},
    {Type::Q5_0, {22, {0, -1}, -1}, 0x02287235168afaf6ULL},
    {Type::Q5_1, {24, {0, 2}, -1}, 0xa578b290b294eef6ULL},
    {Type::Q8_0, {34, {0, -1}, -1}, 0xe59e37d7fe660e03ULL},
    {Type::Q2_K, {84, {80, 82}, -1}, 0xa95665028c4c3670ULL},
    {Type::Q3_K, {110, {108, -1}, -1}, 0xd3c713b2c6761400ULL},
    {Type::Q4_K, {144, {0, 2}, -1}, 0x69b0c453e2a6a32eULL},
    {Type::Q5_K, {176, {0, 2}, -1}, 0xfa46548377bda7f6ULL},
    {Type::Q6_K, {210, {208, -1}, -1}, 0xd9bc6ee7488c062cULL},
    {Type::Q8_K, {292, {-1, -1}, 0}, 0x9b77fe5d8f54f6a0ULL},
    {Type::IQ4_NL, {18, {0, -1}, -1}, 0xadc64f7128c89d2bULL},
    {Type::IQ4_XS, {136, {0, -1}, -1}, 0x13b0c795d2ae9056ULL},
};

TEST(QuantGolden, DequantizeMatchesGgmlBitForBit) {
  constexpr int kNumBlocks = 64;
  for (const Golden& g : kGolden) {
    const TypeTraits& tr = traits(g.type);
    ASSERT_EQ(g.layout.block_bytes, tr.block_bytes) << tr.name;
    const auto raw = random_blocks(g.layout, kNumBlocks, 42);
    std::vector<float> y(static_cast<size_t>(kNumBlocks) * tr.block_elems);
    ASSERT_TRUE(dequantize_row(g.type, raw.data(), y.data(), static_cast<int64_t>(y.size())).ok());
    EXPECT_EQ(hash_floats(y.data(), y.size()), g.hash) << tr.name;
  }
}

// Q8_1 has no ggml dequantizer; it must decode exactly as Q8_0 does from the same d and qs.
TEST(QuantGolden, Q8_1DecodesLikeQ8_0) {
  const auto raw = random_blocks({36, {0, 2}, -1}, 16, 7);
  std::vector<uint8_t> as_q8_0;
  for (int b = 0; b < 16; ++b) {
    const uint8_t* blk = raw.data() + 36 * b;
    as_q8_0.insert(as_q8_0.end(), blk, blk + 2);       // d
    as_q8_0.insert(as_q8_0.end(), blk + 4, blk + 36);  // qs (skipping s)
  }
  std::vector<float> a(512), b(512);
  ASSERT_TRUE(dequantize_row(Type::Q8_1, raw.data(), a.data(), 512).ok());
  ASSERT_TRUE(dequantize_row(Type::Q8_0, as_q8_0.data(), b.data(), 512).ok());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace kiln::quant
