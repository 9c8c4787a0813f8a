// Batched quantized matmul on the fp16 tensor cores, weights dequantized in registers (mmh).
//
// y[t][o] = sum_i W[o][i] x[t][i] for Q4_K, Q5_K, Q6_K and Q8_0 weights read as stored and x
// rounded to fp16: each weight is dequantized to fp16 in registers (the dequantize + cuBLAS path's
// rounding), the products summed in fp32 by mma.sync m16n8k16. mmq (mmq.cu: int8 MMA) applies
// a weight scale and an activation scale to every output after every 32 values, ~5
// instructions per output per 32 values, so its cost grows with the tokens and it is bound by
// instruction issue from ~16 tokens on. Here the scales are applied once per weight, when it is
// dequantized, and the fp16 weight then serves every token of the tile: the per-token cost is
// the MMA alone.
//
// Tiling. A CTA of 8 warps owns 128 weight rows x kBN tokens (16, 32 or 64) over a range of K
// (split-K, as mmq, when the tiles alone would leave SMs idle). K advances 256 values per
// stage (one super-block): each row's block (the 16-byte aligned span that covers it) and the
// kBN tokens' 256 fp16 activations land in shared memory by cp.async, 2 or 3 stages deep. Warp
// w owns rows 16w..16w+16 (one m16 tile) and every token of the tile. (4 warps of 32 rows, each
// B fragment feeding two MMAs, measured slower on the H200: 8B decode at 64 sequences 4,372
// against 5,050 tok/s, half the warps to hide the latencies. Layout keeps both shapes.)
//
// Fragment order. mmh_prepare writes the activations so that lane (g, c)'s B fragment of k16
// step s is 8 consecutive bytes: within every 256 values, position 16 s + 4 c + e holds value
// 32 (2c + s / 8) + 4 (s % 8) + {0, 2, 1, 3}[e]. So in step s = 8h + u lane quad c takes
// sub-block 2c + h, values 4u..4u+3: for Q4_K one 32-bit word of qs (bytes 32c + 4u..+4, low
// nibbles for h = 0, high for h = 1), bytes 0 and 2 in the A register of k 2c..2c+1, bytes 1
// and 3 in that of k 2c+8..2c+9, which is the order the B fragment holds. The order of k in a
// dot product is free; both operands use this one.
//
// Dequantization: a level goes into the mantissa of fp16 1024 (lop3 with 0x6400), 1024 comes
// off (exact), then Q4_K's scale and min in one HFMA2 (d * sc and dmin * m each rounded to
// fp16: one more rounding of the weight; Q5_K's fifth bits or'ed in first), Q6_K's 32 off
// (exact) and d * scale in an HMUL2, Q8_0's 128 + level, 1152 off and d in an HMUL2.
#include <cuda_fp16.h>

#include <algorithm>

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

constexpr int kBM = 128;  // weight rows per CTA
constexpr int kKStep = 256;  // values of K per stage
constexpr int kMaxSplits = 8;
// Bytes of one token's 256 activations in a stage, padded so that a half warp's 8-byte B
// loads (4 tokens x 4 lane quads) hit distinct banks: 544 / 4 = 136 words, 8 mod 32.
constexpr int kXS = 2 * kKStep + 32;

extern __shared__ __align__(16) uint8_t mmh_smem[];

// Weight types. kBlock: bytes of one 256-value block; kWS: a row's slot in a stage, the
// 16-byte span covering the block at any even offset plus padding that spreads the slots over
// the banks (kWS = 16 mod 32).
// (Q8_0's "block" is a stage's 8 blocks of 34 bytes.)
enum class Kind { kQ4K, kQ5K, kQ6K, kQ8_0 };
struct HQ4_K {
  static constexpr Kind kKind = Kind::kQ4K;
  static constexpr int kBlock = 144, kWS = 176;
};
struct HQ5_K {
  static constexpr Kind kKind = Kind::kQ5K;
  static constexpr int kBlock = 176, kWS = 208;
};
struct HQ6_K {
  static constexpr Kind kKind = Kind::kQ6K;
  static constexpr int kBlock = 210, kWS = 240;
};
struct HQ8_0 {
  static constexpr Kind kKind = Kind::kQ8_0;
  static constexpr int kBlock = 8 * 34, kWS = 304;
};
template <class Q>
constexpr int w_chunks() {  // 16-byte chunks covering a block at any even offset
  return (Q::kBlock + 14 + 15) / 16;
}

template <class Q, int kBN>
constexpr int stage_bytes() {
  return kBM * Q::kWS + kBN * kXS;
}
template <class Q, int kBN, int kS>
constexpr int smem_bytes() {  // kS stages
  return kS * stage_bytes<Q, kBN>();
}

struct MmhArgs {
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t n_out;
  int64_t n_in;
  int64_t n_steps;   // n_in / 256
  float* y;          // [n_tokens, n_out]
  const __half* xh;  // [n_tokens, n_in], fragment order
  int n_tokens;
  int splits;
  float* partials;  // [splits, n_tokens, n_out] when splits > 1
  int* counters;    // one per (token tile, row tile), zero between launches
};

// A CTA of kWarps warps: warp w owns rows kWR w..kWR (w + 1) of the tile (kMT m16 tiles) and
// every token of it; lane (g, c) holds rows g + 8 i of the warp's, i < 2 kMT.
template <int kWarps>
struct Layout {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWR = kBM / kWarps;  // rows per warp
  static constexpr int kMT = kWR / 16;      // m16 tiles per warp
  static constexpr int kRL = 2 * kMT;       // rows per lane
  static constexpr int kCS = kThreads / kBM;  // threads per weight row in the copy
};

// What a thread copies each stage, fixed for the launch. Weights: thread t copies chunks t /
// kBM, + kCS, ... of row t % kBM (its address computed once; rows past n_out repeat the last).
// Activations: chunk t % 32 (16 bytes) of tokens tok0 + t / 32 + kWarps j; tokens past
// n_tokens are not copied (their columns of the tile are never stored).
struct CopyPlan {
  uintptr_t wrow;   // the row's first block
  uint32_t wdst;    // the row's slot in stage 0 (shared-memory address)
  int wch;          // the thread's first chunk
  const __half* x;  // first token's chunk
  uint32_t xdst;    // its place in stage 0
  int x_count;      // tokens this thread copies
};

template <class Q, int kBN, int kWarps>
__device__ __forceinline__ CopyPlan copy_plan(const MmhArgs& a, int64_t row0, int tok0) {
  const int t = threadIdx.x, r = t % kBM;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(mmh_smem));
  CopyPlan p;
  p.wrow = reinterpret_cast<uintptr_t>(a.w) +
           static_cast<uint64_t>(std::min<int64_t>(row0 + r, a.n_out - 1)) * a.row_bytes;
  p.wch = t / kBM;
  p.wdst = base + r * Q::kWS;
  const int tok = tok0 + t / 32;
  p.x = a.xh + static_cast<int64_t>(min(tok, a.n_tokens - 1)) * a.n_in + 8 * (t % 32);
  p.xdst = base + kBM * Q::kWS + (t / 32) * kXS + 16 * (t % 32);
  p.x_count = tok < a.n_tokens ? (a.n_tokens - tok + kWarps - 1) / kWarps : 0;
  return p;
}

template <class Q, int kBN, int kWarps>
__device__ __forceinline__ void issue_step(const MmhArgs& a, const CopyPlan& p, int64_t step,
                                           int buf, bool weights, bool x) {
  using L = Layout<kWarps>;
  constexpr int kWChunks = w_chunks<Q>();
  const uint32_t off = buf * stage_bytes<Q, kBN>();
  if (weights) {
    const uintptr_t src = p.wrow + static_cast<uint64_t>(step) * Q::kBlock;
    const int m = static_cast<int>(src & 15);
    const uintptr_t al = src & ~uintptr_t{15};
#pragma unroll
    for (int k = 0; k < (kWChunks + L::kCS - 1) / L::kCS; ++k) {
      const int ch = p.wch + L::kCS * k;
      if (ch < kWChunks && 16 * ch < m + Q::kBlock)
        cp_async16(p.wdst + off + 16 * ch, reinterpret_cast<const void*>(al + 16 * ch));
    }
  }
  if (x) {
    const __half* src = p.x + step * kKStep;
    const int64_t stride = int64_t{kWarps} * a.n_in;
    constexpr int kJ = kBN / kWarps;
    if (p.x_count >= kJ) {
#pragma unroll
      for (int j = 0; j < kJ; ++j) cp_async16(p.xdst + off + kWarps * j * kXS, src + j * stride);
    } else {
#pragma unroll
      for (int j = 0; j < kJ; ++j)
        if (j < p.x_count) cp_async16(p.xdst + off + kWarps * j * kXS, src + j * stride);
    }
  }
}

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint2 b) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}

// One k16 step of the warp: its A tiles against every token's B fragment (xoff: the
// shared-memory offset of token g's fragment of this step).
template <int kMT, int kNT>
__device__ __forceinline__ void mma_step(float (&acc)[kMT][kNT][4], const uint32_t (&a)[kMT][4],
                                         int xoff) {
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    const uint2 b = *reinterpret_cast<const uint2*>(mmh_smem + xoff + 8 * nt * kXS);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) mma16816(acc[mt][nt], a[mt], b);
  }
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

// The lane's rows' byte offsets (in mmh_smem) of this stage's block: rows kWR warp + g + 8 i.
template <class Q, int kBN, int kWarps>
__device__ __forceinline__ void row_offsets(const MmhArgs& a, int64_t step, int buf, int64_t row0,
                                            int (&woff)[Layout<kWarps>::kRL]) {
  using L = Layout<kWarps>;
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;
#pragma unroll
  for (int i = 0; i < L::kRL; ++i) {
    const int r = L::kWR * warp + g + 8 * i;
    const uintptr_t src = reinterpret_cast<uintptr_t>(a.w) +
                          static_cast<uint64_t>(std::min<int64_t>(row0 + r, a.n_out - 1)) *
                              a.row_bytes +
                          static_cast<uint64_t>(step) * Q::kBlock;
    woff[i] = buf * stage_bytes<Q, kBN>() + r * Q::kWS + static_cast<int>(src & 15);
  }
}

// Q4_K: d, dmin, scales[12], qs[128]; Q5_K: the same with qh[32] before qs (bit j of qh[l]: bit
// 4 of level l of sub-block j). Rows 16-byte aligned (mmh_supports), so the block sits at the
// start of its slot.
template <class Q, int kBN, int kWarps>
__device__ __forceinline__ void compute_q45k(const MmhArgs& a, int64_t step, int buf, int64_t row0,
                                             float (&acc)[Layout<kWarps>::kMT][kBN / 8][4]) {
  using L = Layout<kWarps>;
  constexpr int kNT = kBN / 8, kRL = L::kRL;
  constexpr bool kQ5 = Q::kKind == Kind::kQ5K;
  constexpr int kQs = kQ5 ? 48 : 16;
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  int woff[kRL];
  row_offsets<Q, kBN, kWarps>(a, step, buf, row0, woff);
  const int xoff = buf * stage_bytes<Q, kBN>() + kBM * Q::kWS + g * kXS + 8 * c;
  // Scale and min of sub-blocks 2c (h = 0) and 2c + 1 (h = 1) of the lane's rows.
  __half2 sc[kRL][2], mn[kRL][2];
#pragma unroll
  for (int i = 0; i < kRL; ++i) {
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
    uint4 q[kRL];
#pragma unroll
    for (int i = 0; i < kRL; ++i)
      q[i] = *reinterpret_cast<const uint4*>(mmh_smem + woff[i] + kQs + 32 * c + 16 * u4);
#pragma unroll
    for (int uu = 0; uu < 4; ++uu) {
      uint32_t qh[kRL];  // Q5_K: the fifth bits of levels 4u..4u+3, bit j for sub-block j
      if constexpr (kQ5) {
#pragma unroll
        for (int i = 0; i < kRL; ++i) qh[i] = lds_u32(mmh_smem, woff[i] + 16 + 4 * (4 * u4 + uu));
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t af[L::kMT][4];
#pragma unroll
        for (int i = 0; i < kRL; ++i) {
          const uint32_t wd = uu == 0 ? q[i].x : uu == 1 ? q[i].y : uu == 2 ? q[i].z : q[i].w;
          __half2 lo, hi;
          if constexpr (kQ5) {
            const uint32_t v = ((wd >> (4 * h)) & 0x0F0F0F0Fu) |
                               (((qh[i] >> (2 * c + h)) & 0x01010101u) << 4);
            lo = __hsub2(levels_1024<0x00FF00FFu>(v), k1024);
            hi = __hsub2(levels_1024<0x00FF00FFu>(v >> 8), k1024);
          } else {
            const uint32_t v = wd >> (4 * h);
            lo = __hsub2(levels_1024<0x000F000Fu>(v), k1024);
            hi = __hsub2(levels_1024<0x000F000Fu>(v >> 8), k1024);
          }
          af[i / 2][i % 2] = as_u32(__hfma2(lo, sc[i][h], mn[i][h]));
          af[i / 2][2 + i % 2] = as_u32(__hfma2(hi, sc[i][h], mn[i][h]));
        }
        mma_step<L::kMT, kNT>(acc, af, xoff + 32 * (8 * h + 4 * u4 + uu));
      }
    }
  }
}

// Q6_K: ql[128], qh[64], scales[16] (int8), d; 210-byte blocks at any even offset. Sub-block
// 2c + h is quarter 2 (c % 2) + h of half c / 2: its level l from ql byte 64 (c / 2) + 32 h + l
// (nibble c % 2) and qh byte 32 (c / 2) + l (bits 4 (c % 2) + 2h..), scale byte 8 (c / 2) + 4
// (c % 2) + 2h + l / 16.
template <int kBN, int kWarps>
__device__ __forceinline__ void compute_q6k(const MmhArgs& a, int64_t step, int buf, int64_t row0,
                                            float (&acc)[Layout<kWarps>::kMT][kBN / 8][4]) {
  using L = Layout<kWarps>;
  constexpr int kNT = kBN / 8, kRL = L::kRL;
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  int woff[kRL];
  row_offsets<HQ6_K, kBN, kWarps>(a, step, buf, row0, woff);
  const int xoff = buf * stage_bytes<HQ6_K, kBN>() + kBM * HQ6_K::kWS + g * kXS + 8 * c;
  const int ql0 = 64 * (c / 2), qh0 = 128 + 32 * (c / 2), sc0 = 192 + 8 * (c / 2) + 4 * (c % 2);
  const int nib = 4 * (c % 2);
  float d[kRL];
#pragma unroll
  for (int i = 0; i < kRL; ++i)
    d[i] = __half2float(
        __ushort_as_half(static_cast<unsigned short>(lds_u16(mmh_smem, woff[i] + 208))));
  const __half2 k1056 = __float2half2_rn(1056.0f);
#pragma unroll
  for (int u4 = 0; u4 < 2; ++u4) {
    __half2 sc[kRL][2];
#pragma unroll
    for (int i = 0; i < kRL; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        sc[i][h] = __float2half2_rn(
            d[i] * static_cast<float>(static_cast<int8_t>(mmh_smem[woff[i] + sc0 + 2 * h + u4])));
#pragma unroll
    for (int uu = 0; uu < 4; ++uu) {
      const int u = 4 * u4 + uu;
      uint32_t qh[kRL];
#pragma unroll
      for (int i = 0; i < kRL; ++i) qh[i] = lds4_a2(mmh_smem, woff[i] + qh0 + 4 * u);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t af[L::kMT][4];
#pragma unroll
        for (int i = 0; i < kRL; ++i) {
          const uint32_t ql = lds4_a2(mmh_smem, woff[i] + ql0 + 32 * h + 4 * u);
          const uint32_t v =
              ((ql >> nib) & 0x0F0F0F0Fu) | (((qh[i] >> (nib + 2 * h)) & 0x03030303u) << 4);
          const __half2 lo = __hsub2(levels_1024<0x00FF00FFu>(v), k1056);
          const __half2 hi = __hsub2(levels_1024<0x00FF00FFu>(v >> 8), k1056);
          af[i / 2][i % 2] = as_u32(__hmul2(lo, sc[i][h]));
          af[i / 2][2 + i % 2] = as_u32(__hmul2(hi, sc[i][h]));
        }
        mma_step<L::kMT, kNT>(acc, af, xoff + 32 * (8 * h + u));
      }
    }
  }
}

// Q8_0: a stage is 8 blocks of d (f16) and 32 int8 levels, 34 bytes each at any even offset;
// sub-block 2c + h is block 2c + h. A level goes in as (q + 128) by flipping its sign bit, 1152
// comes off (exact), times d (exact in fp16): one rounding of the weight.
template <int kBN, int kWarps>
__device__ __forceinline__ void compute_q8_0(const MmhArgs& a, int64_t step, int buf, int64_t row0,
                                             float (&acc)[Layout<kWarps>::kMT][kBN / 8][4]) {
  using L = Layout<kWarps>;
  constexpr int kNT = kBN / 8, kRL = L::kRL;
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  int woff[kRL];
  row_offsets<HQ8_0, kBN, kWarps>(a, step, buf, row0, woff);
  const int xoff = buf * stage_bytes<HQ8_0, kBN>() + kBM * HQ8_0::kWS + g * kXS + 8 * c;
  __half2 d[kRL][2];
#pragma unroll
  for (int i = 0; i < kRL; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      d[i][h] = __half2half2(__ushort_as_half(
          static_cast<unsigned short>(lds_u16(mmh_smem, woff[i] + 34 * (2 * c + h)))));
  const __half2 k1152 = __float2half2_rn(1152.0f);
#pragma unroll
  for (int u = 0; u < 8; ++u) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t af[L::kMT][4];
#pragma unroll
      for (int i = 0; i < kRL; ++i) {
        const uint32_t v = lds4_a2(mmh_smem, woff[i] + 34 * (2 * c + h) + 2 + 4 * u) ^ 0x80808080u;
        const __half2 lo = __hsub2(levels_1024<0x00FF00FFu>(v), k1152);
        const __half2 hi = __hsub2(levels_1024<0x00FF00FFu>(v >> 8), k1152);
        af[i / 2][i % 2] = as_u32(__hmul2(lo, d[i][h]));
        af[i / 2][2 + i % 2] = as_u32(__hmul2(hi, d[i][h]));
      }
      mma_step<L::kMT, kNT>(acc, af, xoff + 32 * (8 * h + u));
    }
  }
}

// grid: (token tiles, row tiles, splits).
template <class Q, int kBN, int kWarps, int kS>
__global__ void __launch_bounds__(Layout<kWarps>::kThreads, kWarps == 8 ? 2 : 1)
    mmh_kernel(const MmhArgs a) {
  using L = Layout<kWarps>;
  constexpr int kNT = kBN / 8;
  const int tok0 = blockIdx.x * kBN;
  const int64_t row0 = int64_t{blockIdx.y} * kBM;
  const int split = blockIdx.z;
  const int64_t k0 = split * a.n_steps / a.splits, k1 = (split + 1) * a.n_steps / a.splits;
  const int64_t nk = k1 - k0;
  const CopyPlan plan = copy_plan<Q, kBN, kWarps>(a, row0, tok0);
  // The first stages' weights depend on no earlier kernel: their copies start before the wait.
#pragma unroll
  for (int st = 0; st < kS - 1; ++st)
    if (st < nk) issue_step<Q, kBN, kWarps>(a, plan, k0 + st, st, true, false);
  pdl_start();
#pragma unroll
  for (int st = 0; st < kS - 1; ++st) {
    if (st < nk) issue_step<Q, kBN, kWarps>(a, plan, k0 + st, st, false, true);
    tile::cp_async_commit();
  }

  float acc[L::kMT][kNT][4];
#pragma unroll
  for (int mt = 0; mt < L::kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

#pragma unroll 1
  for (int64_t i = 0; i < nk; ++i) {
    const int buf = static_cast<int>(i % kS);
    if (i + kS - 1 < nk)
      issue_step<Q, kBN, kWarps>(a, plan, k0 + i + kS - 1, static_cast<int>((i + kS - 1) % kS),
                                 true, true);
    tile::cp_async_commit();
    tile::cp_async_wait<kS - 1>();
    __syncthreads();
    if constexpr (Q::kKind == Kind::kQ6K) {
      compute_q6k<kBN, kWarps>(a, k0 + i, buf, row0, acc);
    } else if constexpr (Q::kKind == Kind::kQ8_0) {
      compute_q8_0<kBN, kWarps>(a, k0 + i, buf, row0, acc);
    } else {
      compute_q45k<Q, kBN, kWarps>(a, k0 + i, buf, row0, acc);
    }
    __syncthreads();
  }
  tile::cp_async_wait<0>();

  // acc[mt][nt][e]: row kWR warp + 16 mt + g + 8 (e / 2), token 8 nt + 2c + (e & 1).
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  float* out = a.splits > 1 ? a.partials + int64_t{split} * a.n_tokens * a.n_out : a.y;
#pragma unroll
  for (int mt = 0; mt < L::kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = row0 + L::kWR * warp + 16 * mt + g + 8 * (e / 2);
        const int tok = tok0 + 8 * nt + 2 * c + (e & 1);
        if (row < a.n_out && tok < a.n_tokens) out[tok * a.n_out + row] = acc[mt][nt][e];
      }
  if (a.splits == 1) return;
  tile::splitk_finish<kBM, kBN, L::kThreads, kMaxSplits>(
      a.y, a.partials, a.counters + blockIdx.y * gridDim.x + blockIdx.x, a.splits, a.n_out,
      a.n_tokens, row0, tok0);
}

// x -> fragment order (see the top): one thread per 4 outputs, one 16-byte load of 4
// consecutive inputs, stored as (0, 2, 1, 3).
__global__ void prepare_kernel(const float* x, __half* xh, int64_t n_quads, int64_t n_in) {
  pdl_start();
  const int64_t row_quads = n_in / 4;
  for (int64_t q = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; q < n_quads;
       q += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = q / row_quads;
    const int p = static_cast<int>(q - row * row_quads) * 4;  // position in the row
    const int pos = p % kKStep, s = pos / 16, c = pos / 4 % 4;
    const int64_t src = row * n_in + (p - pos) + 32 * (2 * c + s / 8) + 4 * (s % 8);
    const float4 v = *reinterpret_cast<const float4*>(x + src);
    const __half2 lo = __floats2half2_rn(v.x, v.z), hi = __floats2half2_rn(v.y, v.w);
    *reinterpret_cast<uint2*>(xh + 4 * q) = make_uint2(as_u32(lo), as_u32(hi));
  }
}

constexpr int kWarps = 8;   // 8 warps of 16 rows (Tiling, above)
constexpr int kStages = 2;  // 3 at 16-token tiles measured slower (docs/performance.md)

template <class Q, int kBN, int kWarps, int kS>
void launch_bn(MmhArgs a, const MmqScratch& scratch, cudaStream_t s) {
  static const bool attr_ok = cudaFuncSetAttribute(mmh_kernel<Q, kBN, kWarps, kS>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   smem_bytes<Q, kBN, kS>()) == cudaSuccess;
  if (!attr_ok) return;
  const int64_t tok_tiles = (a.n_tokens + kBN - 1) / kBN;
  const int64_t row_tiles = (a.n_out + kBM - 1) / kBM;
  const int64_t tiles = tok_tiles * row_tiles;
  // CTAs resident per SM: shared-memory bound (1 to 3; 1 KiB of each CTA's is the system's).
  const int per_sm =
      std::max(1, std::min(3, (228 << 10) / (smem_bytes<Q, kBN, kS>() + 1024)));
  const int splits = tile::splitk_count(tiles, per_sm, a.n_steps, int64_t{a.n_tokens} * a.n_out,
                                        scratch.splits, kMaxSplits, scratch.partials,
                                        scratch.partial_floats, scratch.n_counters);
  a.splits = splits;
  a.partials = scratch.partials;
  a.counters = scratch.counters;
  const dim3 grid(static_cast<unsigned>(tok_tiles), static_cast<unsigned>(row_tiles),
                  static_cast<unsigned>(splits));
  launch_pdl(mmh_kernel<Q, kBN, kWarps, kS>, grid, dim3(Layout<kWarps>::kThreads),
             static_cast<size_t>(smem_bytes<Q, kBN, kS>()), s, a);
}

template <class Q>
void launch_type(const MmhArgs& a, const MmqScratch& scratch, cudaStream_t s) {
  const int bn = scratch.tile_tokens > 0 ? scratch.tile_tokens
                 : a.n_tokens <= 16      ? 16
                 : a.n_tokens <= 32      ? 32
                                         : 64;
  if (bn <= 16) {
    launch_bn<Q, 16, kWarps, kStages>(a, scratch, s);
  } else if (bn <= 32) {
    launch_bn<Q, 32, kWarps, kStages>(a, scratch, s);
  } else {
    launch_bn<Q, 64, kWarps, kStages>(a, scratch, s);
  }
}

}  // namespace

bool mmh_supports(const Weight& w) {
  if (w.n_in % kKStep != 0) return false;
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
  const int blocks = static_cast<int>(std::min<int64_t>((n_quads + 255) / 256, 4 * tile::sm_count()));
  launch_pdl(prepare_kernel, dim3(blocks), dim3(256), 0, s, x, xh, n_quads, n_in);
}

void mmh(const Weight& w, float* y, const __half* xh, int64_t n_tokens, const MmqScratch& scratch,
         cudaStream_t s) {
  if (n_tokens <= 0 || w.n_out <= 0 || !mmh_supports(w)) return;
  MmhArgs a{};
  a.w = w.data;
  a.row_bytes = w.row_bytes;
  a.n_out = w.n_out;
  a.n_in = w.n_in;
  a.n_steps = w.n_in / kKStep;
  a.y = y;
  a.xh = xh;
  a.n_tokens = static_cast<int>(n_tokens);
  switch (w.type) {
    case quant::Type::Q4_K:
      launch_type<HQ4_K>(a, scratch, s);
      break;
    case quant::Type::Q5_K:
      launch_type<HQ5_K>(a, scratch, s);
      break;
    case quant::Type::Q6_K:
      launch_type<HQ6_K>(a, scratch, s);
      break;
    default:
      launch_type<HQ8_0>(a, scratch, s);
      break;
  }
}

}  // namespace kiln::backend::cuda
