// The MoE block of a decode step in fewer launches (kernels.h): a Qwen3-30B-A3B-shaped layer
// took seven kernels for its experts (router matvec, top-k, gate, up, swiglu, down, combine),
// each a few microseconds of launch, ramp-up and tail on an H200 for a few MB of weights; the
// step is a chain of such short kernels (docs/performance.md, session 13's profile). Here the
// router and the top-k are one launch (moe_route), gate and up one (matvec_id_pair, matvec.cu),
// and the down projection and the combination one (moe_down_combine). Each computes
// the bits of the kernels it replaces (the tests compare them), so the switch between the forms
// (KILN_CUDA_MOE_FUSE, cuda_backend.cpp) changes speed, not answers, but for an F32 router,
// whose logits here are a warp's fp32 dot product instead of the direct kernel's.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/matvec_dot.cuh"
#include "kiln/backend/cuda/moe_topk.cuh"
#include "kiln/backend/cuda/pdl.cuh"

namespace kiln::backend::cuda {
namespace {

using namespace mv;  // NOLINT(google-build-using-namespace): the matvec's dot products

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
struct F32Router {};  // moe_route's V for an F32 router

// ---- moe_route ---------------------------------------------------------------------------

struct RouteArgs {
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t n_expert, n_in, n_blocks;
  const float* x;  // F32 router: fp32 rows [n_tokens, n_in]
  const int8_t* xq;
  const float2* xds;  // quantized router: int8 rows
  int n_tokens;
  int32_t k;
  float* logits;
  int32_t* chosen;
  float* weights;
  int32_t* x_rows;
  uint32_t* counter;
};

// An F32 row's dot with T tokens: a lane's float4s at lane, lane + 32, ... in order, fp32 FMAs;
// eight of a lane's loads in flight at a time (a Qwen3-30B-A3B router is 128 rows of 8 KiB, one
// warp each: the whole 1 MiB in flight in two rounds).
template <int T>
__device__ __forceinline__ void f32_row_dot(const float* w, int64_t n_in, const float* x, int n,
                                            int lane, float* acc) {
  constexpr int kInFlight = 8;
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  const int64_t n4 = n_in / 4;
  const float4* w4 = reinterpret_cast<const float4*>(w);
  for (int64_t i0 = lane; i0 < n4; i0 += 32 * kInFlight) {
    float4 a[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u)
      if (i0 + 32 * u < n4) a[u] = __ldg(w4 + i0 + 32 * u);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      if (i0 + 32 * u >= n4) break;
#pragma unroll
      for (int t = 0; t < T; ++t) {
        if (t < n) {
          const float4 b = __ldg(reinterpret_cast<const float4*>(x + t * n_in) + i0 + 32 * u);
          acc[t] = fmaf(a[u].x, b.x, acc[t]);
          acc[t] = fmaf(a[u].y, b.y, acc[t]);
          acc[t] = fmaf(a[u].z, b.z, acc[t]);
          acc[t] = fmaf(a[u].w, b.w, acc[t]);
        }
      }
    }
  }
}

// A warp per expert row (blockIdx.x * 4 + warp) for every token; then the last CTA to finish
// (a ticket on a.counter) routes the tokens, a warp each. Dynamic shared memory: kWarps *
// n_expert floats (topk_warp's probabilities).
template <class V, int T>
__global__ void __launch_bounds__(kThreads) moe_route_kernel(const RouteArgs a) {
  extern __shared__ float probs[];
  __shared__ bool last;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * kWarps + warp;
  const bool valid = row < a.n_expert;  // warp-uniform
  const uint8_t* w = a.w + static_cast<uint64_t>(valid ? row : 0) * a.row_bytes;
  // The router's rows depend on no earlier kernel.
  if (valid)
    prefetch_l2(w, static_cast<int>(std::min<uint64_t>(a.row_bytes, kPrefetchBytes)),
                lane);
  pdl_start();  // x comes from the norm before
  if (valid) {
    float acc[T];
    if constexpr (std::is_same_v<V, F32Router>) {
      f32_row_dot<T>(reinterpret_cast<const float*>(w), a.n_in, a.x, a.n_tokens, lane, acc);
    } else {
      row_dot<V, T>(w, a.n_blocks, a.xq, a.xds, a.n_in, a.n_in / 32, a.n_tokens, lane, acc);
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float v = row_sum(acc[t]);
      if (lane == 0 && t < a.n_tokens) a.logits[t * a.n_expert + row] = v;
    }
  }
  // The ticket: every CTA's logits are visible before its ticket is taken.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int64_t t = warp; t < a.n_tokens; t += kWarps)
    topk_warp(a.logits + t * a.n_expert, static_cast<int32_t>(a.n_expert), a.k,
              probs + warp * a.n_expert, lane, t, a.chosen, a.weights, a.x_rows);
  if (threadIdx.x == 0) *a.counter = 0;  // for the next launch (a graph replays this one)
}

// ---- moe_down_combine ----------------------------------------------------------------------

struct CombineArgs {
  ExpertRows e;  // x_rows null: pair p reads row p
  const float* weights;
  int32_t k;
  int rows;  // output rows a CTA: max(1, workers / k)
  float* out;
};

// A CTA per (rows blockIdx.x * a.rows .. + a.rows, token blockIdx.y): its workers (warps, or half
// warps for rows of at most 16 parts, as matvec_id) take the (row, slot) products in turn, each
// matvec_id_kernel's dot product and reduction (its bits), into shared memory; then a thread per
// row sums them with the weights as moe_combine does.
template <class V, int kLanes>
__global__ void __launch_bounds__(kThreads) moe_down_combine_kernel(const CombineArgs a) {
  constexpr int kWorkers = kThreads / kLanes;
  __shared__ float part[kMaxTopk];  // rows * k <= max(kWorkers, k) <= 32
  const int worker = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const ExpertRows& e = a.e;
  const int64_t t = blockIdx.y;
  const int tasks = a.rows * a.k;
  pdl_start();  // ids, weights and x come from the kernels before
  // The same trip count in every lane: the halves of a warp meet in row_sum's shuffles.
  for (int task0 = 0; task0 < tasks; task0 += kWorkers) {
    const int task = task0 + worker;
    const int rr = task / a.k, j = task - rr * a.k;
    const int64_t row = int64_t{blockIdx.x} * a.rows + rr;
    const int64_t p = t * a.k + j;
    const bool in_range = task < tasks && row < e.n_out;
    const int32_t ex = in_range ? e.ids[p] : -1;
    const bool valid = ex >= 0 && ex < e.n_expert;
    const int64_t xr = !valid ? 0 : e.x_rows != nullptr ? e.x_rows[p] : p;
    const uint8_t* w = e.w + static_cast<uint64_t>(valid ? ex : 0) * e.expert_bytes +
                       static_cast<uint64_t>(valid ? row : 0) * e.row_bytes;
    float acc[1];
    row_dot<V, 1, 1, LdGlobal, kLanes>(w, valid ? e.n_blocks : 0, e.xq + xr * e.xq_stride,
                                       e.xds + xr * e.xds_stride, e.xq_stride, e.xds_stride, 1,
                                       lane, acc);
    const float v = row_sum<kLanes>(acc[0]);
    if (lane == 0 && task < tasks) part[task] = valid ? v : 0.0f;
  }
  __syncthreads();
  if (threadIdx.x < a.rows) {
    const int64_t row = int64_t{blockIdx.x} * a.rows + threadIdx.x;
    if (row < e.n_out) {
      float acc = 0.0f;
      for (int32_t j = 0; j < a.k; ++j)
        acc = __fadd_rn(acc, __fmul_rn(a.weights[t * a.k + j], part[threadIdx.x * a.k + j]));
      a.out[t * e.n_out + row] = acc;
    }
  }
}

}  // namespace

bool moe_route(const Weight& router, const float* x, const int8_t* xq, const float2* xds,
               int64_t n_tokens, int32_t k, float* logits, int32_t* chosen, float* weights,
               int32_t* x_rows, uint32_t* counter, cudaStream_t s) {
  if (n_tokens <= 0 || n_tokens > kMatvecMaxTokens || router.n_mats > 1 || router.n_out <= 0 ||
      router.n_out > kTopkMaxExperts || k < 1 || k > kMaxTopk || k > router.n_out ||
      counter == nullptr)
    return false;
  RouteArgs a{};
  a.w = router.data;
  a.row_bytes = router.row_bytes;
  a.n_expert = router.n_out;
  a.n_in = router.n_in;
  a.x = x;
  a.xq = xq;
  a.xds = xds;
  a.n_tokens = static_cast<int>(n_tokens);
  a.k = k;
  a.logits = logits;
  a.chosen = chosen;
  a.weights = weights;
  a.x_rows = x_rows;
  a.counter = counter;
  const dim3 grid(static_cast<unsigned>((router.n_out + kWarps - 1) / kWarps));
  const size_t smem = size_t{kWarps} * static_cast<size_t>(router.n_out) * sizeof(float);
  auto go = [&](auto k1, auto k8) {
    if (n_tokens == 1) {
      launch_pdl(k1, grid, dim3(kThreads), smem, s, a);
    } else {
      launch_pdl(k8, grid, dim3(kThreads), smem, s, a);
    }
    return true;
  };
  if (router.type == quant::Type::F32) {
    const bool aligned = router.n_in % 4 == 0 && router.row_bytes % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(router.data) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(x) % 16 == 0;
    if (x == nullptr || !aligned) return false;
    return go(moe_route_kernel<F32Router, 1>, moe_route_kernel<F32Router, kMatvecMaxTokens>);
  }
  if (xq == nullptr || xds == nullptr || !matvec_supports(router)) return false;
  return with_part_type(router, matvec_k_coalesced(), [&](auto v, int64_t n_blocks) {
    using V = decltype(v);
    a.n_blocks = n_blocks;
    return go(moe_route_kernel<V, 1>, moe_route_kernel<V, kMatvecMaxTokens>);
  });
}

bool moe_down_combine(const Weight& stacked, int64_t n_expert, const int8_t* xq, const float2* xds,
                      const int32_t* x_rows, const int32_t* ids, const float* weights,
                      int64_t n_tokens, int32_t k, float* out, cudaStream_t s) {
  if (n_tokens <= 0 || n_tokens > 65535 || k < 1 || k > kMaxTopk || stacked.n_out <= 0 ||
      !matvec_supports(stacked))
    return false;
  const int lanes = matvec_id_lanes(stacked);
  const int workers = kThreads / lanes;
  CombineArgs a{};
  a.e = expert_rows(stacked, n_expert, xq, xds, x_rows, ids);
  a.weights = weights;
  a.k = k;
  a.rows = workers > k ? workers / k : 1;
  a.out = out;
  const dim3 grid(static_cast<unsigned>((stacked.n_out + a.rows - 1) / a.rows),
                  static_cast<unsigned>(n_tokens));
  return with_part_type(stacked, matvec_k_coalesced(), [&](auto v, int64_t n_blocks) {
    using V = decltype(v);
    a.e.n_blocks = n_blocks;
    if (lanes == 16) {
      launch_pdl(moe_down_combine_kernel<V, 16>, grid, dim3(kThreads), 0, s, a);
    } else {
      launch_pdl(moe_down_combine_kernel<V, 32>, grid, dim3(kThreads), 0, s, a);
    }
    return true;
  });
}

}  // namespace kiln::backend::cuda
