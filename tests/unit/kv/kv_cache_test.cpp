// The KV cache type option (the storage itself is the backend's: tests/unit/backend).
#include <gtest/gtest.h>

#include "kiln/kv/kv_cache.h"

namespace kiln::kv {
namespace {

using quant::Type;

TEST(KvCache, ParseType) {
  EXPECT_EQ(*parse_kv_type("f16"), Type::F16);
  EXPECT_EQ(*parse_kv_type("F32"), Type::F32);
  EXPECT_EQ(*parse_kv_type("q8_0"), Type::Q8_0);
  auto e = parse_kv_type("q4_0");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("q4_0"), std::string::npos);
  EXPECT_TRUE(is_kv_type(Type::Q8_0));
  EXPECT_FALSE(is_kv_type(Type::Q4_K));
}

}  // namespace
}  // namespace kiln::kv
