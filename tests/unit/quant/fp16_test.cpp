#include "kiln/quant/fp16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace kiln::quant {
namespace {

bool is_nan16(uint16_t h) {
  return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}

// An independent decode of binary16 from its definition, in double.
double f16_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(mant, -24);
  } else if (exp == 31) {
    v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(1024 + mant, exp - 25);
  }
  return sign ? -v : v;
}

TEST(Fp16, DecodeMatchesDefinitionForAll65536) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    const double want = f16_value(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << h;
      // Payload kept: the f16 mantissa becomes the top of the f32 mantissa.
      ASSERT_EQ(std::bit_cast<uint32_t>(f) & 0x7fffff, (h & 0x3ffu) << 13) << h;
    } else {
      ASSERT_EQ(static_cast<double>(f), want) << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << h;  // -0 stays -0
    }
  }
}

TEST(Fp16, AllValuesRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(fp32_to_fp16(fp16_to_fp32(static_cast<uint16_t>(h))), h) << h;
  }
}

// Every rounding boundary: for each pair of adjacent finite f16 values a < b (same sign),
// the fp32 midpoint goes to the one with an even mantissa, and one fp32 ulp either side of
// it goes to the nearer one. The midpoint is exact in fp32 (12 significant bits).
TEST(Fp16, RoundsToNearestEvenAtEveryMidpoint) {
  for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
    for (uint32_t m = 0; m < 0x7bff; ++m) {  // a = m, b = m + 1, up to 65504
      const auto a = static_cast<uint16_t>(sign | m), b = static_cast<uint16_t>(sign | (m + 1));
      const float fa = fp16_to_fp32(a), fb = fp16_to_fp32(b);
      const float mid = static_cast<float>((static_cast<double>(fa) + fb) / 2);
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(fa) + fb) / 2);
      const uint16_t even = (m & 1) ? b : a;
      ASSERT_EQ(fp32_to_fp16(mid), even) << m;
      const float toward_a = std::nextafter(mid, fa), toward_b = std::nextafter(mid, fb);
      ASSERT_EQ(fp32_to_fp16(toward_a), a) << m;
      ASSERT_EQ(fp32_to_fp16(toward_b), b) << m;
    }
  }
}

TEST(Fp16, SpecialValues) {
  EXPECT_EQ(fp32_to_fp16(0.0f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65519.99f), 0x7bff);  // below the 65520 tie
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);   // tie, odd 65504 -> even (inf)
  EXPECT_EQ(fp32_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::max()), 0x7c00);
  // Subnormals: 2^-24 is the smallest; 2^-25 is the tie with 0 (-> 0, even); just above -> 1.
  EXPECT_EQ(fp32_to_fp16(0x1p-24f), 0x0001);
  EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(fp32_to_fp16(-0x1.8p-24f), 0x8002);   // 1.5 units: tie -> 2 (even)
  EXPECT_EQ(fp32_to_fp16(0x1.ffcp-15f), 0x0400);  // 1023.5 units: tie, up into the smallest normal
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  // NaN stays NaN, sign and top payload kept; a payload only in the low bits stays NaN.
  const uint16_t qnan = fp32_to_fp16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(is_nan16(qnan));
  EXPECT_EQ(fp32_to_fp16(std::bit_cast<float>(0xffc12000u)), 0xfe09);
  EXPECT_TRUE(is_nan16(fp32_to_fp16(std::bit_cast<float>(0x7f800001u))));
}

// A spread of fp32 bit patterns over every exponent: the result is the nearest f16 (ties to
// even), judged in double against the independent decoder.
TEST(Fp16, SampledFloatsRoundToNearest) {
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 40009) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(bits));
    const uint16_t h = fp32_to_fp16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(is_nan16(h));
      continue;
    }
    const double x = f, got = f16_value(h);
    if (std::fabs(x) >= 65520.0) {
      ASSERT_EQ(got, std::copysign(INFINITY, x)) << bits;
      continue;
    }
    // Neighbours of h (stepping the magnitude) must not be nearer.
    const uint16_t mag = h & 0x7fff;
    for (int step : {-1, 1}) {
      const int nm = static_cast<int>(mag) + step;
      if (nm < 0 || nm > 0x7bff) continue;
      const double other = f16_value(static_cast<uint16_t>((h & 0x8000) | nm));
      const double d_got = std::fabs(x - got), d_other = std::fabs(x - other);
      ASSERT_TRUE(d_got < d_other || (d_got == d_other && (mag & 1) == 0)) << bits;
    }
  }
}

TEST(Bf16, AllValuesRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_fp32(static_cast<uint16_t>(h));
    ASSERT_EQ(std::bit_cast<uint32_t>(f), h << 16);
    const uint16_t back = fp32_to_bf16(f);
    if ((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0) {
      // NaN: forced quiet (bit 6), everything else kept.
      ASSERT_EQ(back, h | 0x40) << h;
    } else {
      ASSERT_EQ(back, h) << h;
    }
  }
}

TEST(Bf16, RoundsToNearestEvenLikeGgml) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(3.14159265f), 0x4049);  // 0x40490fdb: below half -> down
  // 1 + 2^-8 is the tie between 1 (even) and 1 + 2^-7: -> 1. 1 + 3*2^-8: tie -> 1 + 2^-6.
  EXPECT_EQ(fp32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(1.0f + 0x3p-8f), 0x3f82);
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);  // just above half
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(fp32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x00012345u)), 0x0001);  // subnormal kept
  // Signalling NaN 0x7f800001 would truncate to inf; it must come out a quiet NaN.
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x7f800001u)), 0x7fc0);
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0xffc00000u)), 0xffc0);
}

}  // namespace
}  // namespace kiln::quant
