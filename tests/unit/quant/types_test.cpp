#include "kiln/quant/types.h"

#include <gtest/gtest.h>

namespace kiln::quant {
namespace {

// Block sizes from ggml's type table (ggml.c type_traits) for the types kiln decodes.
TEST(QuantTypes, BlockGeometryMatchesGgml) {
  struct Row {
    Type t;
    uint32_t elems, bytes;
  };
  const Row rows[] = {
      {Type::F32, 1, 4},      {Type::F16, 1, 2},        {Type::BF16, 1, 2},
      {Type::Q4_0, 32, 18},   {Type::Q4_1, 32, 20},     {Type::Q5_0, 32, 22},
      {Type::Q5_1, 32, 24},   {Type::Q8_0, 32, 34},     {Type::Q8_1, 32, 36},
      {Type::Q2_K, 256, 84},  {Type::Q3_K, 256, 110},   {Type::Q4_K, 256, 144},
      {Type::Q5_K, 256, 176}, {Type::Q6_K, 256, 210},   {Type::Q8_K, 256, 292},
      {Type::IQ4_NL, 32, 18}, {Type::IQ4_XS, 256, 136},
  };
  for (const Row& r : rows) {
    const TypeTraits& tr = traits(r.t);
    EXPECT_EQ(tr.block_elems, r.elems) << tr.name;
    EXPECT_EQ(tr.block_bytes, r.bytes) << tr.name;
    EXPECT_TRUE(tr.kiln_supported) << tr.name;
  }
}

TEST(QuantTypes, IdsAndNames) {
  EXPECT_FALSE(traits(4u).has_value());  // Q4_2, removed
  EXPECT_FALSE(traits(999u).has_value());
  EXPECT_EQ(traits(12u)->type, Type::Q4_K);
  EXPECT_EQ(type_from_name("Q4_K"), Type::Q4_K);
  EXPECT_EQ(type_from_name("bf16"), Type::BF16);
  EXPECT_FALSE(type_from_name("q9_9").has_value());
  EXPECT_EQ(row_bytes(Type::Q4_K, 512), 288u);
  EXPECT_FALSE(row_bytes(Type::Q4_K, 100).has_value());
  EXPECT_FALSE(row_bytes(Type::F32, uint64_t{1} << 63).has_value());  // 2^65 bytes would wrap
  EXPECT_EQ(row_bytes(Type::F32, uint64_t{1} << 61), uint64_t{1} << 63);
}

}  // namespace
}  // namespace kiln::quant
