// Known-answer blocks: raw bytes built by hand at the byte offsets of ggml's block structs
// (ggml-common.h), and the floats the ggml definition gives for them, worked out by hand in
// the comments. These pin the bit layout of every type independently of blocks.h.
//
// f16 bit patterns used: 0x3c00 = 1, 0x4000 = 2, 0x3800 = 0.5, 0x3400 = 0.25,
// 0xbc00 = -1, 0xb800 = -0.5.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kiln/quant/blocks.h"
#include "kiln/quant/convert.h"

namespace kiln::quant {
namespace {

using Bytes = std::vector<uint8_t>;

void put16(Bytes& b, size_t off, uint16_t v) {
  b[off] = static_cast<uint8_t>(v & 0xff);
  b[off + 1] = static_cast<uint8_t>(v >> 8);
}

// Dequantize one block; also from an odd address, which must give the same floats.
std::vector<float> decode(Type t, const Bytes& block) {
  const TypeTraits& tr = traits(t);
  EXPECT_EQ(block.size(), tr.block_bytes) << tr.name;
  std::vector<float> out(tr.block_elems), out_unaligned(tr.block_elems);
  EXPECT_TRUE(dequantize_row(t, block.data(), out.data(), tr.block_elems).ok());
  Bytes shifted(block.size() + 1);
  std::memcpy(shifted.data() + 1, block.data(), block.size());
  EXPECT_TRUE(dequantize_row(t, shifted.data() + 1, out_unaligned.data(), tr.block_elems).ok());
  EXPECT_EQ(out, out_unaligned) << tr.name;
  return out;
}

TEST(KnownAnswer, PlainTypes) {
  // f16: 1.0, 2^-24 (smallest subnormal), -65504, -0.
  const Bytes f16 = {0x00, 0x3c, 0x01, 0x00, 0xff, 0xfb, 0x00, 0x80};
  std::vector<float> y(4);
  ASSERT_TRUE(dequantize_row(Type::F16, f16.data(), y.data(), 4).ok());
  EXPECT_EQ(y, (std::vector<float>{1.0f, 0x1p-24f, -65504.0f, -0.0f}));
  EXPECT_TRUE(std::signbit(y[3]));
  // bf16: 0x3f80 = 1, 0x4049 = 3.140625, 0xc2f7 = -123.5.
  const Bytes bf16 = {0x80, 0x3f, 0x49, 0x40, 0xf7, 0xc2};
  ASSERT_TRUE(dequantize_row(Type::BF16, bf16.data(), y.data(), 3).ok());
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 3.140625f);
  EXPECT_EQ(y[2], -123.5f);
  // f32 little-endian 0x3e800000 = 0.25.
  const Bytes f32 = {0x00, 0x00, 0x80, 0x3e};
  ASSERT_TRUE(dequantize_row(Type::F32, f32.data(), y.data(), 1).ok());
  EXPECT_EQ(y[0], 0.25f);
}

// block_q4_0 {d; qs[16]}: y[j] = d*(lo(qs[j]) - 8), y[j+16] = d*(hi(qs[j]) - 8).
TEST(KnownAnswer, Q4_0) {
  Bytes b(18);
  put16(b, 0, 0x4000);  // d = 2
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = decode(Type::Q4_0, b);
  EXPECT_EQ(y[0], -16.0f);   // 2 * (0 - 8)
  EXPECT_EQ(y[15], 14.0f);   // 2 * (15 - 8)
  EXPECT_EQ(y[16], 14.0f);   // high nibble of qs[0] = 15: 2 * 7
  EXPECT_EQ(y[31], -16.0f);  // high nibble of qs[15] = 0
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * static_cast<float>(j - 8)) << j;
    EXPECT_EQ(y[j + 16], 2.0f * static_cast<float>(7 - j)) << j;
  }
}

// block_q4_1 {d; m; qs[16]}: y = d*q + m.
TEST(KnownAnswer, Q4_1) {
  Bytes b(20, 0x51);    // qs default: lo 1, hi 5
  put16(b, 0, 0x3800);  // d = 0.5
  put16(b, 2, 0xbc00);  // m = -1
  b[4 + 0] = 0x2f;      // y[0]: 15*0.5 - 1 = 6.5; y[16]: 2*0.5 - 1 = 0
  b[4 + 1] = 0x00;      // y[1] = y[17] = -1
  const auto y = decode(Type::Q4_1, b);
  EXPECT_EQ(y[0], 6.5f);
  EXPECT_EQ(y[16], 0.0f);
  EXPECT_EQ(y[1], -1.0f);
  EXPECT_EQ(y[17], -1.0f);
  EXPECT_EQ(y[2], -0.5f);  // 1*0.5 - 1
  EXPECT_EQ(y[18], 1.5f);  // 5*0.5 - 1
  EXPECT_EQ(y[31], 1.5f);
}

// block_q5_0 {d; qh[4]; qs[16]}: 5th bit of y[j] = bit j of qh (little-endian uint32).
TEST(KnownAnswer, Q5_0) {
  Bytes b(22, 0x00);
  put16(b, 0, 0x3c00);  // d = 1
  b[2] = 0x01;          // qh bit 0  -> y[0]
  b[4] = 0x08;          // qh bit 19 -> y[19] (high nibble of qs[3])
  b[5] = 0x80;          // qh bit 31 -> y[31]
  b[6 + 3] = 0xa5;      // qs[3]: lo 5 -> y[3], hi 10 -> y[19]
  const auto y = decode(Type::Q5_0, b);
  EXPECT_EQ(y[0], 0.0f);     // (0 | 16) - 16
  EXPECT_EQ(y[1], -16.0f);   // 0 - 16
  EXPECT_EQ(y[3], -11.0f);   // 5 - 16
  EXPECT_EQ(y[19], 10.0f);   // (10 | 16) - 16
  EXPECT_EQ(y[16], -16.0f);  // hi(qs[0]) = 0, bit 16 clear
  EXPECT_EQ(y[31], 0.0f);    // (0 | 16) - 16
}

// block_q5_1 {d; m; qh[4]; qs[16]}: y = d*q + m.
TEST(KnownAnswer, Q5_1) {
  Bytes b(24, 0x00);
  put16(b, 0, 0x3400);  // d = 0.25
  put16(b, 2, 0x4000);  // m = 2
  b[4 + 1] = 0x02;      // qh bit 9 -> y[9]
  b[8 + 9] = 0xf3;      // qs[9]: lo 3 -> y[9], hi 15 -> y[25]
  const auto y = decode(Type::Q5_1, b);
  EXPECT_EQ(y[9], 6.75f);   // (3 | 16) * 0.25 + 2 = 19/4 + 2
  EXPECT_EQ(y[25], 5.75f);  // 15 * 0.25 + 2 (bit 25 clear)
  EXPECT_EQ(y[0], 2.0f);
  EXPECT_EQ(y[31], 2.0f);
}

// block_q8_0 {d; qs[32]}: y = d*qs.
TEST(KnownAnswer, Q8_0) {
  Bytes b(34);
  put16(b, 0, 0xb800);  // d = -0.5
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  b[2 + 5] = 0x80;  // -128
  const auto y = decode(Type::Q8_0, b);
  EXPECT_EQ(y[0], 8.0f);    // -0.5 * -16
  EXPECT_EQ(y[5], 64.0f);   // -0.5 * -128
  EXPECT_EQ(y[31], -7.5f);  // -0.5 * 15
  EXPECT_EQ(y[16], 0.0f);
}

// block_q8_1 {d; s; qs[32]}: y = d*qs; s is not used to decode.
TEST(KnownAnswer, Q8_1) {
  Bytes b(36);
  put16(b, 0, 0x4000);  // d = 2
  put16(b, 2, 0x1234);  // s: ignored
  for (int j = 0; j < 32; ++j) b[4 + j] = static_cast<uint8_t>(static_cast<int8_t>(3 * j - 50));
  const auto y = decode(Type::Q8_1, b);
  EXPECT_EQ(y[0], -100.0f);  // 2 * -50
  EXPECT_EQ(y[31], 86.0f);   // 2 * 43
}

// block_q2_K {scales[16]; qs[64]; d; dmin}: y = d*(sc & 15)*q - dmin*(sc >> 4); element
// 128h + 32s + l: q = bits 2s..2s+1 of qs[32h + l]; sub-block = element / 16.
TEST(KnownAnswer, Q2_K) {
  Bytes b(84);
  for (int j = 0; j < 16; ++j) b[j] = 0x21;       // scale 1, min 2
  b[5] = 0x93;                                    // sub-block 5: scale 3, min 9
  b[13] = 0x0f;                                   // sub-block 13: scale 15, min 0
  for (int k = 0; k < 64; ++k) b[16 + k] = 0xe4;  // 11 10 01 00: q = s
  b[16 + 32 + 7] = 0x1b;                          // 00 01 10 11: h=1, l=7: q = 3 - s
  put16(b, 80, 0x3c00);                           // d = 1
  put16(b, 82, 0x3800);                           // dmin = 0.5
  const auto y = decode(Type::Q2_K, b);
  EXPECT_EQ(y[0], -1.0f);    // 1*1*0 - 0.5*2
  EXPECT_EQ(y[40], 0.0f);    // s = 1: 1 - 1
  EXPECT_EQ(y[127], 2.0f);   // s = 3: 3 - 1
  EXPECT_EQ(y[128], -1.0f);  // h = 1, s = 0
  EXPECT_EQ(y[80], 1.5f);    // sub 5, s = 2: 3*2 - 0.5*9
  EXPECT_EQ(y[95], 1.5f);
  EXPECT_EQ(y[208], 30.0f);  // sub 13, s = 2 (208 % 128 = 80): 15*2 - 0
  EXPECT_EQ(y[135], 2.0f);   // byte 0x1b, s = 0: q = 3
  EXPECT_EQ(y[167], 1.0f);   // s = 1: q = 2
  EXPECT_EQ(y[199], 0.0f);   // s = 2: q = 1
  EXPECT_EQ(y[231], -1.0f);  // s = 3: q = 0
}

// block_q3_K {hmask[32]; qs[64]; scales[12]; d}: y = d * (s6 - 32) * (q2 - (hbit ? 0 : 4)).
// 6-bit s of sub-block j: low 4 bits = nibble j/8 of scales[j % 8]; high 2 bits = bits
// 2*(j/4) of scales[8 + j % 4]. hbit of element i = bit i/32 of hmask[i % 32].
TEST(KnownAnswer, Q3_K) {
  Bytes b(110, 0x00);
  b[5] = 0x81;  // hmask[5]: bits 0 and 7 -> elements 5 and 229 have the high bit
  for (int k = 0; k < 64; ++k) b[32 + k] = 0xe4;  // q2 = s (quarter of the half)
  uint8_t* sc = b.data() + 96;
  for (int k = 0; k < 8; ++k) sc[k] = 0x11;   // low nibbles 1
  sc[2] = 0x5a;                               // j = 2: low 0xa; j = 10: low 5
  for (int k = 8; k < 12; ++k) sc[k] = 0xaa;  // high bits 2 -> s = low + 32
  sc[9] = 0x1b;  // j % 4 == 1: high bits 3 (j=1), 2 (j=5), 1 (j=9), 0 (j=13)
  // s - 32: j=1: 1+48-32 = 17; j=2: 10; j=5: 1; j=9: 1+16-32 = -15; j=10: 5; j=13: 1-32 = -31;
  // every other j: 1.
  put16(b, 108, 0x3800);  // d = 0.5
  const auto y = decode(Type::Q3_K, b);
  EXPECT_EQ(y[5], 0.0f);     // sub 0 (1), q2 0, hbit set: 0.5*1*0
  EXPECT_EQ(y[0], -2.0f);    // q2 0, no hbit: 0.5*1*(0-4)
  EXPECT_EQ(y[16], -34.0f);  // sub 1 (17): 0.5*17*-4
  EXPECT_EQ(y[40], -15.0f);  // sub 2 (10), q2 1: 0.5*10*(1-4)
  EXPECT_EQ(y[37], -15.0f);  // hmask[5] bit 1 clear: same
  EXPECT_EQ(y[150], 30.0f);  // sub 9 (-15), 150%128=22 -> q2 0: 0.5*-15*-4
  EXPECT_EQ(y[165], -7.5f);  // sub 10 (5), q2 1: 0.5*5*-3
  EXPECT_EQ(y[213], 31.0f);  // sub 13 (-31), 85/32 -> q2 2: 0.5*-31*-2
  EXPECT_EQ(y[229], 1.5f);   // sub 14 (1), q2 3, hbit (hmask[5] bit 7): 0.5*1*3
  EXPECT_EQ(y[255], -0.5f);  // sub 15 (1), q2 3, no hbit: 0.5*(3-4)
}

// The 12-byte Q4_K/Q5_K scales used below (get_scale_min_k4):
//   bytes 0..3 {0x01,0x42,0x83,0xc4}: scales 0..3 = 1,2,3,4; top bits 0,1,2,3 -> scales 4..7
//   bytes 4..7 {0x05,0x46,0x07,0xc8}: mins 0..3 = 5,6,7,8; top bits 0,1,0,3 -> mins 4..7
//   bytes 8..11 {0x21,0x43,0x65,0x87}: low nibbles of scales 4..7 = 1,3,5,7, mins 4..7 = 2,4,6,8
// so scales 4..7 = 1, 3|16 = 19, 5|32 = 37, 7|48 = 55 and mins 4..7 = 2, 4|16 = 20, 6, 8|48 = 56.
const uint8_t kKScales[12] = {0x01, 0x42, 0x83, 0xc4, 0x05, 0x46,
                              0x07, 0xc8, 0x21, 0x43, 0x65, 0x87};

TEST(KnownAnswer, ScaleMinK4Unpacking) {
  const uint8_t want_scale[8] = {1, 2, 3, 4, 1, 19, 37, 55};
  const uint8_t want_min[8] = {5, 6, 7, 8, 2, 20, 6, 56};
  for (int j = 0; j < 8; ++j) {
    uint8_t s, m;
    unpack_scale_min_k4(j, kKScales, &s, &m);
    EXPECT_EQ(s, want_scale[j]) << j;
    EXPECT_EQ(m, want_min[j]) << j;
  }
  uint8_t packed[12];
  pack_scale_min_k4(want_scale, want_min, packed);
  EXPECT_EQ(0, std::memcmp(packed, kKScales, 12));
}

// block_q4_K {d; dmin; scales[12]; qs[128]}: sub-block j (32 elements) = d*sc_j*q - dmin*m_j;
// element 64c + l: low nibble of qs[32c + l]; element 64c + 32 + l: high nibble.
TEST(KnownAnswer, Q4_K) {
  Bytes b(144, 0x3a);   // qs: low 10, high 3
  put16(b, 0, 0x3c00);  // d = 1
  put16(b, 2, 0x3400);  // dmin = 0.25
  std::memcpy(b.data() + 4, kKScales, 12);
  b[16 + 64 + 5] = 0xf0;  // chunk 2, l = 5: element 133 -> 0, element 165 -> 15
  const auto y = decode(Type::Q4_K, b);
  EXPECT_EQ(y[0], 8.75f);     // 1*10 - 0.25*5
  EXPECT_EQ(y[32], 4.5f);     // 2*3 - 0.25*6
  EXPECT_EQ(y[64], 28.25f);   // 3*10 - 0.25*7
  EXPECT_EQ(y[127], 10.0f);   // 4*3 - 0.25*8
  EXPECT_EQ(y[128], 9.5f);    // 1*10 - 0.25*2
  EXPECT_EQ(y[133], -0.5f);   // 1*0 - 0.25*2
  EXPECT_EQ(y[160], 52.0f);   // 19*3 - 0.25*20
  EXPECT_EQ(y[165], 280.0f);  // 19*15 - 5
  EXPECT_EQ(y[192], 368.5f);  // 37*10 - 0.25*6
  EXPECT_EQ(y[255], 151.0f);  // 55*3 - 0.25*56
}

// block_q5_K {d; dmin; scales[12]; qh[32]; qs[128]}: as Q4_K plus 16 * (bit j of qh[l]) for
// element 32j + l.
TEST(KnownAnswer, Q5_K) {
  Bytes b(176, 0x3a);
  put16(b, 0, 0x3c00);
  put16(b, 2, 0x3400);
  std::memcpy(b.data() + 4, kKScales, 12);
  for (int l = 0; l < 32; ++l) b[16 + l] = 0x00;
  b[16 + 2] = 0x91;  // qh[2] bits 0, 4, 7 -> elements 2, 130, 226
  const auto y = decode(Type::Q5_K, b);
  EXPECT_EQ(y[0], 8.75f);      // as Q4_K
  EXPECT_EQ(y[2], 24.75f);     // 1*(10+16) - 1.25
  EXPECT_EQ(y[128], 9.5f);     // 1*10 - 0.5
  EXPECT_EQ(y[130], 25.5f);    // 1*26 - 0.5
  EXPECT_EQ(y[224], 151.0f);   // 55*3 - 14
  EXPECT_EQ(y[226], 1031.0f);  // 55*(3+16) - 14
  EXPECT_EQ(y[34], 4.5f);      // qh[2] bit 1 clear
}

// block_q6_K {ql[128]; qh[64]; scales[16] int8; d}: y = d * sc[i/16] * (q - 32). For half h,
// quarter s, l: low 4 bits from ql[64h + 32*(s%2) + l] (low nibble for s < 2, high for s >= 2),
// top 2 bits = bits 2s..2s+1 of qh[32h + l].
TEST(KnownAnswer, Q6_K) {
  Bytes b(210);
  for (int k = 0; k < 128; ++k) b[k] = 0x21;       // ql: low nibble 1, high 2
  for (int k = 0; k < 64; ++k) b[128 + k] = 0xe4;  // qh: quarter s -> top bits s
  const int8_t scales[16] = {1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6, 7, -7, 8, -128};
  std::memcpy(b.data() + 192, scales, 16);
  put16(b, 208, 0x3800);   // d = 0.5
  b[64 + 32 + 3] = 0x9f;   // h=1, l=3, odd quarters: q1 low 15 (el. 163), q3 high 9 (el. 227)
  b[128 + 32 + 3] = 0x1b;  // qh h=1, l=3: top bits 3, 2, 1, 0 for quarters 0..3
  // Default q - 32: quarter 0: 1 - 32 = -31; 1: 17 - 32 = -15; 2: 34 - 32 = 2; 3: 50 - 32 = 18.
  const auto y = decode(Type::Q6_K, b);
  EXPECT_EQ(y[0], -15.5f);      // 0.5 * 1 * -31
  EXPECT_EQ(y[40], -15.0f);     // sub 2 (2): 0.5*2*-15
  EXPECT_EQ(y[70], 3.0f);       // sub 4 (3): 0.5*3*2
  EXPECT_EQ(y[100], 36.0f);     // sub 6 (4): 0.5*4*18
  EXPECT_EQ(y[130], -77.5f);    // sub 8 (5): 0.5*5*-31
  EXPECT_EQ(y[250], -1152.0f);  // sub 15 (-128): 0.5*-128*18
  EXPECT_EQ(y[131], 42.5f);     // lo 1, top 3: 49-32 = 17; 0.5*5*17
  EXPECT_EQ(y[163], 45.0f);     // lo 15, top 2: 47-32 = 15; sub 10 (6): 0.5*6*15
  EXPECT_EQ(y[195], -49.0f);    // lo 2, top 1: 18-32 = -14; sub 12 (7)
  EXPECT_EQ(y[227], -92.0f);    // lo 9, top 0: 9-32 = -23; sub 14 (8)
}

// block_q8_K {float d; qs[256]; bsums[16]}: y = d * qs.
TEST(KnownAnswer, Q8_K) {
  Bytes b(292, 0x00);
  const uint8_t quarter[4] = {0x00, 0x00, 0x80, 0x3e};  // 0.25f little-endian
  std::memcpy(b.data(), quarter, 4);
  for (int i = 0; i < 256; ++i) b[4 + i] = static_cast<uint8_t>(static_cast<int8_t>(i - 128));
  const auto y = decode(Type::Q8_K, b);
  EXPECT_EQ(y[0], -32.0f);
  EXPECT_EQ(y[128], 0.0f);
  EXPECT_EQ(y[255], 31.75f);
}

// block_iq4_nl {d; qs[16]}: y[j] = d*kvalues_iq4nl[lo(qs[j])], y[j+16] = d*kvalues[hi(qs[j])].
TEST(KnownAnswer, IQ4_NL) {
  Bytes b(18);
  put16(b, 0, 0x4000);  // d = 2
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = decode(Type::IQ4_NL, b);
  EXPECT_EQ(y[0], -254.0f);  // 2 * -127
  EXPECT_EQ(y[8], 2.0f);     // 2 * 1
  EXPECT_EQ(y[15], 226.0f);  // 2 * 113
  EXPECT_EQ(y[16], 226.0f);  // hi(qs[0]) = 15
  EXPECT_EQ(y[24], -20.0f);  // hi(qs[8]) = 7: 2 * -10
  const int8_t table[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                            1,    13,   25,  38,  53,  69,  89,  113};
  for (int j = 0; j < 16; ++j) EXPECT_EQ(y[j], 2.0f * static_cast<float>(table[j])) << j;
}

// block_iq4_xs {d; scales_h; scales_l[4]; qs[128]}: sub-block j: ls = nibble j%2 of
// scales_l[j/2] | (bits 2j..2j+1 of scales_h) << 4; y = d*(ls - 32)*kvalues[q]; qs[16j..].
TEST(KnownAnswer, IQ4_XS) {
  Bytes b(136, 0x98);   // qs: lo 8 (kvalue 1), hi 9 (kvalue 13)
  put16(b, 0, 0x3c00);  // d = 1
  put16(b, 2, 0xe4e4);  // high bits per j: 0,1,2,3,0,1,2,3
  b[4] = 0x21;          // low nibbles j=0: 1, j=1: 2
  b[5] = 0x43;          // j=2: 3, j=3: 4
  b[6] = 0x65;          // j=4: 5, j=5: 6
  b[7] = 0x87;          // j=6: 7, j=7: 8
  // ls - 32: j0: 1-32 = -31; j1: 18-32 = -14; j2: 35-32 = 3; j3: 52-32 = 20; j4: -27; j5: -10;
  // j6: 7; j7: 24.
  b[8 + 16 * 5 + 2] = 0x0f;  // sub 5, j=2: element 162 -> kvalue 113, element 178 -> -127
  const auto y = decode(Type::IQ4_XS, b);
  EXPECT_EQ(y[0], -31.0f);
  EXPECT_EQ(y[16], -403.0f);  // -31 * 13
  EXPECT_EQ(y[32], -14.0f);
  EXPECT_EQ(y[70], 3.0f);
  EXPECT_EQ(y[120], 260.0f);  // 20 * 13
  EXPECT_EQ(y[128], -27.0f);
  EXPECT_EQ(y[162], -1130.0f);  // -10 * 113
  EXPECT_EQ(y[178], 1270.0f);   // -10 * -127
  EXPECT_EQ(y[192], 7.0f);
  EXPECT_EQ(y[255], 312.0f);  // 24 * 13
}

}  // namespace
}  // namespace kiln::quant
