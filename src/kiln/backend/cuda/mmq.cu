// Batched quantized matmul (9..~256 tokens): int8 tensor-core MMA on the weights as stored.
//
// y[t][o] = sum_i W[o][i] x[t][i] with x quantized per 32 values as quantize_q8_32 does (levels
// xq, pairs (d, d * level sum) xds: matvec.cu) and W read in place (Q4_0, Q8_0, Q4_K, Q5_K,
// Q6_K). The result is the exact weights' dot product with the rounded activations, as the
// int8 matvec and kiln's CPU kernels compute it, up to fp32 summation.
//
// Tiling. A CTA of 8 warps owns 64 weight rows x kBN tokens (16, 32 or 64; chosen by the token
// count) over a range of K (split-K when the tiles alone would leave SMs idle). K advances 256
// values per step (one K-quant super-block, 8 Q4_0/Q8_0 blocks): each step's weight bytes (64
// rows, copied as the 16-byte aligned span that covers them, since a 210-byte Q6_K block or a
// 34-byte Q8_0 block sits at any even offset), int8 activations (kBN x 256) and their (d, sum)
// pairs land in shared memory by cp.async, 2-3 stages deep. The CTA then decodes the step's
// weight scales (and Q4_K/Q5_K mins) once into a float table; warp (m, n) owns rows
// 16m..16m+16 and half the tile's tokens, and unpacks its rows' levels in registers straight
// from the stored bytes.
//
// MMA. mma.sync m16n8k32 s8 x s8 -> s32 per group of 32 values (one activation scale, one
// weight scale): the A fragment (16 rows x 32) is unpacked from the block (nibbles masked and
// offset to signed bytes: Q4_0 q - 8, Q6_K q - 32; Q4_K/Q5_K levels stay unsigned, their min
// goes to the epilogue), the B fragment (32 x 8 tokens) is one 8-byte shared load per lane:
// lane quad c supplies values 8c..8c+7 of the group to both operands (a permutation of k
// inside the group, which the sum does not see). Q6_K has a scale per 16 values: two m16n8k16
// MMAs per group, combined in int32 with the two int8 scales.
//
// Epilogue per group, per output (row r, token t): acc += float(C) * (scale_w[r] * d_x[t])
// (- min_w[r] * sum_x[t] for Q4_K/Q5_K), in fp32: ~5 instructions per output per 32 values,
// against one MMA for 128 outputs, so the kernel is bound by this arithmetic, not the tensor
// cores (docs/performance.md: 70-110 int8 TOPS on the H200 at 64-256 tokens). Split-K partials go
// to scratch; the last CTA of a tile to arrive (a counter per tile, reset by that CTA) sums them in
// split order, so the result does not depend on the order the CTAs ran in.
//
// Grouped (mmq_id, MoE experts): the same kernel with kId set. A CTA's tile is (row tile,
// tile slot); a slot is a run of up to kBN pairs of one expert, planned on the device into a
// tile list (matmul.cu moe_plan_kernel). The CTA reads the slot once: its weights start at w +
// expert * expert_bytes, B row j is int8 row x_rows[perm[start + j]] (rows past the run's count
// repeat its last row, and their outputs are not written), output row j is pair perm[start + j]
// of y. The row indices sit in shared memory for the cp.async issue and the epilogue; nothing
// else differs, so a pair's result does not depend on the tile width or the other pairs. No
// split-K: a prefill's tiles fill the GPU many times over.
#include <cuda_fp16.h>

#include <algorithm>

#include "kiln/backend/cuda/device.h"
#include "kiln/backend/cuda/mmq.h"
#include "kiln/backend/cuda/pdl.cuh"
#include "kiln/backend/cuda/tile_common.cuh"

namespace kiln::backend::cuda {

namespace {

constexpr int kWarpsM = 4;         // warps along the rows: 16 rows each
constexpr int kWarpsN = 2;         // warps along the tokens: half the tile's tokens each
constexpr int kBM = 16 * kWarpsM;  // weight rows per CTA
constexpr int kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kKStep = 256;  // values of K per pipeline stage
constexpr int kMaxSplits = 8;

using tile::cp_async16;
using tile::cp_async8;
using tile::cp_async_commit;
using tile::cp_async_wait;

extern __shared__ __align__(16) uint8_t mmq_smem[];

// Shared-memory reads at a byte offset into mmq_smem (tile_common.cuh's).
__device__ __forceinline__ uint32_t lds_u32(int off) {  // 4-byte aligned
  return tile::lds_u32(mmq_smem, off);
}
__device__ __forceinline__ uint32_t lds_u16(int off) {
  return tile::lds_u16(mmq_smem, off);
}
// 4 / 8 bytes at a 2-byte aligned offset: aligned words shifted into place.
__device__ __forceinline__ uint32_t lds4_a2(int off) {
  return tile::lds4_a2(mmq_smem, off);
}
__device__ __forceinline__ uint2 lds8_a2(int off) {
  const int a = off & ~3;
  const uint32_t sh = (off & 3) * 8;
  const uint32_t w0 = lds_u32(a), w1 = lds_u32(a + 4), w2 = lds_u32(a + 8);
  return make_uint2(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh));
}
__device__ __forceinline__ float lds_half(int off) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(lds_u16(off))));
}
// Bytes 0..15 minus 8 / 0..63 minus 32, four per word, as signed bytes (no carries: the sums
// stay under 0x100 per byte).
__device__ __forceinline__ uint32_t minus8(uint32_t v) {
  return (v + 0x78787878u) ^ 0x80808080u;
}
__device__ __forceinline__ uint32_t minus32(uint32_t v) {
  return (v + 0x60606060u) ^ 0x80808080u;
}
// int -> float for |v| < 2^22, exactly, on the integer and FP32 pipes (I2F issues at a
// sixteenth of the FP32 rate): the bits of 1.5 * 2^23 + v, less 1.5 * 2^23.
__device__ __forceinline__ float small_int_to_f32(int v) {
  return __int_as_float(0x4B400000 + v) - 12582912.0f;
}

// Weight types. kChunk: bytes of one row per K step; group j (0..7) of a step is 32 values.
// frag(off, j, c): values 8c..8c+7 of group j as signed bytes (two words); scale(off, j):
// (scale, min) of group j so that value = scale * level - min. off: the step's bytes of the
// row in shared memory (2-byte aligned).
struct MQ8_0 {  // 8 blocks: d (f16), qs[32]
  static constexpr int kChunk = 8 * 34;
  static constexpr bool kMin = false, kPerBlock = true;
  __device__ static uint2 frag(int off, int j, int c) { return lds8_a2(off + 34 * j + 2 + 8 * c); }
  __device__ static float2 scale(int off, int j) { return make_float2(lds_half(off + 34 * j), 0); }
};
struct MQ4_0 {  // 8 blocks: d, qs[16] (value i < 16: low nibble of qs[i]; 16 + i: high); - 8
  static constexpr int kChunk = 8 * 18;
  static constexpr bool kMin = false, kPerBlock = true;
  __device__ static uint2 frag(int off, int j, int c) {
    const uint2 v = lds8_a2(off + 18 * j + 2 + 8 * (c & 1));
    const int s = 4 * (c >> 1);
    return make_uint2(minus8((v.x >> s) & 0x0F0F0F0Fu), minus8((v.y >> s) & 0x0F0F0F0Fu));
  }
  __device__ static float2 scale(int off, int j) { return make_float2(lds_half(off + 18 * j), 0); }
};
// The 6-bit scale and min of sub-block j of a K-quant's 12 scale bytes (at off + 4).
__device__ __forceinline__ float2 k4_scale_min(int off, int j) {
  const uint32_t dd = lds4_a2(off);
  const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(dd & 0xffffu)));
  const float dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(dd >> 16)));
  const int sh = 8 * (j & 3);
  uint32_t sc, m;
  if (j < 4) {
    const uint32_t s0 = lds4_a2(off + 4), s1 = lds4_a2(off + 8);
    sc = (s0 >> sh) & 63;
    m = (s1 >> sh) & 63;
  } else {
    const uint32_t s0 = lds4_a2(off + 4), s1 = lds4_a2(off + 8), s2 = lds4_a2(off + 12);
    sc = ((s2 >> sh) & 0xf) | (((s0 >> sh) >> 6 & 3) << 4);
    m = ((s2 >> sh) >> 4 & 0xf) | (((s1 >> sh) >> 6 & 3) << 4);
  }
  return make_float2(d * static_cast<float>(sc), dmin * static_cast<float>(m));
}
// Q4_K: d, dmin, scales[12], qs[128]: sub-block 2p is the low nibbles of qs[32p..32p+32], 2p+1
// the high ones. Q5_K adds qh[32] after the scales: bit j of qh[l] is bit 4 of value l of
// sub-block j.
template <bool kQ5>
struct MK45 {
  static constexpr int kChunk = kQ5 ? 176 : 144;
  static constexpr bool kMin = true, kPerBlock = false;
  __device__ static uint2 frag(int off, int j, int c) {
    const uint2 v = lds8_a2(off + (kQ5 ? 48 : 16) + 32 * (j / 2) + 8 * c);
    const int s = 4 * (j & 1);
    uint2 q = make_uint2((v.x >> s) & 0x0F0F0F0Fu, (v.y >> s) & 0x0F0F0F0Fu);
    if constexpr (kQ5) {
      const uint2 h = lds8_a2(off + 16 + 8 * c);
      q.x |= ((h.x >> j) & 0x01010101u) << 4;
      q.y |= ((h.y >> j) & 0x01010101u) << 4;
    }
    return q;
  }
  __device__ static float2 scale(int off, int j) { return k4_scale_min(off, j); }
};
// Q6_K: ql[128], qh[64], scales[16] (int8), d. Group j = 4h + q (h half, q quarter), value l
// < 32: low 4 bits from ql[64h + 32(q%2) + l] (low nibble for q < 2, high for q >= 2), high 2
// bits from qh[32h + l] >> 2q, minus 32; scale scales[8h + 2q + l/16] (one per 16 values).
// frag16(off, j, c, half): values 16 half + 4c..+4 (the m16n8k16 layout).
struct MQ6_K {
  static constexpr int kChunk = 210;
  static constexpr bool kMin = false, kPerBlock = false;
  __device__ static uint32_t frag16(int off, int j, int c, int half) {
    const int h = j / 4, q = j % 4, l = 16 * half + 4 * c;
    const uint32_t lo = (lds4_a2(off + 64 * h + 32 * (q & 1) + l) >> (4 * (q >> 1))) & 0x0F0F0F0Fu;
    const uint32_t hi = (lds4_a2(off + 128 + 32 * h + l) >> (2 * q)) & 0x03030303u;
    return minus32(lo | (hi << 4));
  }
  __device__ static int scale16(int off, int j, int half) {
    return static_cast<int8_t>(mmq_smem[off + 192 + 8 * (j / 4) + 2 * (j % 4) + half]);
  }
  __device__ static float d(int off) { return lds_half(off + 208); }
};

template <class Q>
constexpr bool is_q6k() {
  return Q::kChunk == 210;
}

__device__ __forceinline__ void mma_k32(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}
__device__ __forceinline__ void mma_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%7,%7,%7,%7};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

template <class Q>
constexpr int w_stride() {  // a row's slot: the 16-byte span covering kChunk at any offset
  return (Q::kChunk + 15) / 16 * 16 + 16;
}
template <class Q>
constexpr int x_stride() {
  // 256 levels + padding that keeps a warp's B loads free of bank conflicts: 8-byte loads
  // (rows 72 words apart) for the k32 types, 4-byte loads (68 words) for Q6_K.
  return is_q6k<Q>() ? 256 + 16 : 256 + 32;
}
template <class Q, int kBN>
constexpr int stage_bytes() {
  return kBM * w_stride<Q>() + kBN * x_stride<Q>() + 8 * kBN * 8;
}
template <int kBN>
constexpr int num_stages() {
  return kBN >= 64 ? 2 : 3;
}
template <class Q, int kBN>
constexpr int smem_bytes() {  // the stages, then the scale table [kBM][8] (float2)
  return num_stages<kBN>() * stage_bytes<Q, kBN>() + kBM * 8 * 8;
}

struct MmqArgs {
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t n_out;
  int64_t n_in;
  int64_t n_groups;   // n_in / 32
  int64_t n_steps;    // ceil(n_in / 256)
  float* y;           // [n_tokens, n_out]
  const int8_t* xq;   // [n_tokens, n_in]
  const float2* xds;  // [n_tokens, n_in / 32]
  int n_tokens;
  int splits;
  float* partials;  // [splits, n_tokens, n_out] when splits > 1
  int* counters;    // one per (token tile, row tile), zero between launches
  // Grouped (mmq_id, kId): tile slot i (blockIdx.y) is expert tiles[3i] (weights at w + e *
  // expert_bytes) and pairs perm[tiles[3i + 1] + j], j < tiles[3i + 2] <= kBN; its B row j is
  // row x_rows[pair] of xq, its output row j is y[pair]. Slots past *num_tiles are empty.
  uint64_t expert_bytes;
  const int32_t* tiles;
  const int32_t* num_tiles;
  const int32_t* perm;
  const int32_t* x_rows;
};

// xrows: the tile's kBN activation rows (shared memory) when kId; else rows tok0.. (clamped).
template <class Q, int kBN, bool kId>
__device__ __forceinline__ void issue_step(const MmqArgs& a, const uint8_t* w, const int* xrows,
                                           int64_t step, int buf, int64_t row0, int tok0) {
  constexpr int kWS = w_stride<Q>(), kXS = x_stride<Q>();
  constexpr int kWChunks = kWS / 16;
  const uint32_t base =
      static_cast<uint32_t>(__cvta_generic_to_shared(mmq_smem)) + buf * stage_bytes<Q, kBN>();
  const uint32_t xbase = base + kBM * kWS, dsbase = xbase + kBN * kXS;
  const int groups = static_cast<int>(std::min<int64_t>(8, a.n_groups - step * 8));
  const int wbytes = Q::kPerBlock ? groups * (Q::kChunk / 8) : Q::kChunk;
  for (int i = threadIdx.x; i < kBM * kWChunks; i += kThreads) {
    const int r = i / kWChunks, ch = i % kWChunks;
    const int64_t row = std::min<int64_t>(row0 + r, a.n_out - 1);
    const uintptr_t src = reinterpret_cast<uintptr_t>(w) + row * a.row_bytes + step * Q::kChunk;
    const int m = static_cast<int>(src & 15);
    if (16 * ch < m + wbytes)
      cp_async16(base + r * kWS + 16 * ch,
                 reinterpret_cast<const void*>((src & ~uintptr_t{15}) + 16 * ch));
  }
  for (int i = threadIdx.x; i < kBN * 16; i += kThreads) {
    const int t = i / 16, ch = i % 16;
    const int64_t tok = kId ? xrows[t] : min(tok0 + t, a.n_tokens - 1);
    if (ch < 2 * groups)
      cp_async16(xbase + t * kXS + 16 * ch, a.xq + tok * a.n_in + step * kKStep + 16 * ch);
  }
  for (int i = threadIdx.x; i < kBN * 8; i += kThreads) {
    const int j = i / kBN, t = i % kBN;
    const int64_t tok = kId ? xrows[t] : min(tok0 + t, a.n_tokens - 1);
    if (j < groups) cp_async8(dsbase + (j * kBN + t) * 8, a.xds + tok * a.n_groups + step * 8 + j);
  }
}

// The step's weight scales, once per CTA: (scale, min) of each row's 8 groups into the scale
// table (Q6_K: d alone, in [r][0]; its int8 scales are read where they are used).
template <class Q, int kBN>
__device__ __forceinline__ void prep_step(const MmqArgs& a, const uint8_t* w, int64_t step, int buf,
                                          int64_t row0) {
  constexpr int kWS = w_stride<Q>();
  const int sbase = buf * stage_bytes<Q, kBN>();
  float2* table = reinterpret_cast<float2*>(mmq_smem + num_stages<kBN>() * stage_bytes<Q, kBN>());
  const int groups = static_cast<int>(std::min<int64_t>(8, a.n_groups - step * 8));
  for (int i = threadIdx.x; i < kBM * 8; i += kThreads) {
    const int r = i / 8, j = i % 8;
    if (j >= groups) continue;
    const int64_t row = std::min<int64_t>(row0 + r, a.n_out - 1);
    const uintptr_t src = reinterpret_cast<uintptr_t>(w) + row * a.row_bytes + step * Q::kChunk;
    const int off = sbase + r * kWS + static_cast<int>(src & 15);
    if constexpr (is_q6k<Q>()) {
      if (j == 0) table[8 * r] = make_float2(Q::d(off), 0.0f);
    } else {
      table[i] = Q::scale(off, j);
    }
  }
}

// acc[nt][e] for n-tile nt: e = 0 (row g, token 2c), 1 (g, 2c + 1), 2 (g + 8, 2c), 3 (g + 8,
// 2c + 1), with g = lane / 4, c = lane % 4.
template <class Q, int kBN>
__device__ __forceinline__ void compute_step(const MmqArgs& a, const uint8_t* w, int64_t step,
                                             int buf, int64_t row0,
                                             float (&acc)[kBN / 8 / kWarpsN][4]) {
  constexpr int kNT = kBN / 8 / kWarpsN, kWS = w_stride<Q>(), kXS = x_stride<Q>();
  const int warp = threadIdx.x / 32 % kWarpsM, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int t0 = threadIdx.x / 32 / kWarpsM * (kBN / kWarpsN);  // the warp's first token
  const int sbase = buf * stage_bytes<Q, kBN>();
  const int xbase = sbase + kBM * kWS, dsbase = xbase + kBN * kXS;
  const float2* table =
      reinterpret_cast<const float2*>(mmq_smem + num_stages<kBN>() * stage_bytes<Q, kBN>());
  // The two rows' bytes of this step: their slots, offset by where the copied span began.
  int woff[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * warp + g + 8 * h;
    const int64_t row = std::min<int64_t>(row0 + r, a.n_out - 1);
    const uintptr_t src = reinterpret_cast<uintptr_t>(w) + row * a.row_bytes + step * Q::kChunk;
    woff[h] = sbase + r * kWS + static_cast<int>(src & 15);
  }
  const int groups = static_cast<int>(std::min<int64_t>(8, a.n_groups - step * 8));
  // Group j's integer dot products: cm[nt][e] as acc.
  auto mma_group = [&](int j, int(&cm)[kNT][4]) {
    if constexpr (is_q6k<Q>()) {
      const uint32_t a0 = Q::frag16(woff[0], j, c, 0), a1 = Q::frag16(woff[1], j, c, 0);
      const uint32_t a2 = Q::frag16(woff[0], j, c, 1), a3 = Q::frag16(woff[1], j, c, 1);
      const int sa0 = Q::scale16(woff[0], j, 0), sb0 = Q::scale16(woff[0], j, 1);
      const int sa1 = Q::scale16(woff[1], j, 0), sb1 = Q::scale16(woff[1], j, 1);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int xo = xbase + (t0 + 8 * nt + g) * kXS + 32 * j + 4 * c;
        int lo[4], hi[4];
        mma_k16(lo, a0, a1, lds_u32(xo));
        mma_k16(hi, a2, a3, lds_u32(xo + 16));
        cm[nt][0] = sa0 * lo[0] + sb0 * hi[0];
        cm[nt][1] = sa0 * lo[1] + sb0 * hi[1];
        cm[nt][2] = sa1 * lo[2] + sb1 * hi[2];
        cm[nt][3] = sa1 * lo[3] + sb1 * hi[3];
      }
    } else {
      const uint2 f0 = Q::frag(woff[0], j, c), f1 = Q::frag(woff[1], j, c);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const uint2 b = *reinterpret_cast<const uint2*>(mmq_smem + xbase + (t0 + 8 * nt + g) * kXS +
                                                        32 * j + 8 * c);
        mma_k32(cm[nt], f0.x, f1.x, f0.y, f1.y, b.x, b.y);
      }
    }
  };
  // Group j's scales applied: acc += C * scale_w * d_x (- min_w * sum_x).
  auto epilogue_group = [&](int j, const int(&cm)[kNT][4]) {
    const float2 sc0 = table[8 * (16 * warp + g) + (is_q6k<Q>() ? 0 : j)];
    const float2 sc1 = table[8 * (16 * warp + g + 8) + (is_q6k<Q>() ? 0 : j)];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      // (d, d * sum) of tokens 2c and 2c + 1 of the n-tile, group j
      const float4 ds =
          *reinterpret_cast<const float4*>(mmq_smem + dsbase + (j * kBN + t0 + 8 * nt + 2 * c) * 8);
      float f[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (is_q6k<Q>()) {
          f[e] = __int2float_rn(cm[nt][e]);  // up to 2^24: past small_int_to_f32's range
        } else {
          f[e] = small_int_to_f32(cm[nt][e]);
        }
      }
      acc[nt][0] = fmaf(f[0], sc0.x * ds.x, acc[nt][0]);
      acc[nt][1] = fmaf(f[1], sc0.x * ds.z, acc[nt][1]);
      acc[nt][2] = fmaf(f[2], sc1.x * ds.x, acc[nt][2]);
      acc[nt][3] = fmaf(f[3], sc1.x * ds.z, acc[nt][3]);
      if constexpr (Q::kMin) {
        acc[nt][0] = fmaf(-sc0.y, ds.y, acc[nt][0]);
        acc[nt][1] = fmaf(-sc0.y, ds.w, acc[nt][1]);
        acc[nt][2] = fmaf(-sc1.y, ds.y, acc[nt][2]);
        acc[nt][3] = fmaf(-sc1.y, ds.w, acc[nt][3]);
      }
    }
  };
  // kGB groups' MMAs are issued before their epilogues, so the tensor cores' latency overlaps
  // independent work (32 registers of integer results in every tiling).
  constexpr int kGB = kNT >= 4 ? 2 : kNT == 2 ? 4 : 8;
#pragma unroll
  for (int j0 = 0; j0 < 8; j0 += kGB) {
    if (j0 >= groups) break;
    int cm[kGB][kNT][4];
#pragma unroll
    for (int jj = 0; jj < kGB; ++jj)
      if (j0 + jj < groups) mma_group(j0 + jj, cm[jj]);
#pragma unroll
    for (int jj = 0; jj < kGB; ++jj)
      if (j0 + jj < groups) epilogue_group(j0 + jj, cm[jj]);
  }
}

// grid: (token tiles, row tiles, splits); kId: (row tiles, tile slots), one split.
template <class Q, int kBN, bool kId>
__global__ void __launch_bounds__(kThreads, 2) mmq_kernel(const MmqArgs a) {
  constexpr int kNT = kBN / 8 / kWarpsN, kS = num_stages<kBN>();
  // kId: the tile's activation rows and output rows (pair indices), padding repeating the last.
  __shared__ int s_xrow[kId ? kBN : 1], s_yrow[kId ? kBN : 1];
  const uint8_t* w = a.w;
  int tok0 = 0, n_valid = a.n_tokens;
  int64_t row0, k0 = 0, k1 = a.n_steps;
  int split = 0;
  if constexpr (kId) {
    row0 = int64_t{blockIdx.x} * kBM;
    pdl_start();  // the tile list and the activations are the previous kernels' output
    const int tile = blockIdx.y;
    if (tile >= *a.num_tiles) return;
    w += static_cast<uint64_t>(a.tiles[3 * tile]) * a.expert_bytes;
    const int start = a.tiles[3 * tile + 1];
    n_valid = a.tiles[3 * tile + 2];
    for (int t = threadIdx.x; t < kBN; t += kThreads) {
      const int p = a.perm[start + min(t, n_valid - 1)];
      s_xrow[t] = a.x_rows[p];
      s_yrow[t] = p;
    }
    __syncthreads();
  } else {
    tok0 = blockIdx.x * kBN;
    row0 = int64_t{blockIdx.y} * kBM;
    split = blockIdx.z;
    k0 = split * a.n_steps / a.splits;
    k1 = (split + 1) * a.n_steps / a.splits;
    pdl_start();
  }
  const int64_t nk = k1 - k0;

  float acc[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
    if (s < nk) issue_step<Q, kBN, kId>(a, w, s_xrow, k0 + s, s, row0, tok0);
    cp_async_commit();
  }
#pragma unroll 1
  for (int64_t i = 0; i < nk; ++i) {
    if (i + kS - 1 < nk)
      issue_step<Q, kBN, kId>(a, w, s_xrow, k0 + i + kS - 1, (i + kS - 1) % kS, row0, tok0);
    cp_async_commit();
    cp_async_wait<kS - 1>();
    __syncthreads();
    prep_step<Q, kBN>(a, w, k0 + i, static_cast<int>(i % kS), row0);
    __syncthreads();
    compute_step<Q, kBN>(a, w, k0 + i, static_cast<int>(i % kS), row0, acc);
    __syncthreads();
  }
  cp_async_wait<0>();

  const int warp = threadIdx.x / 32 % kWarpsM, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int wtok0 = tok0 + threadIdx.x / 32 / kWarpsM * (kBN / kWarpsN);
  float* out = !kId && a.splits > 1 ? a.partials + int64_t{split} * a.n_tokens * a.n_out : a.y;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = row0 + 16 * warp + g + 8 * (e / 2);
      const int tok = wtok0 + 8 * nt + 2 * c + (e & 1);
      if (row < a.n_out && tok < n_valid) {
        const int64_t y_row = kId ? s_yrow[tok] : tok;
        out[y_row * a.n_out + row] = acc[nt][e];
      }
    }
  if (kId || a.splits == 1) return;

  // Split-K: the tile's last CTA to finish adds the partials in split order.
  tile::splitk_finish<kBM, kBN, kThreads, kMaxSplits>(
      a.y, a.partials, a.counters + blockIdx.y * gridDim.x + blockIdx.x, a.splits, a.n_out,
      a.n_tokens, row0, tok0);
}

template <class Q, int kBN>
void launch_bn(MmqArgs a, int64_t partial_floats, int64_t n_counters, int force_splits,
               cudaStream_t s) {
  static const bool attr_ok =
      cudaFuncSetAttribute(mmq_kernel<Q, kBN, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           smem_bytes<Q, kBN>()) == cudaSuccess;
  if (!attr_ok) return;
  const int64_t tok_tiles = (a.n_tokens + kBN - 1) / kBN;
  const int64_t row_tiles = (a.n_out + kBM - 1) / kBM;
  const int64_t tiles = tok_tiles * row_tiles;
  // CTAs resident per SM: smem-bound (2 or 3 at most here).
  const int per_sm = std::max(1, std::min(2, (227 << 10) / smem_bytes<Q, kBN>()));
  a.splits = tile::splitk_count(tiles, per_sm, a.n_steps, int64_t{a.n_tokens} * a.n_out,
                                force_splits, kMaxSplits, a.partials, partial_floats, n_counters);
  const int splits = a.splits;
  const dim3 grid(static_cast<unsigned>(tok_tiles), static_cast<unsigned>(row_tiles),
                  static_cast<unsigned>(splits));
  launch_pdl(mmq_kernel<Q, kBN, false>, grid, dim3(kThreads),
             static_cast<size_t>(smem_bytes<Q, kBN>()), s, a);
}

// The grouped kernel: every tile slot a CTA column (empty slots return at once), no split-K
// (the tiles of a prefill fill the GPU many times over).
template <class Q, int kBN>
void launch_id_bn(const MmqArgs& a, int64_t tile_slots, cudaStream_t s) {
  static const bool attr_ok =
      cudaFuncSetAttribute(mmq_kernel<Q, kBN, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           smem_bytes<Q, kBN>()) == cudaSuccess;
  if (!attr_ok) return;
  // Row tiles along x: the CTAs of one tile (one expert's weights, one set of activation rows)
  // are launched together, so the tile's activations are read from L2 after the first.
  const dim3 grid(static_cast<unsigned>((a.n_out + kBM - 1) / kBM),
                  static_cast<unsigned>(tile_slots));
  launch_pdl(mmq_kernel<Q, kBN, true>, grid, dim3(kThreads),
             static_cast<size_t>(smem_bytes<Q, kBN>()), s, a);
}

template <class Q>
void launch_id_type(const MmqArgs& a, int64_t tile_slots, int tile_pairs, cudaStream_t s) {
  if (tile_pairs <= 16) {
    launch_id_bn<Q, 16>(a, tile_slots, s);
  } else if (tile_pairs <= 32) {
    launch_id_bn<Q, 32>(a, tile_slots, s);
  } else {
    launch_id_bn<Q, 64>(a, tile_slots, s);
  }
}

template <class Q>
void launch_type(const MmqArgs& a, int64_t partial_floats, int64_t n_counters, int bn,
                 int force_splits, cudaStream_t s) {
  if (bn == 0) bn = a.n_tokens <= 16 ? 16 : a.n_tokens <= 32 ? 32 : 64;
  if (bn <= 16) {
    launch_bn<Q, 16>(a, partial_floats, n_counters, force_splits, s);
  } else if (bn <= 32) {
    launch_bn<Q, 32>(a, partial_floats, n_counters, force_splits, s);
  } else {
    launch_bn<Q, 64>(a, partial_floats, n_counters, force_splits, s);
  }
}

}  // namespace

bool mmq_supports(const Weight& w) {
  switch (w.type) {
    case quant::Type::Q8_0:
    case quant::Type::Q4_0:
      return w.n_in % 32 == 0;
    case quant::Type::Q4_K:
    case quant::Type::Q5_K:
    case quant::Type::Q6_K:
      return w.n_in % 256 == 0;
    default:
      return false;
  }
}

namespace {
// The weight's and the activations' part of a launch (mmq and mmq_id alike).
MmqArgs mmq_args(const Weight& w, float* y, const int8_t* xq, const float2* xds) {
  MmqArgs a{};
  a.w = w.data;
  a.row_bytes = w.row_bytes;
  a.n_out = w.n_out;
  a.n_in = w.n_in;
  a.n_groups = w.n_in / 32;
  a.n_steps = (w.n_in + kKStep - 1) / kKStep;
  a.y = y;
  a.xq = xq;
  a.xds = xds;
  return a;
}
}  // namespace

void mmq(const Weight& w, float* y, const int8_t* xq, const float2* xds, int64_t n_tokens,
         const MmqScratch& scratch, cudaStream_t s) {
  if (n_tokens <= 0 || w.n_out <= 0 || !mmq_supports(w)) return;
  MmqArgs a = mmq_args(w, y, xq, xds);
  a.n_tokens = static_cast<int>(n_tokens);
  a.partials = scratch.partials;
  a.counters = scratch.counters;
  const int bn = scratch.tile_tokens, sp = scratch.splits;
  switch (w.type) {
    case quant::Type::Q8_0:
      launch_type<MQ8_0>(a, scratch.partial_floats, scratch.n_counters, bn, sp, s);
      break;
    case quant::Type::Q4_0:
      launch_type<MQ4_0>(a, scratch.partial_floats, scratch.n_counters, bn, sp, s);
      break;
    case quant::Type::Q4_K:
      launch_type<MK45<false>>(a, scratch.partial_floats, scratch.n_counters, bn, sp, s);
      break;
    case quant::Type::Q5_K:
      launch_type<MK45<true>>(a, scratch.partial_floats, scratch.n_counters, bn, sp, s);
      break;
    case quant::Type::Q6_K:
      launch_type<MQ6_K>(a, scratch.partial_floats, scratch.n_counters, bn, sp, s);
      break;
    default:
      break;
  }
}

int mmq_id_tile_pairs(int64_t n_pairs, int64_t n_expert) {
  const int64_t per_expert = n_pairs / std::max<int64_t>(1, n_expert);
  return per_expert < 24 ? 16 : per_expert < 48 ? 32 : 64;
}

void mmq_id(const Weight& stacked, float* y, const int8_t* xq, const float2* xds,
            const MmqIdTiles& t, cudaStream_t s) {
  if (t.tile_slots <= 0 || stacked.n_out <= 0 || !mmq_supports(stacked)) return;
  MmqArgs a = mmq_args(stacked, y, xq, xds);
  a.splits = 1;
  a.expert_bytes = static_cast<uint64_t>(stacked.n_out) * stacked.row_bytes;
  a.tiles = t.tiles;
  a.num_tiles = t.num_tiles;
  a.perm = t.perm;
  a.x_rows = t.x_rows;
  switch (stacked.type) {
    case quant::Type::Q8_0:
      launch_id_type<MQ8_0>(a, t.tile_slots, t.tile_pairs, s);
      break;
    case quant::Type::Q4_0:
      launch_id_type<MQ4_0>(a, t.tile_slots, t.tile_pairs, s);
      break;
    case quant::Type::Q4_K:
      launch_id_type<MK45<false>>(a, t.tile_slots, t.tile_pairs, s);
      break;
    case quant::Type::Q5_K:
      launch_id_type<MK45<true>>(a, t.tile_slots, t.tile_pairs, s);
      break;
    case quant::Type::Q6_K:
      launch_id_type<MQ6_K>(a, t.tile_slots, t.tile_pairs, s);
      break;
    default:
      break;
  }
}

}  // namespace kiln::backend::cuda
