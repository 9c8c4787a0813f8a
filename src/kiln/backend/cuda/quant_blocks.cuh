// Device decoders of the GGUF blocks (quant/blocks.h), private to dequant.cu and matmul.cu.
//
// Each type is a struct with the block geometry and `dec8(blk, j, out)`: the 8 weights
// 8j..8j+8 of the block at `blk` (global or shared memory, read with byte/16-bit loads, so any
// 2-byte alignment works; Q8_K's fp32 d is read bytewise). The plain types F32/F16/BF16 are
// seen as "blocks" of 8 elements here (callers guarantee n_in % 8 == 0 or use elem()).
//
// Bit-exactness with quant::dequantize_row: every product and sum is written with the
// round-to-nearest intrinsics (__fmul_rn, __fadd_rn, __fsub_rn) in the reference's order, so
// nvcc cannot contract them into FMAs (the host reference is built with -std=c++20, i.e.
// -ffp-contract=off). f16 -> f32 is the same bit manipulation as quant/fp16.h (NaN payloads
// kept).
#pragma once

#include <cstdint>

#include "kiln/quant/types.h"

namespace kiln::backend::cuda::qb {

__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8);
}
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) {
  return ld_u16(p) | (ld_u16(p + 2) << 16);
}

__device__ __forceinline__ float f16_bits_to_f32(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    const float mag = __fmul_rn(static_cast<float>(mant), 0x1p-24f);  // exact
    return sign ? -mag : mag;
  }
  return __uint_as_float(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}
// f16 bits -> f32, branch-free, exact for finite values (normal and subnormal: the bits moved
// into place are the value times 2^-112); inf and NaN come out finite. For the matmul's F16
// weights only, where the reference's exactness on NaN payloads does not matter.
__device__ __forceinline__ float f16_finite_to_f32(uint32_t h) {
  return __fmul_rn(__uint_as_float(((h & 0x8000u) << 16) | ((h & 0x7fffu) << 13)), 0x1p112f);
}

// f16 bits -> f32: the reference's conversion when kExact, else the branch-free one.
template <bool kExact>
__device__ __forceinline__ float f16_to_f32(uint32_t h) {
  if constexpr (kExact) {
    return f16_bits_to_f32(h);
  } else {
    return f16_finite_to_f32(h);
  }
}

// v - bias as a float for 0 <= v < 2^23 and small biases, exactly, on the FP32 pipe: the bits
// of 2^23 + v minus 2^23 + bias (an int-to-float conversion instruction issues at a fraction
// of the FP32 rate, and the decoders run once per weight).
__device__ __forceinline__ float int_to_f32(uint32_t v, int bias = 0) {
  return __fsub_rn(__uint_as_float(0x4B000000u | v), 8388608.0f + static_cast<float>(bias));
}

__device__ __forceinline__ float ld_f16(const uint8_t* p) {
  return f16_bits_to_f32(ld_u16(p));
}

// Wide loads of a little-endian word / double word at p, which is A-byte aligned (A >= 2:
// the blocks of every type start at even addresses). Used where the caller knows more
// alignment (a block staged in shared memory at a 16-byte aligned chunk).
template <int A>
__device__ __forceinline__ uint32_t ldw(const uint8_t* p) {
  if constexpr (A >= 4) {
    return *reinterpret_cast<const uint32_t*>(p);
  } else {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
  }
}
template <int A>
__device__ __forceinline__ uint64_t ldq(const uint8_t* p) {
  if constexpr (A >= 8) {
    return *reinterpret_cast<const uint64_t*>(p);
  } else {
    return static_cast<uint64_t>(ldw<A>(p)) | (static_cast<uint64_t>(ldw<A>(p + 4)) << 32);
  }
}
constexpr int min_align(int a, int b) {
  return a < b ? a : b;
}

static __device__ const int8_t kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};

// ---- plain types (virtual blocks of 8) ----------------------------------------------------

struct F32 {
  static constexpr quant::Type kType = quant::Type::F32;
  static constexpr int kElems = 8, kBytes = 32;
  __device__ static float elem(const uint8_t* row, int64_t i) {
    return __uint_as_float(ldw<2>(row + 4 * i));
  }
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int, float* o) {
    for (int k = 0; k < 8; k += 2) {
      const uint64_t v = ldq<min_align(A, 8)>(b + 4 * k);
      o[k] = __uint_as_float(static_cast<uint32_t>(v));
      o[k + 1] = __uint_as_float(static_cast<uint32_t>(v >> 32));
    }
  }
};
struct F16 {
  static constexpr quant::Type kType = quant::Type::F16;
  static constexpr int kElems = 8, kBytes = 16;
  __device__ static float elem(const uint8_t* row, int64_t i) { return ld_f16(row + 2 * i); }
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int, float* o) {
    const uint64_t lo = ldq<min_align(A, 8)>(b), hi = ldq<min_align(A, 8)>(b + 8);
    for (int k = 0; k < 4; ++k) {
      o[k] = f16_finite_to_f32(static_cast<uint32_t>(lo >> (16 * k)) & 0xffffu);
      o[k + 4] = f16_finite_to_f32(static_cast<uint32_t>(hi >> (16 * k)) & 0xffffu);
    }
  }
};
struct BF16 {
  static constexpr quant::Type kType = quant::Type::BF16;
  static constexpr int kElems = 8, kBytes = 16;
  __device__ static float elem(const uint8_t* row, int64_t i) {
    return __uint_as_float(ld_u16(row + 2 * i) << 16);
  }
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int, float* o) {
    const uint64_t lo = ldq<min_align(A, 8)>(b), hi = ldq<min_align(A, 8)>(b + 8);
    for (int k = 0; k < 4; ++k) {
      o[k] = __uint_as_float((static_cast<uint32_t>(lo >> (16 * k)) & 0xffffu) << 16);
      o[k + 4] = __uint_as_float((static_cast<uint32_t>(hi >> (16 * k)) & 0xffffu) << 16);
    }
  }
};
// ---- 32-element blocks ----------------------------------------------------------------------

// Nibble k of group j of a Q4_0-style qs[16]: groups 0,1 are low nibbles of qs[0..16), 2,3 the
// high nibbles.
__device__ __forceinline__ int nib(const uint8_t* qs, int j, int k) {
  const int l = 8 * (j & 1) + k;
  return (j < 2) ? (qs[l] & 0xf) : (qs[l] >> 4);
}

struct Q4_0 {
  static constexpr quant::Type kType = quant::Type::Q4_0;
  static constexpr int kElems = 32, kBytes = 18;
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int j, float* o) {
    const float d = f16_to_f32<kExact>(ldw<2>(b) & 0xffffu);
    const uint64_t q = ldq<2>(b + 2 + 8 * (j & 1)) >> (j < 2 ? 0 : 4);
    for (int k = 0; k < 8; ++k) {
      const int v = static_cast<int>((q >> (8 * k)) & 0xf);
      o[k] = __fmul_rn(int_to_f32(static_cast<uint32_t>(v), 8), d);
    }
  }
};
struct Q4_1 {
  static constexpr quant::Type kType = quant::Type::Q4_1;
  static constexpr int kElems = 32, kBytes = 20;
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int j, float* o) {
    const float d = ld_f16(b), m = ld_f16(b + 2);
    for (int k = 0; k < 8; ++k)
      o[k] = __fadd_rn(__fmul_rn(static_cast<float>(nib(b + 4, j, k)), d), m);
  }
};
__device__ __forceinline__ int q5(const uint8_t* qh, const uint8_t* qs, int j, int k) {
  const uint32_t h = ld_u32(qh);
  const int i = 8 * j + k;
  return nib(qs, j, k) | static_cast<int>(((h >> i) & 1u) << 4);
}
struct Q5_0 {
  static constexpr quant::Type kType = quant::Type::Q5_0;
  static constexpr int kElems = 32, kBytes = 22;
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int j, float* o) {
    const float d = ld_f16(b);
    for (int k = 0; k < 8; ++k)
      o[k] = __fmul_rn(static_cast<float>(q5(b + 2, b + 6, j, k) - 16), d);
  }
};
struct Q5_1 {
  static constexpr quant::Type kType = quant::Type::Q5_1;
  static constexpr int kElems = 32, kBytes = 24;
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int j, float* o) {
    const float d = ld_f16(b), m = ld_f16(b + 2);
    for (int k = 0; k < 8; ++k)
      o[k] = __fadd_rn(__fmul_rn(static_cast<float>(q5(b + 4, b + 8, j, k)), d), m);
  }
};
struct Q8_0 {
  static constexpr quant::Type kType = quant::Type::Q8_0;
  static constexpr int kElems = 32, kBytes = 34;
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int j, float* o) {
    const float d = f16_to_f32<kExact>(*reinterpret_cast<const uint16_t*>(b));
    const uint64_t q = ldq<2>(b + 2 + 8 * j);
    for (int k = 0; k < 8; ++k) {
      o[k] = __fmul_rn(int_to_f32(static_cast<uint32_t>((q >> (8 * k)) & 0xff) ^ 0x80u, 128), d);
    }
  }
};
struct Q8_1 {
  static constexpr quant::Type kType = quant::Type::Q8_1;
  static constexpr int kElems = 32, kBytes = 36;
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int j, float* o) {
    const float d = ld_f16(b);
    const uint8_t* q = b + 4 + 8 * j;
    for (int k = 0; k < 8; ++k) o[k] = __fmul_rn(static_cast<float>(static_cast<int8_t>(q[k])), d);
  }
};
struct IQ4_NL {
  static constexpr quant::Type kType = quant::Type::IQ4_NL;
  static constexpr int kElems = 32, kBytes = 18;
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int j, float* o) {
    const float d = ld_f16(b);
    for (int k = 0; k < 8; ++k) o[k] = __fmul_rn(d, static_cast<float>(kIq4nl[nib(b + 2, j, k)]));
  }
};

// ---- 256-element super-blocks ---------------------------------------------------------------

struct Q2_K {  // scales[16] qs[64] d dmin
  static constexpr quant::Type kType = quant::Type::Q2_K;
  static constexpr int kElems = 256, kBytes = 84;
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int j, float* o) {
    const float d = ld_f16(b + 80), dmin = ld_f16(b + 82);
    const int i0 = 8 * j, half = i0 / 128, shift = 2 * ((i0 % 128) / 32), l0 = i0 % 32;
    const uint8_t sc = b[i0 / 16];
    const float dl = __fmul_rn(d, static_cast<float>(sc & 0xf));
    const float ml = __fmul_rn(dmin, static_cast<float>(sc >> 4));
    const uint8_t* qs = b + 16 + 32 * half + l0;
    for (int k = 0; k < 8; ++k)
      o[k] = __fsub_rn(__fmul_rn(dl, static_cast<float>((qs[k] >> shift) & 3)), ml);
  }
};
struct Q3_K {  // hmask[32] qs[64] scales[12] d
  static constexpr quant::Type kType = quant::Type::Q3_K;
  static constexpr int kElems = 256, kBytes = 110;
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int j, float* o) {
    const float d = ld_f16(b + 108);
    const int i0 = 8 * j, half = i0 / 128, shift = 2 * ((i0 % 128) / 32), l0 = i0 % 32;
    const int s = i0 / 16;
    const uint8_t* sc = b + 96;
    const int low = (sc[s % 8] >> (4 * (s / 8))) & 0xf;
    const int high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    const float dl = __fmul_rn(d, static_cast<float>((low | (high << 4)) - 32));
    const uint8_t* qs = b + 32 + 32 * half + l0;
    const uint8_t* hm = b + l0;
    const int hb = i0 / 32;
    for (int k = 0; k < 8; ++k) {
      const int q = ((qs[k] >> shift) & 3) - (((hm[k] >> hb) & 1) ? 0 : 4);
      o[k] = __fmul_rn(dl, static_cast<float>(q));
    }
  }
};
// get_scale_min_k4 (blocks.h unpack_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}
// The 6-bit scale and min of sub-block `sub` from the 12 scale bytes held in three words.
__device__ __forceinline__ void scale_min_k4w(int sub, uint32_t s0, uint32_t s1, uint32_t s2,
                                              int* sc, int* m) {
  const int sh = 8 * (sub & 3);
  if (sub < 4) {
    *sc = (s0 >> sh) & 63;
    *m = (s1 >> sh) & 63;
  } else {
    *sc = ((s2 >> sh) & 0xf) | (((s0 >> sh) >> 6 & 3) << 4);
    *m = ((s2 >> sh) >> 4 & 0xf) | (((s1 >> sh) >> 6 & 3) << 4);
  }
}
struct Q4_K {  // d dmin scales[12] qs[128]
  static constexpr quant::Type kType = quant::Type::Q4_K;
  static constexpr int kElems = 256, kBytes = 144;
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int j, float* o) {
    constexpr int A4 = min_align(A, 4), A8 = min_align(A, 8);
    const uint32_t dd = ldw<A4>(b);
    const float d = f16_to_f32<kExact>(dd & 0xffffu), dmin = f16_to_f32<kExact>(dd >> 16);
    const int sub = j / 4, l0 = 8 * (j % 4);
    int sc, m;
    scale_min_k4w(sub, ldw<A4>(b + 4), ldw<A8>(b + 8), ldw<A4>(b + 12), &sc, &m);
    const float dl = __fmul_rn(d, static_cast<float>(sc));
    const float ml = __fmul_rn(dmin, static_cast<float>(m));
    const uint64_t q = ldq<A8>(b + 16 + 32 * (sub / 2) + l0) >> (4 * (sub % 2));
    for (int k = 0; k < 8; ++k) {
      const int v = static_cast<int>((q >> (8 * k)) & 0xf);
      o[k] = __fsub_rn(__fmul_rn(dl, int_to_f32(static_cast<uint32_t>(v))), ml);
    }
  }
};
struct Q5_K {  // d dmin scales[12] qh[32] qs[128]
  static constexpr quant::Type kType = quant::Type::Q5_K;
  static constexpr int kElems = 256, kBytes = 176;
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int j, float* o) {
    constexpr int A4 = min_align(A, 4), A8 = min_align(A, 8);
    const uint32_t dd = ldw<A4>(b);
    const float d = f16_to_f32<kExact>(dd & 0xffffu), dmin = f16_to_f32<kExact>(dd >> 16);
    const int sub = j / 4, l0 = 8 * (j % 4);
    int sc, m;
    scale_min_k4w(sub, ldw<A4>(b + 4), ldw<A8>(b + 8), ldw<A4>(b + 12), &sc, &m);
    const float dl = __fmul_rn(d, static_cast<float>(sc));
    const float ml = __fmul_rn(dmin, static_cast<float>(m));
    const uint64_t qh = ldq<A8>(b + 16 + l0) >> sub;
    const uint64_t q = ldq<A8>(b + 48 + 32 * (sub / 2) + l0) >> (4 * (sub % 2));
    for (int k = 0; k < 8; ++k) {
      const int v =
          static_cast<int>((q >> (8 * k)) & 0xf) + 16 * static_cast<int>((qh >> (8 * k)) & 1);
      o[k] = __fsub_rn(__fmul_rn(dl, int_to_f32(static_cast<uint32_t>(v))), ml);
    }
  }
};
struct Q6_K {  // ql[128] qh[64] scales[16] d
  static constexpr quant::Type kType = quant::Type::Q6_K;
  static constexpr int kElems = 256, kBytes = 210;
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int j, float* o) {
    const float d = f16_to_f32<kExact>(*reinterpret_cast<const uint16_t*>(b + 208));
    const int i0 = 8 * j, half = i0 / 128, quarter = (i0 % 128) / 32, l0 = i0 % 32;
    const float ds = __fmul_rn(d, static_cast<float>(static_cast<int8_t>(b[192 + i0 / 16])));
    const uint64_t ql = ldq<2>(b + 64 * half + 32 * (quarter % 2) + l0) >> (4 * (quarter / 2));
    const uint64_t qh = ldq<2>(b + 128 + 32 * half + l0) >> (2 * quarter);
    for (int k = 0; k < 8; ++k) {
      const int lo = static_cast<int>((ql >> (8 * k)) & 0xf);
      const int hi = static_cast<int>((qh >> (8 * k)) & 3);
      o[k] = __fmul_rn(
          ds, int_to_f32(static_cast<uint32_t>(lo | (hi << 4)), 32));  // (d * sc) * q as ggml
    }
  }
};
struct Q8_K {  // float d, qs[256], bsums[16]
  static constexpr quant::Type kType = quant::Type::Q8_K;
  static constexpr int kElems = 256, kBytes = 292;
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int j, float* o) {
    const float d = __uint_as_float(ld_u32(b));
    const uint8_t* q = b + 4 + 8 * j;
    for (int k = 0; k < 8; ++k) o[k] = __fmul_rn(d, static_cast<float>(static_cast<int8_t>(q[k])));
  }
};
struct IQ4_XS {  // d scales_h scales_l[4] qs[128]
  static constexpr quant::Type kType = quant::Type::IQ4_XS;
  static constexpr int kElems = 256, kBytes = 136;
  template <int A, bool kExact = true>
  __device__ static void dec8(const uint8_t* b, int j, float* o) {
    const float d = ld_f16(b);
    const int sub = j / 4, jj = j % 4;
    const uint32_t sh = ld_u16(b + 2);
    const int ls = ((b[4 + sub / 2] >> (4 * (sub % 2))) & 0xf) | (((sh >> (2 * sub)) & 3) << 4);
    const float dl = __fmul_rn(d, static_cast<float>(ls - 32));
    const uint8_t* q = b + 8 + 16 * sub;
    for (int k = 0; k < 8; ++k) o[k] = __fmul_rn(dl, static_cast<float>(kIq4nl[nib(q, jj, k)]));
  }
};

}  // namespace kiln::backend::cuda::qb

// X(type struct) for every type CUDA decodes; the plain types first.
#define KILN_CUDA_PLAIN_TYPES(X) X(F32) X(F16) X(BF16)
#define KILN_CUDA_BLOCK_TYPES(X) \
  X(Q4_0)                        \
  X(Q4_1)                        \
  X(Q5_0)                        \
  X(Q5_1) X(Q8_0) X(Q8_1) X(Q2_K) X(Q3_K) X(Q4_K) X(Q5_K) X(Q6_K) X(Q8_K) X(IQ4_NL) X(IQ4_XS)
