// Reference dequantization, one function per type, each the plain reading of the block
// layout documented in blocks.h (ggml-quants.c dequantize_row_* compute the same values in
// the same order of float operations, so results are bit-identical).
#include <cstring>

#include "kiln/quant/blocks.h"
#include "kiln/quant/convert.h"
#include "kiln/quant/fp16.h"

namespace kiln::quant {
namespace {

using Fn = void (*)(const void* src, float* dst, int64_t num_blocks);

void dequant_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void dequant_f16(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(load_block<uint16_t>(src, i));
}

void dequant_bf16(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(load_block<uint16_t>(src, i));
}

void dequant_q4_0(const void* src, float* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, dst += 32) {
    const auto b = load_block<BlockQ4_0>(src, ib);
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < 16; ++j) {
      dst[j] = static_cast<float>((b.qs[j] & 0xf) - 8) * d;
      dst[j + 16] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_1(const void* src, float* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, dst += 32) {
    const auto b = load_block<BlockQ4_1>(src, ib);
    const float d = fp16_to_fp32(b.d);
    const float m = fp16_to_fp32(b.m);
    for (int j = 0; j < 16; ++j) {
      dst[j] = static_cast<float>(b.qs[j] & 0xf) * d + m;
      dst[j + 16] = static_cast<float>(b.qs[j] >> 4) * d + m;
    }
  }
}

// The 5-bit value of element j (0..31) of a Q5_0/Q5_1 block.
int q5_value(const uint8_t* qs, const uint8_t* qh_bytes, int j) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  const int low = j < 16 ? (qs[j] & 0xf) : (qs[j - 16] >> 4);
  return low | static_cast<int>(((qh >> j) & 1u) << 4);
}

void dequant_q5_0(const void* src, float* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, dst += 32) {
    const auto b = load_block<BlockQ5_0>(src, ib);
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(q5_value(b.qs, b.qh, j) - 16) * d;
  }
}

void dequant_q5_1(const void* src, float* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, dst += 32) {
    const auto b = load_block<BlockQ5_1>(src, ib);
    const float d = fp16_to_fp32(b.d);
    const float m = fp16_to_fp32(b.m);
    for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(q5_value(b.qs, b.qh, j)) * d + m;
  }
}

void dequant_q8_0(const void* src, float* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, dst += 32) {
    const auto b = load_block<BlockQ8_0>(src, ib);
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(b.qs[j]) * d;
  }
}

void dequant_q8_1(const void* src, float* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, dst += 32) {
    const auto b = load_block<BlockQ8_1>(src, ib);  // s is redundant for decoding
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(b.qs[j]) * d;
  }
}

void dequant_q2_k(const void* src, float* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, dst += kQK_K) {
    const auto b = load_block<BlockQ2_K>(src, ib);
    const float d = fp16_to_fp32(b.d);
    const float dmin = fp16_to_fp32(b.dmin);
    for (int i = 0; i < kQK_K; ++i) {
      const int half = i / 128, shift = 2 * ((i % 128) / 32), l = i % 32;
      const int q = (b.qs[32 * half + l] >> shift) & 3;
      const uint8_t sc = b.scales[i / 16];
      // d*scale*q - dmin*min, with the two products formed first as ggml does.
      const float dl = d * static_cast<float>(sc & 0xf);
      const float ml = dmin * static_cast<float>(sc >> 4);
      dst[i] = dl * static_cast<float>(q) - ml;
    }
  }
}

void dequant_q3_k(const void* src, float* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, dst += kQK_K) {
    const auto b = load_block<BlockQ3_K>(src, ib);
    const float d = fp16_to_fp32(b.d);
    int8_t scales[16];
    unpack_q3_k_scales(b.scales, scales);
    for (int i = 0; i < kQK_K; ++i) {
      const int half = i / 128, shift = 2 * ((i % 128) / 32), l = i % 32;
      const int low = (b.qs[32 * half + l] >> shift) & 3;
      const bool high = (b.hmask[l] >> (i / 32)) & 1;
      const int q = low - (high ? 0 : 4);  // -4..3
      const float dl = d * static_cast<float>(scales[i / 16]);
      dst[i] = dl * static_cast<float>(q);
    }
  }
}

void dequant_q4_k(const void* src, float* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, dst += kQK_K) {
    const auto b = load_block<BlockQ4_K>(src, ib);
    const float d = fp16_to_fp32(b.d);
    const float dmin = fp16_to_fp32(b.dmin);
    for (int sub = 0; sub < 8; ++sub) {  // sub-block of 32
      uint8_t sc, m;
      unpack_scale_min_k4(sub, b.scales, &sc, &m);
      const float dl = d * static_cast<float>(sc);
      const float ml = dmin * static_cast<float>(m);
      const uint8_t* q = b.qs + 32 * (sub / 2);
      const int shift = 4 * (sub % 2);  // even sub-block: low nibbles, odd: high
      for (int l = 0; l < 32; ++l) {
        dst[32 * sub + l] = dl * static_cast<float>((q[l] >> shift) & 0xf) - ml;
      }
    }
  }
}

void dequant_q5_k(const void* src, float* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, dst += kQK_K) {
    const auto b = load_block<BlockQ5_K>(src, ib);
    const float d = fp16_to_fp32(b.d);
    const float dmin = fp16_to_fp32(b.dmin);
    for (int sub = 0; sub < 8; ++sub) {
      uint8_t sc, m;
      unpack_scale_min_k4(sub, b.scales, &sc, &m);
      const float dl = d * static_cast<float>(sc);
      const float ml = dmin * static_cast<float>(m);
      const uint8_t* q = b.qs + 32 * (sub / 2);
      const int shift = 4 * (sub % 2);
      for (int l = 0; l < 32; ++l) {
        const int high = (b.qh[l] >> sub) & 1;  // bit 2c / 2c+1 for chunk c = sub / 2
        const int v = ((q[l] >> shift) & 0xf) + 16 * high;
        dst[32 * sub + l] = dl * static_cast<float>(v) - ml;
      }
    }
  }
}

void dequant_q6_k(const void* src, float* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, dst += kQK_K) {
    const auto b = load_block<BlockQ6_K>(src, ib);
    const float d = fp16_to_fp32(b.d);
    for (int i = 0; i < kQK_K; ++i) {
      const int half = i / 128, quarter = (i % 128) / 32, l = i % 32;
      // Quarters 0 and 2 use ql[64h + l], 1 and 3 use ql[64h + 32 + l]; 2 and 3 the high nibble.
      const uint8_t lo_byte = b.ql[64 * half + 32 * (quarter % 2) + l];
      const int lo = (lo_byte >> (4 * (quarter / 2))) & 0xf;
      const int hi = (b.qh[32 * half + l] >> (2 * quarter)) & 3;
      const int q = (lo | (hi << 4)) - 32;
      // ggml: d * sc * q, evaluated left to right.
      dst[i] = d * static_cast<float>(b.scales[i / 16]) * static_cast<float>(q);
    }
  }
}

void dequant_q8_k(const void* src, float* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, dst += kQK_K) {
    const auto b = load_block<BlockQ8_K>(src, ib);
    for (int i = 0; i < kQK_K; ++i) dst[i] = b.d * static_cast<float>(b.qs[i]);
  }
}

void dequant_iq4_nl(const void* src, float* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, dst += 32) {
    const auto b = load_block<BlockIQ4_NL>(src, ib);
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>(kIq4nlValues[b.qs[j] & 0xf]);
      dst[j + 16] = d * static_cast<float>(kIq4nlValues[b.qs[j] >> 4]);
    }
  }
}

void dequant_iq4_xs(const void* src, float* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, dst += kQK_K) {
    const auto b = load_block<BlockIQ4_XS>(src, ib);
    const float d = fp16_to_fp32(b.d);
    for (int sub = 0; sub < 8; ++sub) {
      const int ls =
          ((b.scales_l[sub / 2] >> (4 * (sub % 2))) & 0xf) | (((b.scales_h >> (2 * sub)) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      const uint8_t* q = b.qs + 16 * sub;
      float* y = dst + 32 * sub;
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * static_cast<float>(kIq4nlValues[q[j] & 0xf]);
        y[j + 16] = dl * static_cast<float>(kIq4nlValues[q[j] >> 4]);
      }
    }
  }
}

Fn decoder(Type type) {
  switch (type) {
    case Type::F32:
      return dequant_f32;
    case Type::F16:
      return dequant_f16;
    case Type::BF16:
      return dequant_bf16;
    case Type::Q4_0:
      return dequant_q4_0;
    case Type::Q4_1:
      return dequant_q4_1;
    case Type::Q5_0:
      return dequant_q5_0;
    case Type::Q5_1:
      return dequant_q5_1;
    case Type::Q8_0:
      return dequant_q8_0;
    case Type::Q8_1:
      return dequant_q8_1;
    case Type::Q2_K:
      return dequant_q2_k;
    case Type::Q3_K:
      return dequant_q3_k;
    case Type::Q4_K:
      return dequant_q4_k;
    case Type::Q5_K:
      return dequant_q5_k;
    case Type::Q6_K:
      return dequant_q6_k;
    case Type::Q8_K:
      return dequant_q8_k;
    case Type::IQ4_NL:
      return dequant_iq4_nl;
    case Type::IQ4_XS:
      return dequant_iq4_xs;
    default:
      return nullptr;
  }
}

}  // namespace

bool can_dequantize(Type type) {
  return decoder(type) != nullptr;
}

Status dequantize_row(Type type, const void* src, float* dst, int64_t n) {
  const Fn fn = decoder(type);
  const TypeTraits& tr = traits(type);
  if (fn == nullptr) return err("dequantize: type {} has no reference decoder", tr.name);
  if (n < 0 || n % tr.block_elems != 0) {
    return err("dequantize: {} elements is not a multiple of the {} block of {}", n, tr.name,
               tr.block_elems);
  }
  if (n == 0) return {};
  if (src == nullptr || dst == nullptr) return err("dequantize: null buffer for {}", tr.name);
  fn(src, dst, n / tr.block_elems);
  return {};
}

}  // namespace kiln::quant
