// Batched quantized matmul on the fp16 tensor cores, weights dequantized in registers (mmh).
//
// y[t][o] = sum_i W[o][i] x[t][i] for Q4_K, Q5_K, Q6_K and Q8_0 weights read as stored and x
// rounded to fp16: each weight is dequantized to fp16 in registers (the dequantize + cuBLAS path's
// rounding), the products summed in fp32 by Hopper's wgmma. mmq (mmq.cu: int8 MMA) applies a
// weight scale and an activation scale to every output after every 32 values, ~5 instructions
// per output per 32 values, so its cost grows with the tokens and it is bound by instruction
// issue from ~16 tokens on. Here the scales are applied once per weight, when it is dequantized,
// and the fp16 weight then serves every token of the tile: the per-token cost is the MMA alone.
//
// Tiling. A CTA of 8 warps (two warpgroups) owns 128 weight rows x kBN tokens (16, 32 or 64)
// over a range of K (split-K, as mmq, when the tiles alone would leave SMs idle). K advances
// 256 values per stage (one super-block): each row's block (the 16-byte aligned span that covers
// it) and the kBN tokens' 256 fp16 activations land in shared memory by cp.async, up to 4
// stages deep (one CTA an SM). Warp w owns rows 16w..16w+16 and every token of the tile: per
// k16 step it dequantizes its rows' A fragment (mma.sync's m16n8k16 A layout, which is also
// wgmma's register A) and its warpgroup issues wgmma m64nNk16 with B, the activations, read by
// the tensor cores from shared memory. (mma.sync, one 8-byte B load per warp per MMA, stalled on
// the shared-memory pipe: ncu, docs/performance.md.)
//
// Layout of the activations (mmh_prepare): in groups of 8 tokens, per 256 values a 4 KB run of
// 32 chunks, chunk q holding values of k16 step q / 2 of the 8 tokens, 16 bytes each: one
// core matrix of wgmma's K-major B (no swizzle; the K-direction stride 128 bytes, the
// token-direction one a group's 4 KB), so that a stage's copy is a plain run of 16-byte pieces.
// The order of k inside a step follows the weights: in step s = 8h + u lane quad c takes
// sub-block 2c + h, values 4u..4u+3 (for Q4_K one 32-bit word of qs: bytes 32c + 4u..+4, low
// nibbles for h = 0, high for h = 1); bytes 0 and 2 go to the A register of k 2c..2c+1, bytes 1
// and 3 to that of k 2c+8..2c+9. So k 2c + j of step s is value 32 (2c + h) + 4u + 2j and k
// 8 + 2c + j is the one after it. The order of k in a dot product is free; both operands use
// this one.
//
// Dequantization: a level goes into the mantissa of fp16 1024 (lop3 with 0x6400), 1024 comes
// off (exact), then Q4_K's scale and min in one HFMA2 (d * sc and dmin * m each rounded to
// fp16: one more rounding of the weight; Q5_K's fifth bits or'ed in first), Q6_K's 32 off
// (exact) and d * scale in an HMUL2, Q8_0's 128 + level, 1152 off and d in an HMUL2.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "kiln/backend/cuda/device.h"
#include "kiln/backend/cuda/mmh.h"
#include "kiln/backend/cuda/pdl.cuh"
#include "kiln/backend/cuda/quant_blocks.cuh"
#include "kiln/backend/cuda/tile_common.cuh"

namespace kiln::backend::cuda {

namespace {

using tile::cp_async16;
using tile::lds4_a2;
using tile::lds_u16;
using tile::lds_u32;

constexpr int kBM = 128;       // weight rows per CTA
constexpr int kThreads = 256;  // 8 warps of 16 rows, two warpgroups of 64
constexpr int kKStep = 256;    // values of K per stage
constexpr int kMaxSplits = 8;

extern __shared__ __align__(128) uint8_t mmh_smem[];

// Weight types. kBlock: bytes of one 256-value block; kWC: the 16-byte chunks a stage copies of
// a row (the span covering its block: Q4_K and Q5_K rows are 16-byte aligned, Q6_K and Q8_0
// blocks sit at any even offset); kWS: a row's slot in a stage, kWC chunks padded to 16 mod 32
// bytes, so that a quarter warp's 16-byte weight loads (rows g and g + 1, 4 lanes each) hit
// distinct banks.
// (Q8_0's "block" is a stage's 8 blocks of 34 bytes.)
enum class Kind { kQ4K, kQ5K, kQ6K, kQ8_0 };
struct HQ4_K {
  static constexpr Kind kKind = Kind::kQ4K;
  static constexpr int kBlock = 144, kWC = 9, kWS = 144;
};
struct HQ5_K {
  static constexpr Kind kKind = Kind::kQ5K;
  static constexpr int kBlock = 176, kWC = 11, kWS = 176;
};
struct HQ6_K {
  static constexpr Kind kKind = Kind::kQ6K;
  static constexpr int kBlock = 210, kWC = 14, kWS = 240;
};
struct HQ8_0 {
  static constexpr Kind kKind = Kind::kQ8_0;
  static constexpr int kBlock = 8 * 34, kWC = 18, kWS = 304;
};

// A stage: the tile's activations as wgmma's K-major B, then the 128 rows' blocks. The
// activations come as mmh_prepare laid them out (see the top): per 8 tokens a 4 KB run, chunk q
// (8 values) of the 8 tokens together, so each 8 tokens x 8 values is one 128-byte core matrix
// and the copy is a plain run of 16-byte pieces.
template <int kBN>
constexpr int x_bytes() {
  return kBN * 2 * kKStep;
}
template <class Q, int kBN>
constexpr int stage_bytes() {
  return x_bytes<kBN>() + kBM * Q::kWS;
}
template <class Q, int kBN, int kS>
constexpr int smem_bytes() {  // kS stages
  return kS * stage_bytes<Q, kBN>();
}

// The per-CTA view of one weight's launch (the kernel resolves it from its MmhGroupArgs).
struct MmhArgs {
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t n_out;
  int64_t n_in;
  int64_t n_steps;   // n_in / 256
  float* y;          // [n_tokens, n_out]
  const __half* xh;  // mmh_prepare's layout
  int n_tokens;
  int splits;
  float* partials;  // [splits, n_tokens, n_out] when splits > 1
  int* counters;    // one per (token tile, row tile), zero between launches
};

// Up to kMaxGroup weights of one type sharing x in one launch: weight j owns the grid rows
// tile0[j] .. tile0[j] + row tiles x splits (split-major, as a lone launch's grid z), with its own
// split count, partial sums and counters, each chosen as a lone launch of it would.
constexpr int kMaxGroup = 4;
struct MmhPart {
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t n_out;
  float* y;
  float* partials;
  int* counters;
  int splits;
  int tile0;
};
struct MmhGroupArgs {
  MmhPart p[kMaxGroup];
  int n_parts;
  int64_t n_in;
  int64_t n_steps;
  const __half* xh;
  int n_tokens;
};

// The stage's copies. Weights: the 128 x kWC chunks in row order over the threads (a warp's
// quarter takes 128 consecutive bytes of one or two rows: whole sectors); rows past n_out repeat
// the last. Activations: each 8 tokens' 4 KB run, 16 bytes a thread; groups of 8 past n_tokens
// are not copied (their columns of the tile are never stored).
template <class Q, int kBN>
__device__ __forceinline__ void issue_step(const MmhArgs& a, int64_t row0, int tok0, int64_t step,
                                           int buf, bool weights, bool x) {
  const uint32_t base =
      static_cast<uint32_t>(__cvta_generic_to_shared(mmh_smem)) + buf * stage_bytes<Q, kBN>();
  if (weights) {
    constexpr int kTotal = kBM * Q::kWC;
#pragma unroll
    for (int k = 0; k < (kTotal + kThreads - 1) / kThreads; ++k) {
      const int f = threadIdx.x + kThreads * k;
      if (kTotal % kThreads == 0 || f < kTotal) {
        const int r = f / Q::kWC, ch = f % Q::kWC;
        const uintptr_t src =
            reinterpret_cast<uintptr_t>(a.w) +
            static_cast<uint64_t>(std::min<int64_t>(row0 + r, a.n_out - 1)) * a.row_bytes +
            static_cast<uint64_t>(step) * Q::kBlock;
        const int m = static_cast<int>(src & 15);
        if (16 * ch < m + Q::kBlock)
          cp_async16(base + x_bytes<kBN>() + r * Q::kWS + 16 * ch,
                     reinterpret_cast<const void*>((src & ~uintptr_t{15}) + 16 * ch));
      }
    }
  }
  if (x) {
    const int groups = min(kBN / 8, (a.n_tokens - tok0 + 7) / 8);
    const int t = threadIdx.x;
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j)
      if (j < groups)
        cp_async16(base + 4096 * j + 16 * t,
                   a.xh + (static_cast<int64_t>(tok0 / 8 + j) * a.n_in + 256 * step) * 8 + 8 * t);
  }
}

// wgmma m64nNk16, fp16 A from registers (each warp's 16 rows in mma.sync's A fragment layout),
// B (N tokens x 16 values, K-major, no swizzle) from shared memory by descriptor, fp32 sums in
// acc[N / 2]: acc[4 j + e] is row g + 8 (e / 2), token 8 j + 2c + (e & 1) of the warp's rows.
#define KILN_WG_ACC8(i)                                                                       \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
template <int N>
__device__ __forceinline__ void wgmma(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc);
template <>
__device__ __forceinline__ void wgmma<16>(float (&d)[8], const uint32_t (&a)[4], uint64_t desc) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, "
      "{%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
      : KILN_WG_ACC8(0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#endif
}
template <>
__device__ __forceinline__ void wgmma<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t desc) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,"
      "%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
      : KILN_WG_ACC8(0), KILN_WG_ACC8(8)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#endif
}
template <>
__device__ __forceinline__ void wgmma<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,"
      "%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
      : KILN_WG_ACC8(0), KILN_WG_ACC8(8), KILN_WG_ACC8(16), KILN_WG_ACC8(24)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#endif
}
#undef KILN_WG_ACC8

// Keeps the compiler from moving reads or writes of the sums across the wgmma fences and waits.
template <int N>
__device__ __forceinline__ void fence_acc(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared memory written by cp.async (the generic proxy) made visible to wgmma's reads.
__device__ __forceinline__ void fence_proxy_async() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait_all() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}

// The descriptor of stage buf's activations for k16 step 0 (step s: + 16 s, its chunks 2s and
// 2s + 1, in 16-byte units): no swizzle, the K-direction core-matrix stride (LBO) 128 bytes, the
// token-direction one (SBO) 4 KB.
template <class Q, int kBN>
__device__ __forceinline__ uint64_t x_desc(int buf) {
  const uint32_t addr =
      static_cast<uint32_t>(__cvta_generic_to_shared(mmh_smem)) + buf * stage_bytes<Q, kBN>();
  return uint64_t{(addr & 0x3FFFF) >> 4} | uint64_t{128 >> 4} << 16 | uint64_t{4096 >> 4} << 32;
}

// One k16 step of the warpgroup: the warps' dequantized A fragments against the stage's B. At
// most two steps in flight: the wait leaves the one just issued running while the next is
// dequantized, and frees the registers of the one before.
template <int kBN>
__device__ __forceinline__ void mma_step(float (&acc)[kBN / 2], const uint32_t (&a)[4],
                                         uint64_t desc) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
  wgmma<kBN>(acc, a, desc);
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
#endif
}

__device__ __forceinline__ __half2 as_h2(uint32_t v) {
  return *reinterpret_cast<const __half2*>(&v);
}
__device__ __forceinline__ uint32_t as_u32(__half2 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}
// Bytes 0 and 2 of v (each < 64 after the mask) as fp16 1024 + level: (v & mask) | magic in
// one LOP3 (written out: with both constants as immediates nvcc emitted two).
template <uint32_t kMask>
__device__ __forceinline__ __half2 levels_1024(uint32_t v) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(v), "n"(kMask), "r"(0x64006400u));
  return as_h2(r);
}

// The lane's rows' byte offsets (in mmh_smem) of this stage's block: rows 16 warp + g + 8 i.
template <class Q, int kBN>
__device__ __forceinline__ void row_offsets(const MmhArgs& a, int64_t step, int buf, int64_t row0,
                                            int (&woff)[2]) {
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = 16 * warp + g + 8 * i;
    const uintptr_t src =
        reinterpret_cast<uintptr_t>(a.w) +
        static_cast<uint64_t>(std::min<int64_t>(row0 + r, a.n_out - 1)) * a.row_bytes +
        static_cast<uint64_t>(step) * Q::kBlock;
    woff[i] =
        buf * stage_bytes<Q, kBN>() + x_bytes<kBN>() + r * Q::kWS + static_cast<int>(src & 15);
  }
}

// Q4_K: d, dmin, scales[12], qs[128]; Q5_K: the same with qh[32] before qs (bit j of qh[l]: bit
// 4 of level l of sub-block j). Rows 16-byte aligned (mmh_supports), so the block sits at the
// start of its slot.
template <class Q, int kBN>
__device__ __forceinline__ void compute_q45k(const MmhArgs& a, int64_t step, int buf, int64_t row0,
                                             float (&acc)[kBN / 2]) {
  constexpr bool kQ5 = Q::kKind == Kind::kQ5K;
  constexpr int kQs = kQ5 ? 48 : 16;
  const int lane = threadIdx.x % 32, c = lane % 4;
  int woff[2];
  row_offsets<Q, kBN>(a, step, buf, row0, woff);
  const uint64_t desc = x_desc<Q, kBN>(buf);
  // Scale and min of sub-blocks 2c (h = 0) and 2c + 1 (h = 1) of the lane's rows.
  __half2 sc[2][2], mn[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint4 hd = *reinterpret_cast<const uint4*>(mmh_smem + woff[i]);
    const float d = __low2float(as_h2(hd.x)), dmin = __high2float(as_h2(hd.x));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int s, m;
      qb::scale_min_k4w(2 * c + h, hd.y, hd.z, hd.w, &s, &m);
      sc[i][h] = __float2half2_rn(d * static_cast<float>(s));
      mn[i][h] = __float2half2_rn(-(dmin * static_cast<float>(m)));
    }
  }
  const __half2 k1024 = __float2half2_rn(1024.0f);
#pragma unroll
  for (int u4 = 0; u4 < 2; ++u4) {
    uint4 q[2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
      q[i] = *reinterpret_cast<const uint4*>(mmh_smem + woff[i] + kQs + 32 * c + 16 * u4);
#pragma unroll
    for (int uu = 0; uu < 4; ++uu) {
      uint32_t qh[2];  // Q5_K: the fifth bits of levels 4u..4u+3, bit j for sub-block j
      if constexpr (kQ5) {
#pragma unroll
        for (int i = 0; i < 2; ++i) qh[i] = lds_u32(mmh_smem, woff[i] + 16 + 4 * (4 * u4 + uu));
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t af[4];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint32_t wd = uu == 0 ? q[i].x : uu == 1 ? q[i].y : uu == 2 ? q[i].z : q[i].w;
          __half2 lo, hi;
          if constexpr (kQ5) {
            const uint32_t v =
                ((wd >> (4 * h)) & 0x0F0F0F0Fu) | (((qh[i] >> (2 * c + h)) & 0x01010101u) << 4);
            lo = __hsub2(levels_1024<0x00FF00FFu>(v), k1024);
            hi = __hsub2(levels_1024<0x00FF00FFu>(v >> 8), k1024);
          } else {
            const uint32_t v = wd >> (4 * h);
            lo = __hsub2(levels_1024<0x000F000Fu>(v), k1024);
            hi = __hsub2(levels_1024<0x000F000Fu>(v >> 8), k1024);
          }
          af[i] = as_u32(__hfma2(lo, sc[i][h], mn[i][h]));
          af[2 + i] = as_u32(__hfma2(hi, sc[i][h], mn[i][h]));
        }
        mma_step<kBN>(acc, af, desc + 16 * (8 * h + 4 * u4 + uu));
      }
    }
  }
}

// Q6_K: ql[128], qh[64], scales[16] (int8), d; 210-byte blocks at any even offset. Sub-block
// 2c + h is quarter 2 (c % 2) + h of half c / 2: its level l from ql byte 64 (c / 2) + 32 h + l
// (nibble c % 2) and qh byte 32 (c / 2) + l (bits 4 (c % 2) + 2h..), scale byte 8 (c / 2) + 4
// (c % 2) + 2h + l / 16.
template <int kBN>
__device__ __forceinline__ void compute_q6k(const MmhArgs& a, int64_t step, int buf, int64_t row0,
                                            float (&acc)[kBN / 2]) {
  const int lane = threadIdx.x % 32, c = lane % 4;
  int woff[2];
  row_offsets<HQ6_K, kBN>(a, step, buf, row0, woff);
  const uint64_t desc = x_desc<HQ6_K, kBN>(buf);
  const int ql0 = 64 * (c / 2), qh0 = 128 + 32 * (c / 2), sc0 = 192 + 8 * (c / 2) + 4 * (c % 2);
  const int nib = 4 * (c % 2);
  float d[2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
    d[i] = __half2float(
        __ushort_as_half(static_cast<unsigned short>(lds_u16(mmh_smem, woff[i] + 208))));
  const __half2 k1056 = __float2half2_rn(1056.0f);
#pragma unroll
  for (int u4 = 0; u4 < 2; ++u4) {
    __half2 sc[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        sc[i][h] = __float2half2_rn(
            d[i] * static_cast<float>(static_cast<int8_t>(mmh_smem[woff[i] + sc0 + 2 * h + u4])));
#pragma unroll
    for (int uu = 0; uu < 4; ++uu) {
      const int u = 4 * u4 + uu;
      uint32_t qh[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) qh[i] = lds4_a2(mmh_smem, woff[i] + qh0 + 4 * u);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t af[4];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint32_t ql = lds4_a2(mmh_smem, woff[i] + ql0 + 32 * h + 4 * u);
          const uint32_t v =
              ((ql >> nib) & 0x0F0F0F0Fu) | (((qh[i] >> (nib + 2 * h)) & 0x03030303u) << 4);
          const __half2 lo = __hsub2(levels_1024<0x00FF00FFu>(v), k1056);
          const __half2 hi = __hsub2(levels_1024<0x00FF00FFu>(v >> 8), k1056);
          af[i] = as_u32(__hmul2(lo, sc[i][h]));
          af[2 + i] = as_u32(__hmul2(hi, sc[i][h]));
        }
        mma_step<kBN>(acc, af, desc + 16 * (8 * h + u));
      }
    }
  }
}

// Q8_0: a stage is 8 blocks of d (f16) and 32 int8 levels, 34 bytes each at any even offset;
// sub-block 2c + h is block 2c + h. A level goes in as (q + 128) by flipping its sign bit, 1152
// comes off (exact), times d (exact in fp16): one rounding of the weight.
template <int kBN>
__device__ __forceinline__ void compute_q8_0(const MmhArgs& a, int64_t step, int buf, int64_t row0,
                                             float (&acc)[kBN / 2]) {
  const int lane = threadIdx.x % 32, c = lane % 4;
  int woff[2];
  row_offsets<HQ8_0, kBN>(a, step, buf, row0, woff);
  const uint64_t desc = x_desc<HQ8_0, kBN>(buf);
  __half2 d[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      d[i][h] = __half2half2(__ushort_as_half(
          static_cast<unsigned short>(lds_u16(mmh_smem, woff[i] + 34 * (2 * c + h)))));
  const __half2 k1152 = __float2half2_rn(1152.0f);
#pragma unroll
  for (int u = 0; u < 8; ++u) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t af[4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t v = lds4_a2(mmh_smem, woff[i] + 34 * (2 * c + h) + 2 + 4 * u) ^ 0x80808080u;
        const __half2 lo = __hsub2(levels_1024<0x00FF00FFu>(v), k1152);
        const __half2 hi = __hsub2(levels_1024<0x00FF00FFu>(v >> 8), k1152);
        af[i] = as_u32(__hmul2(lo, d[i][h]));
        af[2 + i] = as_u32(__hmul2(hi, d[i][h]));
      }
      mma_step<kBN>(acc, af, desc + 16 * (8 * h + u));
    }
  }
}

// grid: (token tiles, the weights' row tiles x splits).
template <class Q, int kBN, int kS>
__global__ void __launch_bounds__(kThreads, 1) mmh_kernel(const MmhGroupArgs ga) {
  // This CTA's weight: the last whose grid rows start at or before blockIdx.y (selected by
  // constant indices: the parameters stay in the constant bank).
  MmhPart p = ga.p[0];
#pragma unroll
  for (int j = 1; j < kMaxGroup; ++j)
    if (j < ga.n_parts && static_cast<int>(blockIdx.y) >= ga.p[j].tile0) p = ga.p[j];
  MmhArgs a;
  a.w = p.w;
  a.row_bytes = p.row_bytes;
  a.n_out = p.n_out;
  a.n_in = ga.n_in;
  a.n_steps = ga.n_steps;
  a.y = p.y;
  a.xh = ga.xh;
  a.n_tokens = ga.n_tokens;
  a.splits = p.splits;
  a.partials = p.partials;
  a.counters = p.counters;
  const int row_tiles = static_cast<int>((p.n_out + kBM - 1) / kBM);
  const int local = static_cast<int>(blockIdx.y) - p.tile0;
  const int row_tile = local % row_tiles;
  const int tok0 = blockIdx.x * kBN;
  const int64_t row0 = int64_t{row_tile} * kBM;
  const int split = local / row_tiles;
  const int64_t k0 = split * a.n_steps / a.splits, k1 = (split + 1) * a.n_steps / a.splits;
  const int nk = static_cast<int>(k1 - k0);
  // The first stages' weights depend on no earlier kernel: their copies start before the wait.
#pragma unroll
  for (int st = 0; st < kS - 1; ++st)
    if (st < nk) issue_step<Q, kBN>(a, row0, tok0, k0 + st, st, true, false);
  pdl_start();
#pragma unroll
  for (int st = 0; st < kS - 1; ++st) {
    if (st < nk) issue_step<Q, kBN>(a, row0, tok0, k0 + st, st, false, true);
    tile::cp_async_commit();
  }

  float acc[kBN / 2];
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.0f;

#pragma unroll 1
  for (int i = 0; i < nk; ++i) {
    const int buf = i % kS;
    // Stage i landed (this thread's copies), visible to the tensor cores' reads (async proxy),
    // and every warp done with stage i - 1, whose buffer the next copies take.
    tile::cp_async_wait<kS - 2>();
    fence_proxy_async();
    __syncthreads();
    if (i + kS - 1 < nk)
      issue_step<Q, kBN>(a, row0, tok0, k0 + i + kS - 1, (i + kS - 1) % kS, true, true);
    tile::cp_async_commit();
    fence_acc(acc);
    if constexpr (Q::kKind == Kind::kQ6K) {
      compute_q6k<kBN>(a, k0 + i, buf, row0, acc);
    } else if constexpr (Q::kKind == Kind::kQ8_0) {
      compute_q8_0<kBN>(a, k0 + i, buf, row0, acc);
    } else {
      compute_q45k<Q, kBN>(a, k0 + i, buf, row0, acc);
    }
    wgmma_wait_all();
    fence_acc(acc);
  }
  tile::cp_async_wait<0>();

  // acc[4 nt + e]: row 16 warp + g + 8 (e / 2), token 8 nt + 2c + (e & 1).
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  float* out = a.splits > 1 ? a.partials + int64_t{split} * a.n_tokens * a.n_out : a.y;
#pragma unroll
  for (int nt = 0; nt < kBN / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = row0 + 16 * warp + g + 8 * (e / 2);
      const int tok = tok0 + 8 * nt + 2 * c + (e & 1);
      if (row < a.n_out && tok < a.n_tokens) out[tok * a.n_out + row] = acc[4 * nt + e];
    }
  if (a.splits == 1) return;
  tile::splitk_finish<kBM, kBN, kThreads, kMaxSplits>(
      a.y, a.partials, a.counters + row_tile * gridDim.x + blockIdx.x, a.splits, a.n_out,
      a.n_tokens, row0, tok0);
}

// x -> mmh's layout (see the top): one thread per 4 consecutive inputs (one 16-byte load),
// values 0 and 2 stored at k 2c..2c+1 of their step, 1 and 3 at k 2c+8..2c+9.
__global__ void prepare_kernel(const float* x, __half* xh, int64_t n_quads, int64_t n_in) {
  pdl_start();
  const int64_t row_quads = n_in / 4;
  for (int64_t q = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; q < n_quads;
       q += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = q / row_quads;
    const int p = static_cast<int>(q - row * row_quads) * 4;  // position in the row
    const int v = p % kKStep, sub = v / 32, c = sub / 2, s = 8 * (sub % 2) + v % 32 / 4;
    const float4 f = *reinterpret_cast<const float4*>(x + row * n_in + p);
    // The row's 8-token group, its 256-value block, chunk 2s (k 0..7) of this token.
    __half* dst = xh + ((row / 8) * n_in + (p - v)) * 8 + 128 * s + 8 * (row % 8) + 2 * c;
    *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(f.x, f.z);
    *reinterpret_cast<__half2*>(dst + 64) = __floats2half2_rn(f.y, f.w);
  }
}

constexpr int kMaxSmem = 227 << 10;  // a CTA's dynamic shared memory on sm_90

// MmqScratch::by_shape: the split count of a weight of n_out rows and n_steps stages by its shape
// alone: what a launch of one tile of tokens takes at one CTA an SM, halved until 8 tokens'
// partial sums fit the scratch (so that any token count can run in runs of 8 or more).
int shape_splits(int64_t n_out, int64_t n_steps, const MmqScratch& scratch) {
  return tile::splitk_count((n_out + kBM - 1) / kBM, 1, n_steps, 8 * n_out, 0, kMaxSplits,
                            scratch.partials, scratch.partial_floats, scratch.n_counters);
}

// The tokens of one by_shape run: as many as every weight's partial sums and tile counters fit
// in the scratch at once (a multiple of 8, mmh_prepare's groups; at least 8, shape_splits'
// bound).
int64_t shape_run_tokens(const Weight* const* ws, int n_w, const MmqScratch& scratch) {
  int64_t run = INT64_MAX;
  for (int i = 0; i < n_w; ++i) {
    const int splits = shape_splits(ws[i]->n_out, ws[i]->n_in / kKStep, scratch);
    if (splits == 1) continue;
    const int64_t row_tiles = (ws[i]->n_out + kBM - 1) / kBM;
    run = std::min(run, scratch.partial_floats / (splits * ws[i]->n_out));
    run = std::min(run, scratch.n_counters / row_tiles * 16);  // tiles of 16 tokens at least
  }
  return std::max<int64_t>(8, run / 8 * 8);
}

// Launches the weights ws[0..n_w) (one type, sharing xh) in as few launches as the split-K
// scratch allows, at most kMaxGroup weights each. Each weight's split count is the one a launch
// of it alone takes (its own tiles against the whole GPU) and its partial sums and counters get
// their own ranges of the scratch, so that each output is summed exactly as a lone launch sums
// it; a weight whose ranges no longer fit starts the next launch.
template <class Q, int kBN, int kS>
void launch_bn(const Weight* const* ws, float* const* ys, int n_w, const __half* xh, int n_tokens,
               const MmqScratch& scratch, cudaStream_t s) {
  static const bool attr_ok =
      cudaFuncSetAttribute(mmh_kernel<Q, kBN, kS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           smem_bytes<Q, kBN, kS>()) == cudaSuccess;
  if (!attr_ok) return;
  const int64_t tok_tiles = (n_tokens + kBN - 1) / kBN;
  // CTAs resident per SM: shared-memory bound (1 to 3; 1 KiB of each CTA's is the system's).
  const int per_sm = std::max(1, std::min(3, (228 << 10) / (smem_bytes<Q, kBN, kS>() + 1024)));
  MmhGroupArgs g{};
  g.n_in = ws[0]->n_in;
  g.n_steps = ws[0]->n_in / kKStep;
  g.xh = xh;
  g.n_tokens = n_tokens;
  int64_t grid_rows = 0, used_floats = 0, used_counters = 0;
  auto flush = [&] {
    if (g.n_parts == 0) return;
    const dim3 grid(static_cast<unsigned>(tok_tiles), static_cast<unsigned>(grid_rows), 1);
    launch_pdl(mmh_kernel<Q, kBN, kS>, grid, dim3(kThreads),
               static_cast<size_t>(smem_bytes<Q, kBN, kS>()), s, g);
    g.n_parts = 0;
    grid_rows = used_floats = used_counters = 0;
  };
  for (int i = 0; i < n_w; ++i) {
    const Weight& w = *ws[i];
    const int64_t row_tiles = (w.n_out + kBM - 1) / kBM;
    const int64_t tiles = tok_tiles * row_tiles;
    const int64_t outputs = int64_t{n_tokens} * w.n_out;
    const int splits =
        scratch.by_shape
            ? shape_splits(w.n_out, g.n_steps, scratch)
            : tile::splitk_count(tiles, per_sm, g.n_steps, outputs, scratch.splits, kMaxSplits,
                                 scratch.partials, scratch.partial_floats, scratch.n_counters);
    const int64_t floats = splits > 1 ? splits * outputs : 0;
    const int64_t counters = splits > 1 ? tiles : 0;
    if (g.n_parts == kMaxGroup || used_floats + floats > scratch.partial_floats ||
        used_counters + counters > scratch.n_counters || grid_rows + row_tiles * splits > 65535)
      flush();
    MmhPart& p = g.p[g.n_parts++];
    p.w = w.data;
    p.row_bytes = w.row_bytes;
    p.n_out = w.n_out;
    p.y = ys[i];
    p.splits = splits;
    p.partials = scratch.partials != nullptr ? scratch.partials + used_floats : nullptr;
    p.counters = scratch.counters != nullptr ? scratch.counters + used_counters : nullptr;
    p.tile0 = static_cast<int>(grid_rows);
    grid_rows += row_tiles * splits;
    used_floats += floats;
    used_counters += counters;
  }
  flush();
}

// As many stages as one CTA's shared memory holds, at most 4 (3 and 2 measured within noise of
// 4 where both fit, docs/performance.md): one CTA of 8 warps an SM, up to three stages of
// copies in flight while it computes.
template <class Q, int kBN>
void launch_stages(const Weight* const* ws, float* const* ys, int n_w, const __half* xh,
                   int n_tokens, const MmqScratch& scratch, cudaStream_t s) {
  if constexpr (smem_bytes<Q, kBN, 4>() <= kMaxSmem) {
    launch_bn<Q, kBN, 4>(ws, ys, n_w, xh, n_tokens, scratch, s);
  } else if constexpr (smem_bytes<Q, kBN, 3>() <= kMaxSmem) {
    launch_bn<Q, kBN, 3>(ws, ys, n_w, xh, n_tokens, scratch, s);
  } else {
    launch_bn<Q, kBN, 2>(ws, ys, n_w, xh, n_tokens, scratch, s);
  }
}

template <class Q>
void launch_type(const Weight* const* ws, float* const* ys, int n_w, const __half* xh, int n_tokens,
                 const MmqScratch& scratch, cudaStream_t s) {
  const int bn = scratch.tile_tokens > 0 ? scratch.tile_tokens
                 : n_tokens <= 16        ? 16
                 : n_tokens <= 32        ? 32
                                         : 64;
  if (bn <= 16) {
    launch_stages<Q, 16>(ws, ys, n_w, xh, n_tokens, scratch, s);
  } else if (bn <= 32) {
    launch_stages<Q, 32>(ws, ys, n_w, xh, n_tokens, scratch, s);
  } else {
    launch_stages<Q, 64>(ws, ys, n_w, xh, n_tokens, scratch, s);
  }
}

}  // namespace

bool mmh_supports(const Weight& w) {
  if (w.n_in % kKStep != 0 || current_cc_major() != 9) return false;
  switch (w.type) {
    case quant::Type::Q4_K:
    case quant::Type::Q5_K:
      return (reinterpret_cast<uintptr_t>(w.data) & 15) == 0 && w.row_bytes % 16 == 0;
    case quant::Type::Q6_K:
    case quant::Type::Q8_0:
      return (reinterpret_cast<uintptr_t>(w.data) & 1) == 0;
    default:
      return false;
  }
}

void mmh_prepare(const float* x, int64_t n_tokens, int64_t n_in, __half* xh, cudaStream_t s) {
  const int64_t n_quads = n_tokens * n_in / 4;
  if (n_quads <= 0) return;
  const int blocks =
      static_cast<int>(std::min<int64_t>((n_quads + 255) / 256, 4 * tile::sm_count()));
  launch_pdl(prepare_kernel, dim3(blocks), dim3(256), 0, s, x, xh, n_quads, n_in);
}

void mmh(const Weight& w, float* y, const __half* xh, int64_t n_tokens, const MmqScratch& scratch,
         cudaStream_t s) {
  const Weight* ws[1] = {&w};
  float* ys[1] = {y};
  mmh_shared(ws, ys, 1, xh, n_tokens, scratch, s);
}

void mmh_shared(const Weight* const* ws, float* const* ys, int n_w, const __half* xh,
                int64_t n_tokens, const MmqScratch& scratch, cudaStream_t s) {
  if (n_tokens <= 0 || n_w <= 0) return;
  const Weight* gw[kMaxGroup * 4];
  float* gy[kMaxGroup * 4];
  int n = 0;
  for (int i = 0; i < n_w && n < kMaxGroup * 4; ++i) {
    const Weight& w = *ws[i];
    if (w.n_out <= 0 || !mmh_supports(w) || w.type != ws[0]->type || w.n_in != ws[0]->n_in)
      continue;
    gw[n] = &w;
    gy[n++] = ys[i];
  }
  if (n == 0) return;
  if (scratch.by_shape) {  // runs of tokens the scratch holds whole (each run's own launches)
    const int64_t run = shape_run_tokens(gw, n, scratch);
    if (n_tokens > run) {
      for (int64_t t0 = 0; t0 < n_tokens; t0 += run) {
        float* ry[kMaxGroup * 4];
        for (int i = 0; i < n; ++i) ry[i] = gy[i] + t0 * gw[i]->n_out;
        mmh_shared(gw, ry, n, xh + t0 * gw[0]->n_in, std::min(run, n_tokens - t0), scratch, s);
      }
      return;
    }
  }
  const int t = static_cast<int>(n_tokens);
  switch (gw[0]->type) {
    case quant::Type::Q4_K:
      launch_type<HQ4_K>(gw, gy, n, xh, t, scratch, s);
      break;
    case quant::Type::Q5_K:
      launch_type<HQ5_K>(gw, gy, n, xh, t, scratch, s);
      break;
    case quant::Type::Q6_K:
      launch_type<HQ6_K>(gw, gy, n, xh, t, scratch, s);
      break;
    default:
      launch_type<HQ8_0>(gw, gy, n, xh, t, scratch, s);
      break;
  }
}

}  // namespace kiln::backend::cuda
