// Matrix-vector products for decode batches of up to 8 tokens: int8 dot products (dp4a) for
// the types real models store their big matrices in (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K), and fp32
// FMAs on F16 / BF16 / F32 rows (the last part of this file).
//
// The activations are quantized first (quantize_q8_32): per 32 consecutive values of a row, an
// fp32 scale d = max|x| / 127, int8 levels round(x / d), and d times the sum of the 32 levels
// (for the types whose levels carry an offset or a min: Q4_0's -8, Q4_K/Q5_K's min). A
// weight sub-block then contributes scale_w * d_x * dot(levels_w, levels_x) (- min_w * sum_x),
// the dot product four int8 pairs per instruction. The decoding cost per weight falls from
// ~5 fp32 instructions (direct kernel) to under 1, which is what lets a GEMV at batch 1 run at
// the memory's speed instead of the FP32 pipe's.
//
// Precision: the result is the exact weights' dot with the rounded activations (levels of 1/254
// of each 32-value group's largest magnitude), so it differs from the fp32 reference by ~5e-3
// of its norm for Gaussian activations (the test's bound is 1.5e-2); this is the same rounding
// as llama.cpp's CUDA and kiln's CPU kernels (Q8_0/Q8_K activations). The producers of a
// matmul's input (rmsnorm, swiglu: ops_elementwise.cu) can write the same levels themselves
// (q8_group4 in kernels_q8.cuh), sparing the quantize kernel.
//
// Layout: one warp per output row, four rows per CTA. A lane takes one "part" of a weight
// block per step (Q8_0: half a block; Q4_0: a block; Q4_K/Q5_K: a quarter, 64 values; Q6_K:
// an eighth, 32 values), so a warp step covers 512-2048 consecutive values of the row in
// coalesced loads (Q4_K's and Q5_K's parts take 16-byte pieces of each block such that every
// load of the warp reads whole 64-byte runs: VK45c); the x levels are read through L1 (the row
// is small and shared by all warps). For Q4_K, Q5_K and Q6_K a lane issues two parts' loads
// before the first part's arithmetic, registers capped for 8 CTAs an SM. Per-lane partial sums
// are reduced across the warp in a fixed order: a token's result does not depend on n_tokens or
// the other tokens. MoE expert rows of at most 16 parts take half a warp each.
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "kiln/backend/cuda/device.h"
#include "kiln/backend/cuda/env.h"
#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/matvec_dot.cuh"
#include "kiln/backend/cuda/pdl.cuh"

namespace kiln::backend::cuda {

namespace {

using namespace mv;  // NOLINT(google-build-using-namespace): the dot products' home

constexpr int kRowsPerCta = 4;
constexpr int kThreads = 32 * kRowsPerCta;

// Up to kMaxSegs weights of one type and width that share the input (q/k/v, gate/up) go in
// one launch: their rows are numbered one after the other, and a warp finds its weight by the
// running row ends (a launch and its ramp-up and tail saved per extra weight).
constexpr int kMaxSegs = 3;
struct Seg {
  const uint8_t* w;
  float* y;
  int64_t n_out;
  int64_t row_end;  // rows of this and the earlier segments
};
__device__ __forceinline__ Seg find_seg(const Seg (&seg)[kMaxSegs], int n_segs, int64_t row,
                                        int64_t& local) {
  Seg g = seg[0];
  local = row;
#pragma unroll
  for (int i = 1; i < kMaxSegs; ++i) {
    if (i < n_segs && row >= seg[i - 1].row_end) {
      local = row - seg[i - 1].row_end;
      g = seg[i];
    }
  }
  return g;
}

struct MatvecArgs {
  Seg seg[kMaxSegs];
  int n_segs;
  uint64_t row_bytes;
  int64_t n_blocks;
  const int8_t* xq;    // [n_tokens, n_in] levels
  const float2* xds;   // [n_tokens, n_in / 32] (d, sum of x)
  int64_t xq_stride;   // n_in
  int64_t xds_stride;  // n_in / 32
  int n_tokens;
};

template <class V, int T, int U, int kMinCtas>
__global__ void __launch_bounds__(kThreads, kMinCtas) matvec_kernel(const MatvecArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t grow = int64_t{blockIdx.x} * kRowsPerCta + warp;
  if (grow >= a.seg[a.n_segs - 1].row_end) return;
  int64_t row = 0;
  const Seg g = find_seg(a.seg, a.n_segs, grow, row);
  const uint8_t* w = g.w + static_cast<uint64_t>(row) * a.row_bytes;
  // The row's bytes depend on no earlier kernel: start them towards L2 while it finishes.
  prefetch_l2(w,
              static_cast<int>(a.n_blocks * V::kBytes < kPrefetchBytes ? a.n_blocks * V::kBytes
                                                                       : kPrefetchBytes),
              lane);
  pdl_start();
  float acc[T];
  row_dot<V, T, U>(w, a.n_blocks, a.xq, a.xds, a.xq_stride, a.xds_stride, a.n_tokens, lane, acc);
  store_row<T>(acc, lane, a.n_tokens, g.y, g.n_out, row);
}

// Two weight groups of different types in one launch (an attention layer's q/k in Q4_K or Q5_K
// and v in Q6_K, as the _M mixtures store half the layers' v): rows 0 .. rows1 - 1 of the launch
// are the first group's (V1), the rest the second's (V2); each warp's row exactly as
// matvec_kernel computes it for its group (the same bits), one launch instead of two.
// On by default (8B Q4_K_M tg128 +1.2% on the H200, docs/performance.md); KILN_CUDA_MATVEC_MIXED=0
// launches the groups apart.
struct Matvec2Args {
  MatvecArgs g1, g2;  // the same x and n_tokens
};

// One token (a decode step of one sequence); registers capped for kMinCtas CTAs an SM, the most
// without spills (ptxas: 7 with Q4_K, 6 with Q5_K; at 2-8 tokens both paths together spilled).
template <class V1, class V2, int kMinCtas>
__global__ void __launch_bounds__(kThreads, kMinCtas) matvec2_kernel(const Matvec2Args a) {
  constexpr int T = 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t grow = int64_t{blockIdx.x} * kRowsPerCta + warp;
  const int64_t rows1 = a.g1.seg[a.g1.n_segs - 1].row_end;
  const bool first = grow < rows1;
  const MatvecArgs& g = first ? a.g1 : a.g2;
  const int64_t grow_g = first ? grow : grow - rows1;
  if (grow_g >= g.seg[g.n_segs - 1].row_end) return;
  int64_t row = 0;
  const Seg sg = find_seg(g.seg, g.n_segs, grow_g, row);
  const uint8_t* w = sg.w + static_cast<uint64_t>(row) * g.row_bytes;
  const int64_t bytes = g.n_blocks * (first ? V1::kBytes : V2::kBytes);
  prefetch_l2(w, static_cast<int>(bytes < kPrefetchBytes ? bytes : kPrefetchBytes), lane);
  pdl_start();
  float acc[T];
  if (first) {
    row_dot<V1, T, 2>(w, g.n_blocks, g.xq, g.xds, g.xq_stride, g.xds_stride, g.n_tokens, lane,
                      acc);
  } else {
    row_dot<V2, T, 2>(w, g.n_blocks, g.xq, g.xds, g.xq_stride, g.xds_stride, g.n_tokens, lane,
                      acc);
  }
  store_row<T>(acc, lane, g.n_tokens, sg.y, sg.n_out, row);
}

// The streaming matvec: the weight rows reach shared memory by the copy engine (one bulk copy
// per row, completing on an mbarrier) instead of by each lane's loads. Each warp owns a run of
// consecutive rows (rows numbered across the launch's weights, as matvec_kernel numbers them)
// and a ring of slots of its own: it asks for its first rows before waiting on the previous
// kernel (weights depend on none), then per row waits for the copy, computes it (the same
// parts, dot products and lane order as matvec_kernel: bit for bit its result), and asks for the
// row a ring length ahead; warps never wait for each other. Why: matvec_kernel's warps each
// read one row (2-12 KiB) and retire, so the bytes in flight fall with every CTA's tail; ncu on
// an 8B Q4_K_M decode step (session 13) measured its Q4_K launches at 1.78 TB/s and Q6_K at
// 1.57 against the ~4.2 TB/s a device copy moves.
constexpr int kStreamWarps = 4;
constexpr int kStreamThreads = 32 * kStreamWarps;
constexpr int kStreamMaxSlots = 4;
constexpr uint64_t kStreamWarpBytes = 24 * 1024;  // a warp's ring, at least two slots
constexpr uint64_t kStreamMaxSmem = 200 * 1024;

struct StreamArgs {
  MatvecArgs m;         // the weights, x and y, as matvec_kernel takes them
  int n_slots;          // per warp
  uint32_t slot_bytes;  // row_bytes and 16 bytes that Q8_0's word loads may read past a row
  int64_t n_warps;      // in the grid
};

// The device helpers exist for sm_90+ only (the compute_80 PTX pass leaves them out).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void stream_issue(const StreamArgs& a, int64_t grow, uint8_t* dst,
                                             uint64_t* bar) {
  int64_t row = 0;
  const Seg g = find_seg(a.m.seg, a.m.n_segs, grow, row);
  const uint32_t bytes = static_cast<uint32_t>(a.m.row_bytes);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_u32(dst)),
      "l"(g.w + static_cast<uint64_t>(row) * a.m.row_bytes), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, "
        "p; }"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
#endif

template <class V, int T>
__global__ void __launch_bounds__(kStreamThreads) matvec_stream_kernel(const StreamArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // bulk copies: the launcher checks sm_90+
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t full[kStreamWarps][kStreamMaxSlots];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t gw = int64_t{blockIdx.x} * kStreamWarps + warp;
  const int64_t n_rows = a.m.seg[a.m.n_segs - 1].row_end;
  const int64_t row0 = n_rows * gw / a.n_warps;
  const int64_t n_mine = n_rows * (gw + 1) / a.n_warps - row0;
  uint8_t* ring = smem + static_cast<uint64_t>(warp) * a.n_slots * a.slot_bytes;
  if (lane == 0) {
    for (int i = 0; i < a.n_slots; ++i)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&full[warp][i])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    for (int k = 0; k < a.n_slots && k < n_mine; ++k)
      stream_issue(a, row0 + k, ring + k * a.slot_bytes, &full[warp][k]);
  }
  __syncwarp();
  pdl_start();  // x and y belong to the kernels around this one
  const MatvecArgs& m = a.m;
  for (int64_t k = 0; k < n_mine; ++k) {
    const int slot = static_cast<int>(k % a.n_slots);
    mbar_wait(&full[warp][slot], static_cast<uint32_t>((k / a.n_slots) & 1));
    float acc[T];
    row_dot<V, T, 1, LdShared>(ring + slot * a.slot_bytes, m.n_blocks, m.xq, m.xds, m.xq_stride,
                            m.xds_stride, m.n_tokens, lane, acc);
    __syncwarp();  // every lane is done with the slot
    if (lane == 0 && k + a.n_slots < n_mine)
      stream_issue(a, row0 + k + a.n_slots, ring + slot * a.slot_bytes, &full[warp][slot]);
    int64_t row = 0;
    const Seg g = find_seg(m.seg, m.n_segs, row0 + k, row);
    store_row<T>(acc, lane, m.n_tokens, g.y, g.n_out, row);
  }
#endif
}

// matmul_id for a decode step's few pairs: a warp per (output row blockIdx.x * 4 + warp, pair
// blockIdx.y), the pair's expert matrix and activation row found through ids and x_rows; the
// same dot products and warp reduction as matvec_kernel at one token, so a pair's result is bit
// for bit the dense matvec of its expert on its row. With w2 (matvec_id_pair: an MoE layer's
// gate and up experts, the same shape and type), rows n_out .. 2 n_out - 1 of the launch are
// w2's into y2: two matmuls in one launch, each row's bits as its own launch would give.
struct MatvecIdArgs {
  ExpertRows e;
  const uint8_t* w2;  // null: one weight
  float* y;
  float* y2;
};

template <class V, int kLanes>
__global__ void __launch_bounds__(kThreads) matvec_id_kernel(const MatvecIdArgs a) {
  // kLanes = 16: two rows a warp, one a half (rows of at most 16 parts: a Qwen3-30B-A3B
  // expert's 768-wide down projection has 12). The half's butterfly skips the full warp's
  // first step, which adds lanes that hold no part (+0): the same sums.
  constexpr int kRows = 32 / kLanes;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % kLanes;
  const int64_t row =
      (int64_t{blockIdx.x} * kRowsPerCta + warp) * kRows + (threadIdx.x % 32) / kLanes;
  const ExpertRows& e = a.e;
  const int64_t p = blockIdx.y;
  pdl_start();  // ids and x come from the kernels before
  const int32_t ex = e.ids[p];
  if (ex < 0 || ex >= e.n_expert) return;
  const int64_t n_rows = a.w2 != nullptr ? 2 * e.n_out : e.n_out;
  if (kRows == 1 && row >= n_rows) return;
  const bool valid = row < n_rows;  // both halves reach the shuffles
  const bool second = row >= e.n_out;
  const int64_t r = second ? row - e.n_out : row;
  const int64_t xr = e.x_rows[p];
  const uint8_t* w = (second ? a.w2 : e.w) + static_cast<uint64_t>(ex) * e.expert_bytes +
                     static_cast<uint64_t>(valid ? r : 0) * e.row_bytes;
  const int8_t* xq = e.xq + xr * e.xq_stride;
  const float2* xds = e.xds + xr * e.xds_stride;
  float acc[1];
  row_dot<V, 1, 1, LdGlobal, kLanes>(w, valid ? e.n_blocks : 0, xq, xds, e.xq_stride,
                                     e.xds_stride, 1, lane, acc);
  store_row<1, kLanes>(acc, lane, 1, (second ? a.y2 : a.y) + p * e.n_out, e.n_out, r, valid);
}

// F16 / BF16 (and F32: MoE routers) rows with fp32 activations: the same warp-per-row layout,
// 8 weights (16 bytes; F32: 32) per lane per step, fp32 FMAs on the exact weights (within ~1e-5
// of the reference).
struct HalfArgs {
  Seg seg[kMaxSegs];
  int n_segs;
  uint64_t row_bytes;
  int64_t n_in;
  const float* x;  // [n_tokens, n_in], 16-byte aligned rows
  int n_tokens;
};

// The 16-bit and fp32 rows' element types (matvec_half_kernel's kKind).
constexpr int kKindF16 = 0, kKindBf16 = 1, kKindF32 = 2;

template <bool kBf16>
__device__ __forceinline__ void unpack_half8(uint4 q, float* f) {
  const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kBf16) {
      f[2 * i] = __uint_as_float(u[i] << 16);
      f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    } else {
      const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&u[i]));
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
}

// Weights 8 i .. 8 i + 8 of a row as fp32: one 16-byte load of 16-bit values, two of fp32.
template <int kKind>
__device__ __forceinline__ void load_w8(const uint4* w, int64_t i, float* f) {
  if constexpr (kKind == kKindF32) {
    const uint4 a = __ldg(w + 2 * i), b = __ldg(w + 2 * i + 1);
    const uint32_t u[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int k = 0; k < 8; ++k) f[k] = __uint_as_float(u[k]);
  } else {
    unpack_half8<kKind == kKindBf16>(__ldg(w + i), f);
  }
}

// acc[t] += the 8 weights f (at 8 i of the row) . x[t][8 i, 8 i + 8), in order.
template <int T>
__device__ __forceinline__ void half_step(const float* f, const HalfArgs& a, int64_t i,
                                          float* acc) {
#pragma unroll
  for (int t = 0; t < T; ++t) {
    if (t < a.n_tokens) {
      const float4* x = reinterpret_cast<const float4*>(a.x + t * a.n_in) + 2 * i;
      const float4 x0 = __ldg(x), x1 = __ldg(x + 1);
      float s = acc[t];
      s = fmaf(f[0], x0.x, s);
      s = fmaf(f[1], x0.y, s);
      s = fmaf(f[2], x0.z, s);
      s = fmaf(f[3], x0.w, s);
      s = fmaf(f[4], x1.x, s);
      s = fmaf(f[5], x1.y, s);
      s = fmaf(f[6], x1.z, s);
      acc[t] = fmaf(f[7], x1.w, s);
    }
  }
}

template <int kKind, int T>
__global__ void __launch_bounds__(kThreads) matvec_half_kernel(const HalfArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t grow = int64_t{blockIdx.x} * kRowsPerCta + warp;
  if (grow >= a.seg[a.n_segs - 1].row_end) return;
  int64_t row = 0;
  const Seg g = find_seg(a.seg, a.n_segs, grow, row);
  const uint4* w = reinterpret_cast<const uint4*>(g.w + static_cast<uint64_t>(row) * a.row_bytes);
  constexpr int64_t kWeightBytes = kKind == kKindF32 ? 4 : 2;
  prefetch_l2(w,
              static_cast<int>(a.n_in * kWeightBytes < kPrefetchBytes ? a.n_in * kWeightBytes
                                                                      : kPrefetchBytes),
              lane);
  pdl_start();
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  const int64_t n8 = a.n_in / 8;
  // (Loads batched explicitly, 2 or 4 per lane before their use, measured 6% slower on the 8B
  // F16 file: 183.5-183.7 against 196.1 tok/s.)
#pragma unroll 4
  for (int64_t i = lane; i < n8; i += 32) {
    float f[8];
    load_w8<kKind>(w, i, f);
    half_step<T>(f, a, i, acc);
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float v = acc[t];
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0 && t < a.n_tokens) g.y[t * g.n_out + row] = v;
  }
}

// Both launchers pick the kernel instance for the token count (1, 2, 4 or 8 accumulators).
template <class Args, class K1, class K2, class K4, class K8>
void launch_t(const Args& a, K1 k1, K2 k2, K4 k4, K8 k8, cudaStream_t s) {
  const int64_t rows = a.seg[a.n_segs - 1].row_end;
  const dim3 grid(static_cast<unsigned>((rows + kRowsPerCta - 1) / kRowsPerCta));
  if (a.n_tokens <= 1) {
    launch_pdl(k1, grid, dim3(kThreads), 0, s, a);
  } else if (a.n_tokens <= 2) {
    launch_pdl(k2, grid, dim3(kThreads), 0, s, a);
  } else if (a.n_tokens <= 4) {
    launch_pdl(k4, grid, dim3(kThreads), 0, s, a);
  } else {
    launch_pdl(k8, grid, dim3(kThreads), 0, s, a);
  }
}

template <int kKind>
void launch_half(const HalfArgs& a, cudaStream_t s) {
  launch_t(a, matvec_half_kernel<kKind, 1>, matvec_half_kernel<kKind, 2>,
           matvec_half_kernel<kKind, 4>, matvec_half_kernel<kKind, kMatvecMaxTokens>, s);
}

// One warp per group of 32 values: d = max|x| / 127, q = round(x / d), and d * (the sum of the
// levels): the rounded group's sum, so that an offset or min term (Q4_0's -8, the K-quants' min)
// sees the same rounded activations as the dot (the result is then the weights' exact dot with
// the rounded activations, up to fp32 summation).
__global__ void quantize_q8_32_kernel(const float* x, int64_t n_groups, int8_t* xq, float2* xds) {
  const int64_t g = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  pdl_start();
  if (g >= n_groups) return;
  const float v = x[g * 32 + lane];
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.0f;
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  const int q = __float2int_rn(v * inv);
  int sum = q;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  xq[g * 32 + lane] = static_cast<int8_t>(q);
  if (lane == 0) xds[g] = make_float2(d, d * static_cast<float>(sum));
}

// Two parts' loads in flight a lane (row_dot's U = 2) with registers capped for 8 CTAs (32
// warps) an SM, or one part's with the registers the compiler picks (64-72 for the K-quants:
// 7-8 CTAs). Two-and-capped is the default for Q4_K, Q5_K and Q6_K, where it was measured faster in
// a decode step (docs/performance.md); two without the cap (80-121 registers, 4-6 CTAs) was
// slower than one, as was one with the cap (spills). KILN_CUDA_MATVEC_UNROLL=1: one part for
// every type (comparisons). Two for Q8_0 too measured slower (8B Q8_0: 313.4 / 315.8 tok/s against
// 337.6 / 336.6).
bool unroll_allowed() {
  static const bool on = !env_is("KILN_CUDA_MATVEC_UNROLL", "1");
  return on;
}

bool half_rows_allowed() {
  static const bool on = !env_is("KILN_CUDA_MATVEC_ID_HALF", "0");
  return on;
}

template <class V, int U, int C>
void launch_u(const MatvecArgs& a, cudaStream_t s) {
  launch_t(a, matvec_kernel<V, 1, U, C>, matvec_kernel<V, 2, U, C>, matvec_kernel<V, 4, U, C>,
           matvec_kernel<V, kMatvecMaxTokens, U, C>, s);
}

template <class V, int U = 1>
void launch(const MatvecArgs& a, cudaStream_t s) {
  if constexpr (U == 2) {
    if (unroll_allowed()) {
      launch_u<V, 2, 8>(a, s);
      return;
    }
  }
  launch_u<V, 1, 1>(a, s);
}

// Off by default until measured faster in a decode step; KILN_CUDA_MATVEC_STREAM=1 / 0 sets it.
constexpr bool kStreamDefault = false;
std::atomic<bool>& stream_flag() {
  static std::atomic<bool> on{[] {
    const char* e = std::getenv("KILN_CUDA_MATVEC_STREAM");
    if (e != nullptr && *e != 0) return std::string_view(e) != "0";
    return kStreamDefault;
  }()};
  return on;
}
bool stream_enabled() { return stream_flag().load(std::memory_order_relaxed); }

// Q4_K and Q5_K rows take the coalesced form (VK45c); KILN_CUDA_MATVEC_K_FORM=0: VK45's (for
// comparisons). matvec_id follows the same choice, so that a pair's result stays bit for bit
// the dense matvec of its expert.
bool k_coalesced() {
  static const bool on = !env_is("KILN_CUDA_MATVEC_K_FORM", "0");
  return on;
}

std::atomic<int64_t>& mixed_launches() {
  static std::atomic<int64_t> n{0};
  return n;
}

// The streaming kernel for a group of weights (a.seg filled), when its rows can be bulk-copied
// (16-byte aligned starts and lengths) and two slots a warp fit; false: use matvec_kernel.
template <class V>
bool launch_stream(const MatvecArgs& m, cudaStream_t s) {
  if (!stream_enabled() || m.row_bytes % 16 != 0 || current_sm_count() <= 0 ||
      current_cc_major() < 9)
    return false;
  StreamArgs a{};
  a.slot_bytes = static_cast<uint32_t>((m.row_bytes + 16 + 127) / 128 * 128);
  a.n_slots = static_cast<int>(std::clamp<uint64_t>(kStreamWarpBytes / a.slot_bytes, 2,
                                                    kStreamMaxSlots));
  const uint64_t smem = uint64_t{kStreamWarps} * a.n_slots * a.slot_bytes;
  if (smem > kStreamMaxSmem) return false;
  for (int k = 0; k < m.n_segs; ++k)
    if (reinterpret_cast<uintptr_t>(m.seg[k].w) % 16 != 0) return false;
  a.m = m;
  const int64_t n_rows = m.seg[m.n_segs - 1].row_end;
  // As many CTAs as an SM holds by shared memory (228 KiB, 1 KiB of it per CTA reserved), at
  // most 8 (32 warps), and no more warps than rows.
  const int per_sm = static_cast<int>(std::clamp<uint64_t>(227 * 1024 / (smem + 1024), 1, 8));
  const int64_t ctas = std::min<int64_t>(int64_t{per_sm} * current_sm_count(),
                                         (n_rows + kStreamWarps - 1) / kStreamWarps);
  a.n_warps = ctas * kStreamWarps;
  auto go = [&](auto kernel) {
    if (!allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kStreamMaxSmem)) return false;
    launch_pdl(kernel, dim3(static_cast<unsigned>(ctas)), dim3(kStreamThreads),
               static_cast<size_t>(smem), s, a);
    return true;
  };
  if (m.n_tokens <= 1) return go(matvec_stream_kernel<V, 1>);
  if (m.n_tokens <= 2) return go(matvec_stream_kernel<V, 2>);
  if (m.n_tokens <= 4) return go(matvec_stream_kernel<V, 4>);
  return go(matvec_stream_kernel<V, kMatvecMaxTokens>);
}

// Calls f(first, count) for runs of weights that can share a launch: the same type and row
// bytes, at most kMaxSegs at a time, taken in order of first appearance.
// KILN_CUDA_MATVEC_GROUP=0: one launch per weight (for comparisons).
int max_group() {
  static const int n = env_is("KILN_CUDA_MATVEC_GROUP", "0") ? 1 : kMaxSegs;
  return n;
}

template <class F>
void for_each_group(const Weight* const* ws, int n_w, F f) {
  const int max_n = max_group();
  uint32_t done = 0;
  for (int i = 0; i < n_w; ++i) {
    if (done & (1u << i)) continue;
    int idx[kMaxSegs];
    int n = 0;
    for (int j = i; j < n_w && n < max_n; ++j) {
      if ((done & (1u << j)) || ws[j]->type != ws[i]->type ||
          ws[j]->row_bytes != ws[i]->row_bytes || ws[j]->n_in != ws[i]->n_in)
        continue;
      done |= 1u << j;
      idx[n++] = j;
    }
    f(idx, n);
  }
}

template <class Args>
void fill_segs(Args& a, const Weight* const* ws, float* const* ys, const int* idx, int n) {
  int64_t end = 0;
  for (int k = 0; k < n; ++k) {
    const Weight& w = *ws[idx[k]];
    end += w.n_out;
    a.seg[k] = Seg{w.data, ys[idx[k]], w.n_out, end};
  }
  a.n_segs = n;
  a.row_bytes = ws[idx[0]]->row_bytes;
}

// On unless KILN_CUDA_MATVEC_MIXED=0 at start; tests flip it (matvec_set_mixed).
std::atomic<bool>& mixed_flag() {
  static std::atomic<bool> on{!env_is("KILN_CUDA_MATVEC_MIXED", "0")};
  return on;
}

// The weights of one matvec_q8 call at one token in one launch when they form exactly two
// groups, Q4_K or Q5_K (coalesced parts) and Q6_K, in either order (matvec2_kernel), and the
// streaming kernel is not asked for; false: launch them as matvec_q8 does.
bool launch_mixed(const Weight* const* ws, float* const* ys, int n_w, const int8_t* xq,
                  const float2* xds, int64_t n_tokens, cudaStream_t s) {
  if (!mixed_flag().load(std::memory_order_relaxed) || n_tokens != 1 || stream_enabled() ||
      !k_coalesced() || !unroll_allowed())
    return false;
  int groups = 0;
  int idx[2][kMaxSegs];
  int cnt[2] = {0, 0};
  bool fits = true;
  for_each_group(ws, n_w, [&](const int* g, int n) {
    if (groups < 2) {
      for (int k = 0; k < n; ++k) idx[groups][k] = g[k];
      cnt[groups] = n;
    }
    ++groups;
    if (n <= 0) fits = false;
  });
  if (!fits || groups != 2) return false;
  const quant::Type t0 = ws[idx[0][0]]->type, t1 = ws[idx[1][0]]->type;
  const int q6 = t1 == quant::Type::Q6_K ? 1 : t0 == quant::Type::Q6_K ? 0 : -1;
  if (q6 < 0) return false;
  const int k45 = 1 - q6;
  const quant::Type tk = ws[idx[k45][0]]->type;
  if (tk != quant::Type::Q4_K && tk != quant::Type::Q5_K) return false;
  if (ws[idx[0][0]]->n_in != ws[idx[1][0]]->n_in) return false;
  Matvec2Args a{};
  MatvecArgs* g[2] = {&a.g1, &a.g2};  // g1: the K-quant group, g2: the Q6_K one
  const int order[2] = {k45, q6};
  for (int i = 0; i < 2; ++i) {
    MatvecArgs& m = *g[i];
    fill_segs(m, ws, ys, idx[order[i]], cnt[order[i]]);
    const Weight& w = *ws[idx[order[i]][0]];
    m.xq = xq;
    m.xds = xds;
    m.xq_stride = w.n_in;
    m.xds_stride = w.n_in / 32;
    m.n_tokens = static_cast<int>(n_tokens);
    m.n_blocks = w.n_in / 256;
  }
  const int64_t rows = a.g1.seg[a.g1.n_segs - 1].row_end + a.g2.seg[a.g2.n_segs - 1].row_end;
  if (a.g1.seg[a.g1.n_segs - 1].row_end <= 0 || a.g2.seg[a.g2.n_segs - 1].row_end <= 0)
    return false;
  const dim3 grid(static_cast<unsigned>((rows + kRowsPerCta - 1) / kRowsPerCta));
  if (tk == quant::Type::Q4_K) {
    launch_pdl(matvec2_kernel<VQ4_Kc, VQ6_K, 7>, grid, dim3(kThreads), 0, s, a);
  } else {
    launch_pdl(matvec2_kernel<VQ5_Kc, VQ6_K, 6>, grid, dim3(kThreads), 0, s, a);
  }
  mixed_launches().fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

void matvec_set_stream(bool on) { stream_flag().store(on, std::memory_order_relaxed); }
void matvec_set_mixed(bool on) { mixed_flag().store(on, std::memory_order_relaxed); }
bool matvec_mixed() { return mixed_flag().load(std::memory_order_relaxed); }
int64_t matvec_mixed_launched() { return mixed_launches().load(std::memory_order_relaxed); }
bool matvec_stream() { return stream_enabled(); }

bool matvec_supports(const Weight& w) {
  const uint64_t align = (w.type == quant::Type::Q4_K || w.type == quant::Type::Q5_K) ? 16 : 2;
  int64_t block = 0;
  switch (w.type) {
    case quant::Type::Q8_0:
    case quant::Type::Q4_0:
      block = 32;
      break;
    case quant::Type::Q4_K:
    case quant::Type::Q5_K:
    case quant::Type::Q6_K:
      block = 256;
      break;
    default:
      return false;
  }
  return w.n_in % block == 0 && reinterpret_cast<uintptr_t>(w.data) % align == 0 &&
         w.row_bytes % align == 0;
}

bool matvec_half_supports(const Weight& w, const float* x) {
  return (w.type == quant::Type::F16 || w.type == quant::Type::BF16 ||
          w.type == quant::Type::F32) &&
         w.n_in % 8 == 0 &&
         reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.row_bytes % 16 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

void matvec_half(const Weight* const* ws, float* const* ys, int n_w, const float* x,
                 int64_t n_tokens, cudaStream_t s) {
  if (n_tokens <= 0 || n_tokens > kMatvecMaxTokens || n_w <= 0 || n_w > 32) return;
  for_each_group(ws, n_w, [&](const int* idx, int n) {
    HalfArgs a{};
    fill_segs(a, ws, ys, idx, n);
    if (a.seg[n - 1].row_end <= 0) return;
    a.n_in = ws[idx[0]]->n_in;
    a.x = x;
    a.n_tokens = static_cast<int>(n_tokens);
    if (ws[idx[0]]->type == quant::Type::BF16) {
      launch_half<kKindBf16>(a, s);
    } else if (ws[idx[0]]->type == quant::Type::F32) {
      launch_half<kKindF32>(a, s);
    } else {
      launch_half<kKindF16>(a, s);
    }
  });
}

void quantize_q8_32(const float* x, int64_t n_tokens, int64_t n_in, int8_t* xq, float2* xds,
                    cudaStream_t s) {
  const int64_t groups = n_tokens * (n_in / 32);
  if (groups <= 0) return;
  const int threads = 256;
  const int64_t blocks = (groups * 32 + threads - 1) / threads;
  launch_pdl(quantize_q8_32_kernel, dim3(static_cast<unsigned>(blocks)), dim3(threads), 0, s, x,
             groups, xq, xds);
}

void matvec_q8(const Weight* const* ws, float* const* ys, int n_w, const int8_t* xq,
               const float2* xds, int64_t n_tokens, cudaStream_t s) {
  if (n_tokens <= 0 || n_tokens > kMatvecMaxTokens || n_w <= 0 || n_w > 32) return;
  if (launch_mixed(ws, ys, n_w, xq, xds, n_tokens, s)) return;
  for_each_group(ws, n_w, [&](const int* idx, int n) {
    MatvecArgs a{};
    fill_segs(a, ws, ys, idx, n);
    if (a.seg[n - 1].row_end <= 0) return;
    const Weight& w = *ws[idx[0]];
    a.xq = xq;
    a.xds = xds;
    a.xq_stride = w.n_in;
    a.xds_stride = w.n_in / 32;
    a.n_tokens = static_cast<int>(n_tokens);
    switch (w.type) {
      case quant::Type::Q8_0:
        a.n_blocks = w.n_in / 32;
        if (!launch_stream<VQ8_0>(a, s)) launch<VQ8_0>(a, s);
        break;
      case quant::Type::Q4_0:
        a.n_blocks = w.n_in / 32;
        if (!launch_stream<VQ4_0>(a, s)) launch<VQ4_0>(a, s);
        break;
      case quant::Type::Q4_K:
        a.n_blocks = w.n_in / 256;
        if (k_coalesced()) {
          if (!launch_stream<VQ4_Kc>(a, s)) launch<VQ4_Kc, 2>(a, s);
        } else if (!launch_stream<VK45<false>>(a, s)) {
          launch<VK45<false>, 2>(a, s);
        }
        break;
      case quant::Type::Q5_K:
        a.n_blocks = w.n_in / 256;
        if (k_coalesced()) {
          if (!launch_stream<VQ5_Kc>(a, s)) launch<VQ5_Kc, 2>(a, s);
        } else if (!launch_stream<VK45<true>>(a, s)) {
          launch<VK45<true>>(a, s);
        }
        break;
      case quant::Type::Q6_K:
        a.n_blocks = w.n_in / 256;
        if (!launch_stream<VQ6_K>(a, s)) launch<VQ6_K, 2>(a, s);
        break;
      default:
        break;
    }
  });
}

bool matvec_k_coalesced() { return k_coalesced(); }

int matvec_id_lanes(const Weight& stacked) {
  // Rows of at most 16 parts take half a warp each (KILN_CUDA_MATVEC_ID_HALF=0: a warp each).
  int64_t n_parts = 0;
  switch (stacked.type) {
    case quant::Type::Q8_0:
      n_parts = stacked.n_in / 32 * VQ8_0::kParts;
      break;
    case quant::Type::Q4_0:
      n_parts = stacked.n_in / 32 * VQ4_0::kParts;
      break;
    case quant::Type::Q6_K:
      n_parts = stacked.n_in / 256 * VQ6_K::kParts;
      break;
    default:
      n_parts = stacked.n_in / 256 * 4;
      break;
  }
  return n_parts <= 16 && half_rows_allowed() ? 16 : 32;
}

namespace {

// matvec_id and matvec_id_pair: a.w (and a.w2) filled but for the blocks, n_rows rows a pair.
bool launch_id(const Weight& stacked, MatvecIdArgs& a, int64_t n_rows, int64_t n_pairs,
               cudaStream_t s) {
  const bool half = matvec_id_lanes(stacked) == 16;
  const int64_t rows_per_cta = kRowsPerCta * (half ? 2 : 1);
  const dim3 grid(static_cast<unsigned>((n_rows + rows_per_cta - 1) / rows_per_cta),
                  static_cast<unsigned>(n_pairs));
  return with_part_type(stacked, k_coalesced(), [&](auto v, int64_t n_blocks) {
    using V = decltype(v);
    a.e.n_blocks = n_blocks;
    if (half) {
      launch_pdl(matvec_id_kernel<V, 16>, grid, dim3(kThreads), 0, s, a);
    } else {
      launch_pdl(matvec_id_kernel<V, 32>, grid, dim3(kThreads), 0, s, a);
    }
    return true;
  });
}

MatvecIdArgs id_args(const Weight& stacked, int64_t n_expert, const int8_t* xq, const float2* xds,
                     const int32_t* x_rows, const int32_t* ids, float* y) {
  MatvecIdArgs a{};
  a.e = expert_rows(stacked, n_expert, xq, xds, x_rows, ids);
  a.y = y;
  return a;
}

}  // namespace

bool matvec_id(const Weight& stacked, int64_t n_expert, const int8_t* xq, const float2* xds,
               const int32_t* x_rows, const int32_t* ids, float* y, int64_t n_pairs,
               cudaStream_t s) {
  if (n_pairs <= 0 || n_pairs > 65535 || stacked.n_out <= 0 || !matvec_supports(stacked))
    return false;
  MatvecIdArgs a = id_args(stacked, n_expert, xq, xds, x_rows, ids, y);
  return launch_id(stacked, a, stacked.n_out, n_pairs, s);
}

bool matvec_id_pair(const Weight& first, const Weight& second, int64_t n_expert, const int8_t* xq,
                    const float2* xds, const int32_t* x_rows, const int32_t* ids, float* y,
                    float* y2, int64_t n_pairs, cudaStream_t s) {
  if (n_pairs <= 0 || n_pairs > 65535 || first.n_out <= 0 || !matvec_supports(first) ||
      !matvec_supports(second) || second.type != first.type || second.n_in != first.n_in ||
      second.n_out != first.n_out || second.row_bytes != first.row_bytes)
    return false;
  MatvecIdArgs a = id_args(first, n_expert, xq, xds, x_rows, ids, y);
  a.w2 = second.data;
  a.y2 = y2;
  return launch_id(first, a, 2 * first.n_out, n_pairs, s);
}

}  // namespace kiln::backend::cuda
