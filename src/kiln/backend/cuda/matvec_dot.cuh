// The int8 dot products of the matvec kernels (matvec.cu) and of the MoE decode kernels
// (moe_decode.cu), one place so that every kernel that computes a row's dot product with the
// quantized activations gets the same bits: each weight type's block parts, loaded apart from
// their arithmetic (load / dot), row_dot (a warp's partial sums of a row, lane order fixed) and
// store_row (the warp's fixed butterfly). matvec.cu's opening comment says how the activations
// are quantized and why. Private to the .cu files.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "kiln/backend/weight.h"
#include "kiln/quant/types.h"

namespace kiln::backend::cuda::mv {

// Bytes of its first row a warp asks into L2 before the previous kernel has finished (more would
// overrun L2 with the rows of every resident warp: 16 KiB rows x 64 warps x 132 SMs).
constexpr int64_t kPrefetchBytes = 1024;

// Weight loads: from global memory through the read-only path (the matvec kernels), or from
// shared memory (matvec_stream_kernel's copies of the rows), by the dot products' L parameter.
struct LdGlobal {
  __device__ static uint16_t u16(const uint8_t* p) {
    return __ldg(reinterpret_cast<const unsigned short*>(p));
  }
  __device__ static uint32_t u32(const uint8_t* p) {
    return __ldg(reinterpret_cast<const unsigned int*>(p));
  }
  __device__ static int4 v4(const uint8_t* p) { return __ldg(reinterpret_cast<const int4*>(p)); }
  __device__ static int8_t s8(const uint8_t* p) {
    return __ldg(reinterpret_cast<const signed char*>(p));
  }
};
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
struct LdShared {
  __device__ static uint16_t u16(const uint8_t* p) {
    return *reinterpret_cast<const unsigned short*>(p);
  }
  __device__ static uint32_t u32(const uint8_t* p) {
    return *reinterpret_cast<const unsigned int*>(p);
  }
  __device__ static int4 v4(const uint8_t* p) { return *reinterpret_cast<const int4*>(p); }
  __device__ static int8_t s8(const uint8_t* p) { return *reinterpret_cast<const int8_t*>(p); }
};
#endif

template <class L = LdGlobal>
__device__ __forceinline__ int ld_a2(const uint8_t* p) {  // 2-byte aligned int
  return static_cast<int>(static_cast<uint32_t>(L::u16(p)) |
                          (static_cast<uint32_t>(L::u16(p + 2)) << 16));
}
template <class L = LdGlobal>
__device__ __forceinline__ float ld_half(const uint8_t* p) {
  return __half2float(__ushort_as_half(L::u16(p)));
}
__device__ __forceinline__ int4 ld_x16(const int8_t* p) {  // 16 levels, 16-byte aligned
  return __ldg(reinterpret_cast<const int4*>(p));
}
__device__ __forceinline__ int dot4x4(int4 w, int4 x, int acc) {
  acc = __dp4a(w.x, x.x, acc);
  acc = __dp4a(w.y, x.y, acc);
  acc = __dp4a(w.z, x.z, acc);
  return __dp4a(w.w, x.w, acc);
}
__device__ __forceinline__ int4 and4(int4 v, int m) {
  return make_int4(v.x & m, v.y & m, v.z & m, v.w & m);
}
__device__ __forceinline__ int4 shr4(int4 v, int s) {
  return make_int4(static_cast<int>(static_cast<uint32_t>(v.x) >> s),
                   static_cast<int>(static_cast<uint32_t>(v.y) >> s),
                   static_cast<int>(static_cast<uint32_t>(v.z) >> s),
                   static_cast<int>(static_cast<uint32_t>(v.w) >> s));
}

// Each type: kElems values in kBytes per block, kParts lanes per block, a Frag (the raw bytes of
// one part, in registers), load<L>(blk, part) -> Frag, and dot<T>(frag, part, xq, xds, strides,
// n, acc): acc[t] += the part's contribution for token t < n (xq / xds point at the block's
// first value / 32-group of token 0). Loading apart from the arithmetic lets row_dot issue the
// loads of several parts before it uses the first.

struct VQ8_0 {  // d, qs[32]
  static constexpr int kElems = 32, kBytes = 34, kParts = 2;
  struct Frag {
    uint32_t u[5], sh;
    float d;
  };
  template <class L = LdGlobal>
  __device__ static Frag load(const uint8_t* b, int part) {
    Frag f;
    f.d = ld_half<L>(b);
    // The 16 levels at q (2-byte aligned: 0 or 2 bytes past a word): four aligned words and, at
    // 2 past, the two bytes after them, shifted into place. (A fifth whole word read up to 4
    // bytes past the block: past the allocation at a weight's last block, compute-sanitizer's
    // out-of-bounds read.)
    const uint8_t* q = b + 2 + 16 * part;
    const uint8_t* w4 = q - (reinterpret_cast<uintptr_t>(q) & 3);
    f.sh = (reinterpret_cast<uintptr_t>(q) & 3) * 8;
#pragma unroll
    for (int k = 0; k < 4; ++k) f.u[k] = L::u32(w4 + 4 * k);
    f.u[4] = f.sh != 0 ? L::u16(w4 + 16) : 0u;
    return f;
  }
  template <int T>
  __device__ static void dot(const Frag& f, int part, const int8_t* xq, const float2* xds,
                             int64_t xs, int64_t ds, int n, float* acc) {
    const int4 w = make_int4(static_cast<int>(__funnelshift_r(f.u[0], f.u[1], f.sh)),
                             static_cast<int>(__funnelshift_r(f.u[1], f.u[2], f.sh)),
                             static_cast<int>(__funnelshift_r(f.u[2], f.u[3], f.sh)),
                             static_cast<int>(__funnelshift_r(f.u[3], f.u[4], f.sh)));
#pragma unroll
    for (int t = 0; t < T; ++t) {
      if (t < n) {
        const int s = dot4x4(w, ld_x16(xq + t * xs + 16 * part), 0);
        acc[t] += f.d * __ldg(&xds[t * ds].x) * static_cast<float>(s);
      }
    }
  }
};

struct VQ4_0 {  // d, qs[16]: value i < 16 is the low nibble of qs[i], 16 + i the high one; - 8
  static constexpr int kElems = 32, kBytes = 18, kParts = 1;
  struct Frag {
    int4 q;
    float d;
  };
  template <class L = LdGlobal>
  __device__ static Frag load(const uint8_t* b, int) {
    return Frag{make_int4(ld_a2<L>(b + 2), ld_a2<L>(b + 6), ld_a2<L>(b + 10), ld_a2<L>(b + 14)),
                ld_half<L>(b)};
  }
  template <int T>
  __device__ static void dot(const Frag& f, int, const int8_t* xq, const float2* xds, int64_t xs,
                             int64_t ds, int n, float* acc) {
    const int4 lo = and4(f.q, 0x0F0F0F0F), hi = and4(shr4(f.q, 4), 0x0F0F0F0F);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      if (t < n) {
        const int8_t* x = xq + t * xs;
        const int s = dot4x4(hi, ld_x16(x + 16), dot4x4(lo, ld_x16(x), 0));
        const float2 dx = __ldg(&xds[t * ds]);
        acc[t] += f.d * (dx.x * static_cast<float>(s) - 8.0f * dx.y);
      }
    }
  }
};

// Scale and min of sub-block j (0..7) of a K-quant's 12 scale bytes in three words.
__device__ __forceinline__ void k4_scale_min(int j, uint32_t s0, uint32_t s1, uint32_t s2,
                                             float* sc, float* m) {
  const int sh = 8 * (j & 3);
  if (j < 4) {
    *sc = static_cast<float>((s0 >> sh) & 63);
    *m = static_cast<float>((s1 >> sh) & 63);
  } else {
    *sc = static_cast<float>(((s2 >> sh) & 0xf) | (((s0 >> sh) >> 6 & 3) << 4));
    *m = static_cast<float>(((s2 >> sh) >> 4 & 0xf) | (((s1 >> sh) >> 6 & 3) << 4));
  }
}

// d and dmin (the first word) of a K-quant block's 16-byte head.
__device__ __forceinline__ float k4_d(const int4& h) {
  return __low2float(*reinterpret_cast<const __half2*>(&h.x));
}
__device__ __forceinline__ float k4_dmin(const int4& h) {
  return __high2float(*reinterpret_cast<const __half2*>(&h.x));
}

// Q4_K: d, dmin, scales[12], qs[128]. Part c (0..3) is values 64c..64c+64: the low nibbles of
// qs[32c..32c+32] are sub-block 2c, the high ones 2c+1; value = d*sc*q - dmin*m.
// Q5_K adds qh[32] after the scales: bit j of qh[l] is the fifth bit of value l of sub-block j.
template <bool kQ5>
struct VK45 {
  static constexpr int kElems = 256, kBytes = kQ5 ? 176 : 144, kParts = 4;
  struct Frag {
    int4 h, qa, qb, ea, eb;  // ea, eb: Q5_K only
  };
  template <class L = LdGlobal>
  __device__ static Frag load(const uint8_t* b, int c) {
    Frag f;
    f.h = L::v4(b);
    const uint8_t* qs = b + (kQ5 ? 48 : 16) + 32 * c;
    f.qa = L::v4(qs);
    f.qb = L::v4(qs + 16);
    if constexpr (kQ5) {
      f.ea = L::v4(b + 16);
      f.eb = L::v4(b + 32);
    }
    return f;
  }
  template <int T>
  __device__ static void dot(const Frag& f, int c, const int8_t* xq, const float2* xds,
                             int64_t xs, int64_t ds, int n, float* acc) {
    const uint32_t hy = static_cast<uint32_t>(f.h.y), hz = static_cast<uint32_t>(f.h.z),
                   hw = static_cast<uint32_t>(f.h.w);
    const float d = k4_d(f.h), dmin = k4_dmin(f.h);
    float sc0, m0, sc1, m1;
    k4_scale_min(2 * c, hy, hz, hw, &sc0, &m0);
    k4_scale_min(2 * c + 1, hy, hz, hw, &sc1, &m1);
    int4 la = and4(f.qa, 0x0F0F0F0F), lb = and4(f.qb, 0x0F0F0F0F);
    int4 ha = and4(shr4(f.qa, 4), 0x0F0F0F0F), hb = and4(shr4(f.qb, 4), 0x0F0F0F0F);
    if constexpr (kQ5) {
      auto bit = [](int4 e, int j) { return and4(shr4(e, j), 0x01010101); };
      const int4 la5 = bit(f.ea, 2 * c), lb5 = bit(f.eb, 2 * c);
      const int4 ha5 = bit(f.ea, 2 * c + 1), hb5 = bit(f.eb, 2 * c + 1);
      la = make_int4(la.x | la5.x << 4, la.y | la5.y << 4, la.z | la5.z << 4, la.w | la5.w << 4);
      lb = make_int4(lb.x | lb5.x << 4, lb.y | lb5.y << 4, lb.z | lb5.z << 4, lb.w | lb5.w << 4);
      ha = make_int4(ha.x | ha5.x << 4, ha.y | ha5.y << 4, ha.z | ha5.z << 4, ha.w | ha5.w << 4);
      hb = make_int4(hb.x | hb5.x << 4, hb.y | hb5.y << 4, hb.z | hb5.z << 4, hb.w | hb5.w << 4);
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
      if (t < n) {
        const int8_t* x = xq + t * xs + 64 * c;
        const int s0 = dot4x4(lb, ld_x16(x + 16), dot4x4(la, ld_x16(x), 0));
        const int s1 = dot4x4(hb, ld_x16(x + 48), dot4x4(ha, ld_x16(x + 32), 0));
        const float2 x0 = __ldg(&xds[t * ds + 2 * c]);
        const float2 x1 = __ldg(&xds[t * ds + 2 * c + 1]);
        acc[t] += d * (sc0 * x0.x * static_cast<float>(s0) + sc1 * x1.x * static_cast<float>(s1)) -
                  dmin * (m0 * x0.y + m1 * x1.y);
      }
    }
  }
};

// Q4_K / Q5_K, coalesced form: part c (0..3) of a block takes qs bytes [16c, 16c + 16) and
// [64 + 16c, 64 + 16c + 16), so that each of a warp's two 16-byte loads covers 64 consecutive
// bytes of every block it touches (VK45's part c reads 32 consecutive bytes in two loads: each
// load fetches every second half-sector of the qs, and the other load the rest). Byte i of qs
// pair j (qs[32j + i]) holds value i of sub-block 2j (low nibble) and of 2j + 1 (high): part c
// has values 16(c & 1) .. + 16 of sub-blocks 2(c >> 1), +1 (first load) and 4 + 2(c >> 1), +1
// (second). A 32-value group's min term needs its whole level sum, so the even part of each
// pair of lanes adds it for both halves. Q5_K: the part's fifth bits are in qh bytes
// 16(c & 1) .. + 16 (bit j of qh[l]: value l of sub-block j), one more 16-byte load.
__device__ __forceinline__ void k4_lo(int j, uint32_t s0, uint32_t s1, float* sc, float* m) {
  const int sh = 8 * j;  // j < 4
  *sc = static_cast<float>((s0 >> sh) & 63);
  *m = static_cast<float>((s1 >> sh) & 63);
}
__device__ __forceinline__ void k4_hi(int j, uint32_t s0, uint32_t s1, uint32_t s2, float* sc,
                                      float* m) {
  const int sh = 8 * (j - 4);  // j >= 4
  *sc = static_cast<float>(((s2 >> sh) & 0xf) | (((s0 >> sh) >> 6 & 3) << 4));
  *m = static_cast<float>(((s2 >> sh) >> 4 & 0xf) | (((s1 >> sh) >> 6 & 3) << 4));
}

template <bool kQ5>
struct VK45c {
  static constexpr int kElems = 256, kBytes = kQ5 ? 176 : 144, kParts = 4;
  static constexpr int kQs = kQ5 ? 48 : 16;  // offset of qs
  struct Frag {
    int4 h, qa, qb, e;  // e: Q5_K's qh bytes 16(c & 1) .. + 16 (the part's values' fifth bits)
  };
  template <class L = LdGlobal>
  __device__ static Frag load(const uint8_t* b, int c) {
    Frag f;
    f.h = L::v4(b);
    f.qa = L::v4(b + kQs + 16 * c);
    f.qb = L::v4(b + kQs + 64 + 16 * c);
    if constexpr (kQ5) f.e = L::v4(b + 16 + 16 * (c & 1));
    return f;
  }
  template <int T>
  __device__ static void dot(const Frag& f, int c, const int8_t* xq, const float2* xds,
                             int64_t xs, int64_t ds, int n, float* acc) {
    const uint32_t hy = static_cast<uint32_t>(f.h.y), hz = static_cast<uint32_t>(f.h.z),
                   hw = static_cast<uint32_t>(f.h.w);
    const float d = k4_d(f.h), dmin = k4_dmin(f.h);
    const int jj = c >> 1, half = c & 1;
    float sc[4], m[4];
    k4_lo(2 * jj, hy, hz, &sc[0], &m[0]);
    k4_lo(2 * jj + 1, hy, hz, &sc[1], &m[1]);
    k4_hi(4 + 2 * jj, hy, hz, hw, &sc[2], &m[2]);
    k4_hi(5 + 2 * jj, hy, hz, hw, &sc[3], &m[3]);
    int4 v[4];
    v[0] = and4(f.qa, 0x0F0F0F0F);
    v[1] = and4(shr4(f.qa, 4), 0x0F0F0F0F);
    v[2] = and4(f.qb, 0x0F0F0F0F);
    v[3] = and4(shr4(f.qb, 4), 0x0F0F0F0F);
    if constexpr (kQ5) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // sub-block 2jj + (k & 1) + 4(k >> 1)
        const int4 hb = and4(shr4(f.e, 2 * jj + (k & 1) + 4 * (k >> 1)), 0x01010101);
        v[k] = make_int4(v[k].x | hb.x << 4, v[k].y | hb.y << 4, v[k].z | hb.z << 4,
                         v[k].w | hb.w << 4);
      }
    }
    const float mmul = half == 0 ? dmin : 0.0f;
#pragma unroll
    for (int t = 0; t < T; ++t) {
      if (t < n) {
        const int8_t* x = xq + t * xs + 64 * jj + 16 * half;
        float r = 0.0f, rm = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int sub = 2 * jj + (k & 1) + 4 * (k >> 1);
          const int s = dot4x4(v[k], ld_x16(x + 32 * (k & 1) + 128 * (k >> 1)), 0);
          const float2 g = __ldg(&xds[t * ds + sub]);
          r += sc[k] * g.x * static_cast<float>(s);
          rm += m[k] * g.y;
        }
        acc[t] += d * r - mmul * rm;
      }
    }
  }
};
using VQ4_Kc = VK45c<false>;
using VQ5_Kc = VK45c<true>;

// v[q][i]: four values of Q6_K quarter q as signed bytes (level - 32), from the words of its
// low-bit bytes (a: quarters 0 and 2, c: 1 and 3) and high-bit bytes (e).
__device__ __forceinline__ void q6_levels(uint32_t a, uint32_t c, uint32_t e, int* v0, int* v1,
                                          int* v2, int* v3) {
  *v0 = static_cast<int>(__vsub4((a & 0x0F0F0F0Fu) | ((e & 0x03030303u) << 4), 0x20202020u));
  *v1 = static_cast<int>(
      __vsub4((c & 0x0F0F0F0Fu) | (((e >> 2) & 0x03030303u) << 4), 0x20202020u));
  *v2 = static_cast<int>(
      __vsub4(((a >> 4) & 0x0F0F0F0Fu) | (((e >> 4) & 0x03030303u) << 4), 0x20202020u));
  *v3 = static_cast<int>(
      __vsub4(((c >> 4) & 0x0F0F0F0Fu) | (((e >> 6) & 0x03030303u) << 4), 0x20202020u));
}

// Q6_K: ql[128], qh[64], scales[16] (int8), d. Value 128h + 32q + l (half h, quarter q, l < 32):
// low 4 bits from ql[64h + 32(q%2) + l] (low nibble for q < 2, high for q >= 2), high 2 bits
// from qh[32h + l] >> 2q; minus 32; scale scales[8h + 2q + l/16]. Part p (0..7): half p/4,
// l in [8(p%4), +8), all four quarters (32 values).
struct VQ6_K {
  static constexpr int kElems = 256, kBytes = 210, kParts = 8;
  struct Frag {
    int a[2], c[2], e[2];
    int8_t sc[4];
    float d;
  };
  template <class L = LdGlobal>
  __device__ static Frag load(const uint8_t* b, int p) {
    const int h = p / 4, l0 = 8 * (p % 4);
    Frag f;
    f.d = ld_half<L>(b + 208);
    const uint8_t* ql = b + 64 * h + l0;
    const uint8_t* qh = b + 128 + 32 * h + l0;
    f.a[0] = ld_a2<L>(ql);
    f.a[1] = ld_a2<L>(ql + 4);
    f.c[0] = ld_a2<L>(ql + 32);
    f.c[1] = ld_a2<L>(ql + 36);
    f.e[0] = ld_a2<L>(qh);
    f.e[1] = ld_a2<L>(qh + 4);
    const uint8_t* sc = b + 192 + 8 * h + l0 / 16;
#pragma unroll
    for (int q = 0; q < 4; ++q) f.sc[q] = L::s8(sc + 2 * q);
    return f;
  }
  template <int T>
  __device__ static void dot(const Frag& f, int p, const int8_t* xq, const float2* xds,
                             int64_t xs, int64_t ds, int n, float* acc) {
    const int h = p / 4, l0 = 8 * (p % 4);
    int v[4][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
      q6_levels(static_cast<uint32_t>(f.a[i]), static_cast<uint32_t>(f.c[i]),
                static_cast<uint32_t>(f.e[i]), &v[0][i], &v[1][i], &v[2][i], &v[3][i]);
    float scale[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) scale[q] = static_cast<float>(f.sc[q]);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      if (t < n) {
        float r = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int2 x = __ldg(reinterpret_cast<const int2*>(xq + t * xs + 128 * h + 32 * q + l0));
          const int s = __dp4a(v[q][1], x.y, __dp4a(v[q][0], x.x, 0));
          r += scale[q] * __ldg(&xds[t * ds + 4 * h + q].x) * static_cast<float>(s);
        }
        acc[t] += f.d * r;
      }
    }
  }
};

// One warp's partial sums of a row (w: its first block) with n tokens of x: lane takes the
// row's parts lane, lane + 32, ... in order (the same for every kernel here, so that their
// results agree bit for bit). U > 1: the loads of U parts (lane, lane + 32, ...) are issued
// before the first part's arithmetic, so a warp has U parts' bytes in flight at once (with
// U = 1 the compiler issued each part's loads after the previous part's arithmetic: a row of
// 4096 Q4_K values took two DRAM round trips one after the other). The order of the sums is
// the same for every U.
template <class V, int T, int U = 1, class L = LdGlobal, int kLanes = 32>
__device__ __forceinline__ void row_dot(const uint8_t* w, int64_t n_blocks, const int8_t* xq,
                                        const float2* xds, int64_t xs, int64_t ds, int n, int lane,
                                        float* acc) {
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  const int64_t n_items = n_blocks * V::kParts;
  if constexpr (U == 1) {
#pragma unroll 2
    for (int64_t i = lane; i < n_items; i += kLanes) {
      const int64_t blk = i / V::kParts;
      const int part = static_cast<int>(i % V::kParts);
      const typename V::Frag f = V::template load<L>(w + blk * V::kBytes, part);
      V::template dot<T>(f, part, xq + blk * V::kElems, xds + blk * (V::kElems / 32), xs, ds, n,
                         acc);
    }
  } else {
    for (int64_t i0 = lane; i0 < n_items; i0 += kLanes * U) {
      typename V::Frag f[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = i0 + kLanes * u;
        if (i < n_items) f[u] = V::template load<L>(w + (i / V::kParts) * V::kBytes,
                                                    static_cast<int>(i % V::kParts));
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = i0 + kLanes * u;
        if (i < n_items) {
          const int64_t blk = i / V::kParts;
          V::template dot<T>(f[u], static_cast<int>(i % V::kParts), xq + blk * V::kElems,
                             xds + blk * (V::kElems / 32), xs, ds, n, acc);
        }
      }
    }
  }
}

// The sum of a warp's (or half-warp's) partial sums in a fixed butterfly order, in every lane.
// Every lane of the warp must call it.
template <int kLanes = 32>
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// row_dot's partial sums summed (row_sum): y[t * n_out + row] for t < n, written by lane 0.
template <int T, int kLanes = 32>
__device__ __forceinline__ void store_row(const float* acc, int lane, int n, float* y,
                                          int64_t n_out, int64_t row, bool valid = true) {
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float v = row_sum<kLanes>(acc[t]);
    if (valid && lane == 0 && t < n) y[t * n_out + row] = v;
  }
}

// The rows of stacked experts' matrices a (pair, output row) reads, and each pair's expert and
// int8 activation row: what matvec_id and the MoE decode kernels share. n_blocks is set by the
// launcher with the part type (with_part_type).
struct ExpertRows {
  const uint8_t* w;  // expert e's row r at w + e * expert_bytes + r * row_bytes
  uint64_t row_bytes, expert_bytes;
  int64_t n_out, n_blocks, n_expert;
  const int8_t* xq;    // activation rows of n_in levels
  const float2* xds;   // and their (d, sum) pairs
  int64_t xq_stride, xds_stride;
  const int32_t* ids;     // [pairs]: the pair's expert
  const int32_t* x_rows;  // [pairs]: the pair's activation row (null: row p, where a kernel says)
};
inline ExpertRows expert_rows(const Weight& stacked, int64_t n_expert, const int8_t* xq,
                              const float2* xds, const int32_t* x_rows, const int32_t* ids) {
  ExpertRows e{};
  e.w = stacked.data;
  e.row_bytes = stacked.row_bytes;
  e.expert_bytes = static_cast<uint64_t>(stacked.n_out) * stacked.row_bytes;
  e.n_out = stacked.n_out;
  e.n_expert = n_expert;
  e.xq = xq;
  e.xds = xds;
  e.xq_stride = stacked.n_in;
  e.xds_stride = stacked.n_in / 32;
  e.ids = ids;
  e.x_rows = x_rows;
  return e;
}

// Calls f(V{}, n_blocks) with the part type the int8 matvec reads w's rows with (Q4_K and Q5_K:
// the coalesced parts when k_coalesced, as matvec_k_coalesced says) and the row's blocks, and
// returns what f returns; false for a type the matvec does not take. For the host launchers of
// the kernels that must give the matvec's bits.
template <class F>
bool with_part_type(const Weight& w, bool k_coalesced, F&& f) {
  switch (w.type) {
    case quant::Type::Q8_0:
      return f(VQ8_0{}, w.n_in / 32);
    case quant::Type::Q4_0:
      return f(VQ4_0{}, w.n_in / 32);
    case quant::Type::Q4_K:
      return k_coalesced ? f(VQ4_Kc{}, w.n_in / 256) : f(VK45<false>{}, w.n_in / 256);
    case quant::Type::Q5_K:
      return k_coalesced ? f(VQ5_Kc{}, w.n_in / 256) : f(VK45<true>{}, w.n_in / 256);
    case quant::Type::Q6_K:
      return f(VQ6_K{}, w.n_in / 256);
    default:
      return false;
  }
}

}  // namespace kiln::backend::cuda::mv
