// rope_angles + rope_apply (frequencies once per model, angles once per step) against the
// scalar reference rope(), which evaluates base^(-2i/n_rot) per token, head and pair.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kiln/backend/cpu/ops.h"

namespace kiln::backend::cpu {
namespace {

struct Case {
  int32_t n_heads, head_dim, n_rot;
  bool neox;
  bool factors;
};

TEST(Rope, PrecomputedAnglesEqualScalarReference) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const std::vector<int32_t> positions = {0, 1, 2, 17, 31, 32, 1000, 32767, 131071, 5};
  const int64_t n = static_cast<int64_t>(positions.size());
  const float base = 1e6f;
  for (const Case c :
       {Case{4, 64, 64, false, false}, Case{4, 64, 64, true, false}, Case{2, 128, 64, true, false},
        Case{3, 32, 16, false, false}, Case{4, 64, 64, false, true}, Case{4, 64, 64, true, true}}) {
    const int32_t half = c.n_rot / 2;
    std::vector<float> factors(static_cast<size_t>(half));
    for (int32_t i = 0; i < half; ++i) factors[i] = 1.0f + 7.0f * i / half;  // llama3-like
    const float* ff = c.factors ? factors.data() : nullptr;
    std::vector<float> x(static_cast<size_t>(n * c.n_heads * c.head_dim));
    for (float& v : x) v = normal(rng);
    std::vector<float> want = x, got = x;
    rope(want.data(), positions.data(), n, c.n_heads, c.head_dim, c.n_rot, base, c.neox, ff);
    std::vector<double> inv(static_cast<size_t>(half));
    for (int32_t i = 0; i < half; ++i)
      inv[i] = std::pow(static_cast<double>(base), -2.0 * i / c.n_rot) / (ff ? ff[i] : 1.0f);
    std::vector<float> cs(static_cast<size_t>(n * half)), sn(cs.size());
    rope_angles(inv.data(), half, positions.data(), n, 1.0f, cs.data(), sn.data());
    rope_apply(got.data(), n, c.n_heads, c.head_dim, half, c.neox, cs.data(), sn.data());
    for (size_t i = 0; i < x.size(); ++i) {
      if (ff == nullptr) {
        // Same double angle, same float rounding: bit-identical.
        ASSERT_EQ(got[i], want[i]) << "element " << i;
      } else {
        // pos * (b / f) vs (pos * b) / f differ in the last bit of a double: the float result
        // may differ by one rounding step of the output.
        ASSERT_NEAR(got[i], want[i], 4e-7f * (1.0f + std::fabs(want[i]))) << "element " << i;
      }
    }
    // Dims past n_rot are untouched.
    for (int64_t t = 0; t < n; ++t)
      for (int32_t h = 0; h < c.n_heads; ++h)
        for (int32_t d = c.n_rot; d < c.head_dim; ++d) {
          const size_t k = static_cast<size_t>((t * c.n_heads + h) * c.head_dim + d);
          ASSERT_EQ(got[k], x[k]);
        }
  }
}

// The attention factor scales cos and sin (YaRN's mscale): the rotated vector's norm grows by it.
TEST(Rope, AttentionFactorScalesCosAndSin) {
  const double inv[2] = {1.0, 0.01};
  const int32_t pos[1] = {3};
  float c1[2], s1[2], c2[2], s2[2];
  rope_angles(inv, 2, pos, 1, 1.0f, c1, s1);
  rope_angles(inv, 2, pos, 1, 1.25f, c2, s2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_FLOAT_EQ(c2[i], 1.25f * c1[i]);
    EXPECT_FLOAT_EQ(s2[i], 1.25f * s1[i]);
  }
  EXPECT_FLOAT_EQ(c1[0], static_cast<float>(std::cos(3.0)));
  EXPECT_FLOAT_EQ(s1[1], static_cast<float>(std::sin(0.03)));
}

}  // namespace
}  // namespace kiln::backend::cpu
