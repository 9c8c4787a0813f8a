// quantize_act_row's AVX2 version against the scalar reference, bit for bit: every value,
// scale and 16-sum, on random rows with ties (x.5 after scaling), zero blocks, NaN, +-inf,
// subnormals and huge values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kiln/backend/cpu/quantize_act.h"
#include "kiln/util/cpu.h"

namespace kiln::backend::cpu {
namespace {

TEST(QuantizeAct, Avx2EqualsScalarBitwise) {
  if (!util::cpu_features().avx2 || !util::cpu_features().fma) {
    GTEST_SKIP() << "needs AVX2";
  }
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 15);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            1e-42f,
                            -3e38f,
                            127.0f,
                            0.5f,
                            -2.5f};
  for (int block : {32, 256}) {
    for (int trial = 0; trial < 200; ++trial) {
      const int64_t n = block * (1 + trial % 4);
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = nd(rng) * std::pow(10.0f, static_cast<float>(trial % 7) - 3.0f);
      if (trial % 3 == 0) {
        for (int k = 0; k < 4; ++k) x[rng() % n] = specials[rng() % std::size(specials)];
      }
      if (trial % 5 == 0) std::fill(x.begin(), x.begin() + block, 0.0f);  // an all-zero block
      if (trial % 7 == 0) {
        // Ties: integers and halves scaled so that amax maps to exactly 127.
        for (float& v : x)
          v = static_cast<float>(pick(rng) - 8) + 0.5f * static_cast<float>(rng() % 2);
      }
      std::vector<int8_t> qa(static_cast<size_t>(n)), qb(qa.size());
      std::vector<float> da(static_cast<size_t>(n / block)), db(da.size());
      std::vector<int16_t> sa(static_cast<size_t>(n / 16)), sb(sa.size());
      quantize_act_row_scalar(x.data(), n, block, qa.data(), da.data(), sa.data());
      quantize_act_row_avx2(x.data(), n, block, qb.data(), db.data(), sb.data());
      ASSERT_EQ(0, std::memcmp(qa.data(), qb.data(), qa.size())) << block << " trial " << trial;
      ASSERT_EQ(0, std::memcmp(da.data(), db.data(), da.size() * sizeof(float)))
          << block << " trial " << trial;
      ASSERT_EQ(sa, sb) << block << " trial " << trial;
    }
  }
}

}  // namespace
}  // namespace kiln::backend::cpu
