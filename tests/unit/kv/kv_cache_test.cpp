// KvCache sizing per storage type and its errors.
#include <gtest/gtest.h>

#include <cstddef>

#include "kiln/kv/kv_cache.h"

namespace kiln::kv {
namespace {

using quant::Type;

TEST(KvCache, BytesPerBlockFollowTheType) {
  KvShape s{28, 8, 128, 128, Type::F32};
  // layers * 16 tokens * kv heads * (dk + dv) * bytes per element
  EXPECT_EQ(KvCache::bytes_per_block(s), 28ull * 16 * 8 * 256 * 4);
  s.type = Type::F16;
  EXPECT_EQ(KvCache::bytes_per_block(s), 28ull * 16 * 8 * 256 * 2);
  s.type = Type::Q8_0;  // 34 bytes per 32 values
  EXPECT_EQ(KvCache::bytes_per_block(s), 28ull * 16 * 8 * (256 / 32) * 34);
}

TEST(KvCache, BudgetSizesTheBlockCount) {
  for (Type t : {Type::F32, Type::F16, Type::Q8_0}) {
    const KvShape s{2, 2, 64, 32, t};
    const uint64_t per = KvCache::bytes_per_block(s);
    auto c = KvCache::create(s, per * 10 + per / 2);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c->num_blocks(), 10);
    EXPECT_EQ(c->type(), t);
    EXPECT_EQ(c->k_block_bytes() + c->v_block_bytes(), per / 2);  // per layer
    // Blocks are adjacent and the last one ends inside the allocation.
    EXPECT_EQ(c->k_block(0, 1) - c->k_block(0, 0), static_cast<ptrdiff_t>(c->k_block_bytes()));
    EXPECT_EQ(c->v_block(1, 0) - c->v_block(0, 0), static_cast<ptrdiff_t>(c->v_block_bytes() * 10));
  }
  // F16 holds twice the blocks of F32 in the same budget.
  const KvShape f32{4, 2, 64, 64, Type::F32};
  KvShape f16 = f32;
  f16.type = Type::F16;
  const uint64_t budget = KvCache::bytes_per_block(f32) * 8;
  EXPECT_EQ(KvCache::create(f16, budget)->num_blocks(),
            2 * KvCache::create(f32, budget)->num_blocks());
}

TEST(KvCache, ClearErrors) {
  auto q = KvCache::create(KvShape{2, 2, 16, 16, Type::Q8_0}, 1 << 20);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.error().message.find("multiples of 32"), std::string::npos) << q.error().message;
  auto bad = KvCache::create(KvShape{2, 2, 64, 64, Type::Q4_K}, 1 << 20);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("f16, f32 or q8_0"), std::string::npos);
}

TEST(KvCache, ParseType) {
  EXPECT_EQ(*parse_kv_type("f16"), Type::F16);
  EXPECT_EQ(*parse_kv_type("F32"), Type::F32);
  EXPECT_EQ(*parse_kv_type("q8_0"), Type::Q8_0);
  auto e = parse_kv_type("q4_0");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("q4_0"), std::string::npos);
}

}  // namespace
}  // namespace kiln::kv
