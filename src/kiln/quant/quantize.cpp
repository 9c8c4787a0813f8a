// Reference quantization for the plain and the 32-element block types, and the quantize_row
// dispatcher. The K-quants live in kquants.cpp, IQ4_NL/IQ4_XS in iquants.cpp.
//
// The 32-element formats use ggml's reference rules (quantize_row_*_ref): Q4_0/Q5_0 put the
// value of largest magnitude on the most negative level, Q4_1/Q5_1 spread [min, max] over
// the levels, Q8_0/Q8_1/Q8_K scale by amax/127. One difference, for accuracy: the levels
// are rounded against the f16-rounded scale actually stored, not the unrounded one.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kiln/quant/blocks.h"
#include "kiln/quant/convert.h"
#include "kiln/quant/fit.h"
#include "kiln/quant/fp16.h"
#include "kiln/quant/quantize_impl.h"

namespace kiln::quant {

namespace detail {
uint16_t scale_to_fp16(float d) {
  if (std::isnan(d)) return 0;
  constexpr float kMaxHalf = 65504.0f;
  return fp32_to_fp16(std::clamp(d, -kMaxHalf, kMaxHalf));
}

float signed_absmax(const float* x, int n) {
  float amax = 0, vmax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      vmax = x[i];
    }
  }
  return vmax;
}

float normalize_by_absmax(const float* x, int n, float* xs) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (!(amax > 0)) return 0;
  for (int i = 0; i < n; ++i) xs[i] = x[i] / amax;
  return amax;
}

}  // namespace detail

namespace {

using detail::scale_to_fp16;
using detail::signed_absmax;
using Fn = void (*)(const float* src, void* dst, int64_t num_blocks);

// 1/d for a stored scale, or 0 when the scale is 0 (then every level is 0).
float inverse(float d) {
  return d != 0 ? 1.0f / d : 0.0f;
}

void quant_f32(const float* x, void* dst, int64_t n) {
  std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
}

void quant_f16(const float* x, void* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store_block<uint16_t>(dst, i, fp32_to_fp16(x[i]));
}

void quant_bf16(const float* x, void* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store_block<uint16_t>(dst, i, fp32_to_bf16(x[i]));
}

float absmax(const float* x, int n) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

void quant_q4_0(const float* x, void* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, x += 32) {
    BlockQ4_0 b{};
    b.d = scale_to_fp16(signed_absmax(x, 32) / -8.0f);  // that value -> level 0 (-8)
    const float id = inverse(fp16_to_fp32(b.d));
    for (int j = 0; j < 16; ++j) {
      const int q0 = round_clamp(x[j] * id + 8.0f, 0, 15);
      const int q1 = round_clamp(x[j + 16] * id + 8.0f, 0, 15);
      b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
    store_block(dst, ib, b);
  }
}

// Q4_1/Q5_1: levels 0..nmax over [min, max]. Writes d, m and the levels.
void affine_levels(const float* x, int nmax, uint16_t* d_out, uint16_t* m_out, uint8_t* L) {
  float lo = x[0], hi = x[0];
  for (int j = 1; j < 32; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  *d_out = scale_to_fp16((hi - lo) / static_cast<float>(nmax));
  *m_out = scale_to_fp16(lo);
  const float id = inverse(fp16_to_fp32(*d_out));
  const float m = fp16_to_fp32(*m_out);
  for (int j = 0; j < 32; ++j) {
    L[j] = static_cast<uint8_t>(round_clamp((x[j] - m) * id, 0, nmax));
  }
}

void quant_q4_1(const float* x, void* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, x += 32) {
    BlockQ4_1 b{};
    uint8_t L[32];
    affine_levels(x, 15, &b.d, &b.m, L);
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(L[j] | (L[j + 16] << 4));
    store_block(dst, ib, b);
  }
}

// Q5_0/Q5_1 packing of 32 five-bit levels: low nibbles as Q4_0, bit 4 of level j -> qh bit j.
void pack_q5(const uint8_t* L, uint8_t* qs, uint8_t* qh_bytes) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j)
    qs[j] = static_cast<uint8_t>((L[j] & 0xf) | ((L[j + 16] & 0xf) << 4));
  for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>((L[j] >> 4) & 1) << j;
  std::memcpy(qh_bytes, &qh, 4);
}

void quant_q5_0(const float* x, void* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, x += 32) {
    BlockQ5_0 b{};
    b.d = scale_to_fp16(signed_absmax(x, 32) / -16.0f);
    const float id = inverse(fp16_to_fp32(b.d));
    uint8_t L[32];
    for (int j = 0; j < 32; ++j) L[j] = static_cast<uint8_t>(round_clamp(x[j] * id + 16.0f, 0, 31));
    pack_q5(L, b.qs, b.qh);
    store_block(dst, ib, b);
  }
}

void quant_q5_1(const float* x, void* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, x += 32) {
    BlockQ5_1 b{};
    uint8_t L[32];
    affine_levels(x, 31, &b.d, &b.m, L);
    pack_q5(L, b.qs, b.qh);
    store_block(dst, ib, b);
  }
}

// Q8_0/Q8_1 levels: d = amax / 127, q = round(x / d) (half away from zero, as ggml's roundf).
// Returns the sum of the levels.
int q8_levels(const float* x, uint16_t* d_out, int8_t* qs) {
  *d_out = scale_to_fp16(absmax(x, 32) / 127.0f);
  const float id = inverse(fp16_to_fp32(*d_out));
  int sum = 0;
  for (int j = 0; j < 32; ++j) {
    const float v = std::clamp(x[j] * id, -127.0f, 127.0f);
    qs[j] = static_cast<int8_t>(std::isnan(v) ? 0.0f : std::round(v));
    sum += qs[j];
  }
  return sum;
}

void quant_q8_0(const float* x, void* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, x += 32) {
    BlockQ8_0 b{};
    q8_levels(x, &b.d, b.qs);
    store_block(dst, ib, b);
  }
}

void quant_q8_1(const float* x, void* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, x += 32) {
    BlockQ8_1 b{};
    const int sum = q8_levels(x, &b.d, b.qs);
    b.s = scale_to_fp16(fp16_to_fp32(b.d) * static_cast<float>(sum));
    store_block(dst, ib, b);
  }
}

// Q8_K (quantize_row_q8_K_ref): the value of largest magnitude maps to -127 (so d takes the
// opposite sign of that value), d is fp32, bsums[j] = sum of qs[16j..16j+16).
void quant_q8_k(const float* x, void* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, x += kQK_K) {
    BlockQ8_K b{};
    const float vmax = signed_absmax(x, kQK_K);
    if (vmax != 0) {
      const float iscale = -127.0f / vmax;
      const bool finite = std::isfinite(iscale);  // not for |vmax| < ~3.7e-37
      for (int i = 0; i < kQK_K; ++i) {
        const float v = finite ? iscale * x[i] : -127.0f * (x[i] / vmax);
        b.qs[i] = static_cast<int8_t>(round_clamp(v, -127, 127));
      }
      b.d = finite ? 1.0f / iscale : vmax / -127.0f;
      // Near FLT_MAX, d * 127 can round past it; step d down so every d * q stays finite.
      while (!std::isfinite(b.d * 127.0f)) b.d = std::nextafter(b.d, 0.0f);
    }
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += b.qs[16 * j + i];
      b.bsums[j] = static_cast<int16_t>(sum);
    }
    store_block(dst, ib, b);
  }
}

Fn encoder(Type type) {
  switch (type) {
    case Type::F32:
      return quant_f32;
    case Type::F16:
      return quant_f16;
    case Type::BF16:
      return quant_bf16;
    case Type::Q4_0:
      return quant_q4_0;
    case Type::Q4_1:
      return quant_q4_1;
    case Type::Q5_0:
      return quant_q5_0;
    case Type::Q5_1:
      return quant_q5_1;
    case Type::Q8_0:
      return quant_q8_0;
    case Type::Q8_1:
      return quant_q8_1;
    case Type::Q2_K:
      return detail::quantize_q2_k;
    case Type::Q3_K:
      return detail::quantize_q3_k;
    case Type::Q4_K:
      return detail::quantize_q4_k;
    case Type::Q5_K:
      return detail::quantize_q5_k;
    case Type::Q6_K:
      return detail::quantize_q6_k;
    case Type::Q8_K:
      return quant_q8_k;
    case Type::IQ4_NL:
      return detail::quantize_iq4_nl;
    case Type::IQ4_XS:
      return detail::quantize_iq4_xs;
    default:
      return nullptr;
  }
}

}  // namespace

bool can_quantize(Type type) {
  return encoder(type) != nullptr;
}

Status quantize_row(Type type, const float* src, void* dst, int64_t n) {
  const Fn fn = encoder(type);
  const TypeTraits& tr = traits(type);
  if (fn == nullptr) return err("quantize: kiln cannot write type {}", tr.name);
  if (n < 0 || n % tr.block_elems != 0) {
    return err("quantize: {} elements is not a multiple of the {} block of {}", n, tr.name,
               tr.block_elems);
  }
  if (n == 0) return {};
  if (src == nullptr || dst == nullptr) return err("quantize: null buffer for {}", tr.name);
  fn(src, dst, n / tr.block_elems);
  return {};
}

}  // namespace kiln::quant
