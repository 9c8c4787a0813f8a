// Scalar, bit-exact conversions between fp32 and the two 16-bit float formats GGUF stores:
// IEEE 754 binary16 ("f16", ggml_fp16_t / ggml_half) and bfloat16 ("bf16", ggml_bf16_t).
//
// fp32 -> f16 rounds to nearest, ties to even, with gradual underflow (subnormals), overflow
// to inf, and NaN kept NaN (sign and the top 10 payload bits kept; a payload that would
// truncate to zero becomes the quiet bit, so a NaN never turns into inf). f16 -> fp32 is
// exact for every one of the 65536 values, NaN payloads included, so f16 -> fp32 -> f16 is
// the identity.
//
// fp32 -> bf16 matches ggml's GGML_FP32_TO_BF16 (ggml-impl.h): round to nearest even, NaN
// forced quiet (bit 6 of the bf16 set), subnormals kept. bf16 -> fp32 is a 16-bit shift.
#pragma once

#include <bit>
#include <cstdint>

namespace kiln::quant {

inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {  // inf (mant == 0) or NaN: the payload moves up unchanged
    return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  }
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
    const float mag = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -mag : mag;
  }
  // Normal: rebias the exponent from 15 to 127.
  return std::bit_cast<float>(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

inline uint16_t fp32_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;

  if (ax > 0x7f800000u) {  // NaN
    uint32_t payload = (ax >> 13) & 0x3ffu;
    if (payload == 0) payload = 0x200;  // keep it a NaN, not inf
    return static_cast<uint16_t>(sign | 0x7c00u | payload);
  }
  // 65520 (0x477ff000) is halfway between 65504 (largest f16, odd mantissa) and 65536;
  // ties go to even, i.e. up to inf. Everything from there up (inf included) is inf.
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);

  if (ax >= 0x38800000u) {  // >= 2^-14: a normal f16
    const uint32_t exp16 = (ax >> 23) - (127 - 15);
    const uint32_t mant = ax & 0x7fffffu;
    uint32_t h = (exp16 << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fffu;                      // the 13 bits dropped
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into exp is right
    return static_cast<uint16_t>(sign | h);
  }
  // Below 2^-14: an f16 subnormal (units of 2^-24) or zero. 2^-25 (0x33000000) is the tie
  // between 0 and the smallest subnormal and goes to even, 0.
  if (ax <= 0x33000000u) return sign;
  const uint32_t exp32 = ax >> 23;                     // 102..112 here
  const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;  // with the implicit bit
  // value = mant * 2^(exp32 - 150); in units of 2^-24 that is mant >> (126 - exp32).
  const uint32_t shift = 126 - exp32;  // 14..24
  uint32_t h = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;  // 0x3ff + 1 = smallest normal: right
  return static_cast<uint16_t>(sign | h);
}

inline float bf16_to_fp32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

inline uint16_t fp32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: truncate, force the quiet bit
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  }
  // Add just under half an ulp of bf16, plus one more when the kept part is odd: that
  // rounds to nearest with ties to even. Overflow past the largest finite value carries
  // into the exponent and gives inf, as it should.
  const uint32_t lsb = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7fffu + lsb) >> 16);
}

}  // namespace kiln::quant
