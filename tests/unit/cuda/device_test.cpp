#include "test_util.h"

namespace kiln {
namespace {

TEST(CudaDevice, CountIsNonNegativeAndMemoryAllocates) {
  KILN_REQUIRE_GPU();
  test::DeviceVec<float> v(std::vector<float>{1.0f, 2.0f, 3.0f});
  ASSERT_NE(v.get(), nullptr);
  EXPECT_EQ(v.to_host(), (std::vector<float>{1.0f, 2.0f, 3.0f}));
}

}  // namespace
}  // namespace kiln
