// The GGUF quant blocks, byte for byte as ggml defines them (ggml-common.h, block_*).
// Every field is little-endian as stored on disk; kiln only targets little-endian hosts.
// ggml_half (an IEEE f16) is kept as its raw bits, uint16_t; decode it with fp16_to_fp32.
//
// Notation used below: a block holds `block_elems` weights y[0..n); "d" is a scale, "dmin"
// or "m" an offset. K-quant super-blocks hold QK_K = 256 weights split into sub-blocks of 16
// or 32 with small integer scales that are themselves scaled by the f16 super-block d/dmin.
//
// The structs have no padding and natural alignment (checked below), but a block inside a
// tensor need not be aligned for its struct; read blocks through memcpy (load_block).
#pragma once

#include <cstdint>
#include <cstring>

namespace kiln::quant {

inline constexpr int kQK_K = 256;        // QK_K: weights per K-quant super-block
inline constexpr int kKScaleBytes = 12;  // K_SCALE_SIZE: packed 6-bit scales + mins
inline constexpr int kQK4_0 = 32;        // QK4_0 (also QK4_1, QK5_0, QK5_1, QK8_0, QK8_1)
inline constexpr int kQK4_NL = 32;       // QK4_NL

// block_q4_0: y[i] = d * (q[i] - 8), q 4-bit. qs[j] holds y[j] in its low nibble and
// y[j + 16] in its high nibble.
struct BlockQ4_0 {
  uint16_t d;      // f16 delta
  uint8_t qs[16];  // nibbles
};

// block_q4_1: y[i] = d * q[i] + m, q 4-bit, nibbles as in Q4_0.
struct BlockQ4_1 {
  uint16_t d;  // f16 delta
  uint16_t m;  // f16 min
  uint8_t qs[16];
};

// block_q5_0: y[i] = d * (q[i] - 16), q 5-bit. Low 4 bits as the Q4_0 nibbles; the 5th bit
// of y[i] is bit i of the little-endian uint32 qh (bits 0..15: y[0..16), 16..31: y[16..32)).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};

// block_q5_1: y[i] = d * q[i] + m, q 5-bit packed as in Q5_0.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};

// block_q8_0: y[i] = d * qs[i].
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};

// block_q8_1: y[i] = d * qs[i]; s = d * sum(qs) (f16), used by dot kernels with Q4_1/Q5_1.
struct BlockQ8_1 {
  uint16_t d;
  uint16_t s;
  int8_t qs[32];
};

// block_q2_K: 16 sub-blocks of 16. scales[j] = scale (low nibble) | min (high nibble) of
// sub-block j; y = d*scale*q - dmin*min, q 2-bit. qs: for each half h (128 weights, 32 bytes
// qs[32h..32h+32)), bits 2s..2s+1 of byte qs[32h + l] hold y[128h + 32s + l], s = 0..3.
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d;     // f16 super-block scale for the scales
  uint16_t dmin;  // f16 super-block scale for the mins
};

// block_q3_K: 16 sub-blocks of 16; y = d * (scale - 32) * (q - 4), q 3-bit.
// Low 2 bits of q: qs as in Q2_K. High bit: hmask[l] bit b holds the 3rd bit of
// y[32b + l] (l = 0..31, b = 0..7); a CLEAR bit means "subtract 4".
// scales: 16 6-bit values (see unpack_q3_k_scales).
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};

// block_q4_K: 8 sub-blocks of 32; y = d*scale*q - dmin*min, q 4-bit, 6-bit scale and min per
// sub-block packed in scales[12] (see unpack_scale_min_k4). qs: for each 64-weight chunk c
// (32 bytes qs[32c..32c+32)), byte l holds y[64c + l] (low nibble) and y[64c + 32 + l] (high).
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};

// block_q5_K: as Q4_K plus a 5th bit: qh[l] bit 2c holds the high bit of y[64c + l] and bit
// 2c+1 that of y[64c + 32 + l] (l = 0..31, c = 0..3); set means +16.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};

// block_q6_K: 16 sub-blocks of 16; y = d * scales[j] * (q - 32), q 6-bit, scales int8.
// For each half h (128 weights): ql[64h + l] low nibble -> y[128h + l], high nibble ->
// y[128h + 64 + l]; ql[64h + 32 + l] low -> y[128h + 32 + l], high -> y[128h + 96 + l]
// (l = 0..31). qh[32h + l] bits 2s..2s+1 are the top 2 bits of y[128h + 32s + l].
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};

// block_q8_K: y[i] = d * qs[i] with an fp32 d (not f16); bsums[j] = sum of qs[16j..16j+16).
// An activation format for dot products with K-quants; never stored in model files.
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};

// block_iq4_nl: y[i] = d * kIq4nlValues[q[i]], nibbles as in Q4_0.
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[16];
};

// block_iq4_xs: 8 sub-blocks of 32; y = d * (ls - 32) * kIq4nlValues[q], ls 6-bit: low 4 bits
// in scales_l[j/2] (nibble j%2), high 2 bits at bits 2j..2j+1 of scales_h. qs: sub-block j
// uses qs[16j..16j+16), nibbles as in Q4_0 (low -> first 16 weights, high -> last 16).
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[4];
  uint8_t qs[128];
};

// kvalues_iq4nl (ggml-common.h): the non-linear 4-bit codebook of IQ4_NL and IQ4_XS.
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

static_assert(sizeof(BlockQ4_0) == 18 && alignof(BlockQ4_0) == 2);
static_assert(sizeof(BlockQ4_1) == 20 && alignof(BlockQ4_1) == 2);
static_assert(sizeof(BlockQ5_0) == 22 && alignof(BlockQ5_0) == 2);
static_assert(sizeof(BlockQ5_1) == 24 && alignof(BlockQ5_1) == 2);
static_assert(sizeof(BlockQ8_0) == 34 && alignof(BlockQ8_0) == 2);
static_assert(sizeof(BlockQ8_1) == 36 && alignof(BlockQ8_1) == 2);
static_assert(sizeof(BlockQ2_K) == 84 && alignof(BlockQ2_K) == 2);
static_assert(sizeof(BlockQ3_K) == 110 && alignof(BlockQ3_K) == 2);
static_assert(sizeof(BlockQ4_K) == 144 && alignof(BlockQ4_K) == 2);
static_assert(sizeof(BlockQ5_K) == 176 && alignof(BlockQ5_K) == 2);
static_assert(sizeof(BlockQ6_K) == 210 && alignof(BlockQ6_K) == 2);
static_assert(sizeof(BlockQ8_K) == 292 && alignof(BlockQ8_K) == 4);
static_assert(sizeof(BlockIQ4_NL) == 18 && alignof(BlockIQ4_NL) == 2);
static_assert(sizeof(BlockIQ4_XS) == 136 && alignof(BlockIQ4_XS) == 2);

// Copy block `i` out of a possibly unaligned byte array.
template <typename Block>
inline Block load_block(const void* blocks, int64_t i) {
  Block b;
  std::memcpy(&b, static_cast<const uint8_t*>(blocks) + i * int64_t{sizeof(Block)}, sizeof b);
  return b;
}
template <typename Block>
inline void store_block(void* blocks, int64_t i, const Block& b) {
  std::memcpy(static_cast<uint8_t*>(blocks) + i * int64_t{sizeof(Block)}, &b, sizeof b);
}

// get_scale_min_k4 (ggml-quants.c): the 6-bit scale and min of sub-block j (0..7) of a
// Q4_K/Q5_K block from its 12-byte scales array:
//   j < 4:  scale = q[j] & 63,                          min = q[j+4] & 63
//   j >= 4: scale = (q[j+4] & 15) | (q[j-4] >> 6) << 4,  min = (q[j+4] >> 4) | (q[j] >> 6) << 4
// i.e. bytes 0..3 hold scales 0..3 (+ the top 2 bits of scales 4..7), bytes 4..7 mins 0..3
// (+ top bits of mins 4..7), bytes 8..11 the low nibbles of scale (low) and min (high) 4..7.
inline void unpack_scale_min_k4(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// The inverse: pack 8 six-bit scales and mins (each 0..63) into 12 bytes.
inline void pack_scale_min_k4(const uint8_t* scales, const uint8_t* mins, uint8_t* q) {
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<uint8_t>((scales[j] & 63) | ((scales[j + 4] >> 4) << 6));
    q[j + 4] = static_cast<uint8_t>((mins[j] & 63) | ((mins[j + 4] >> 4) << 6));
    q[j + 8] = static_cast<uint8_t>((scales[j + 4] & 0xf) | ((mins[j + 4] & 0xf) << 4));
  }
}

// Q3_K scales: 16 six-bit values s[j] in 12 bytes (dequantize_row_q3_K's kmask dance):
// low 4 bits of s[j] in byte j % 8, nibble j / 8 (bytes 0..7); high 2 bits of s[j] in byte
// 8 + j % 4 at bits 2*(j/4). Returned already minus 32 (signed, -32..31).
inline void unpack_q3_k_scales(const uint8_t* q, int8_t* out) {
  for (int j = 0; j < 16; ++j) {
    const int low = (q[j % 8] >> (4 * (j / 8))) & 0xf;
    const int high = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = static_cast<int8_t>((low | (high << 4)) - 32);
  }
}

// The inverse: s[j] in -32..31.
inline void pack_q3_k_scales(const int8_t* s, uint8_t* q) {
  std::memset(q, 0, 12);
  for (int j = 0; j < 16; ++j) {
    const int u = s[j] + 32;  // 0..63
    q[j % 8] = static_cast<uint8_t>(q[j % 8] | ((u & 0xf) << (4 * (j / 8))));
    q[8 + j % 4] = static_cast<uint8_t>(q[8 + j % 4] | ((u >> 4) << (2 * (j / 4))));
  }
}

}  // namespace kiln::quant
