// Mixture-of-experts routing and combination (kernels.h), as Forward::moe_block computes them on
// the CPU (qwen3moe): softmax over the router logits, the top k (ties to the lower expert index),
// their probabilities renormalised to sum 1; then each token's expert outputs summed in slot
// order with those weights.
//
// moe_topk repeats the CPU's arithmetic step by step so the choice and the weights come out the
// same (moe_topk.cuh says how).
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/moe_topk.cuh"
#include "kiln/backend/cuda/pdl.cuh"

namespace kiln::backend::cuda {
namespace {

constexpr int kTopkWarps = 4;  // tokens per block, one warp each

// KILN_ASSERT's header pulls in fmt, which nvcc's C++20 front end rejects; the same check here.
void require(bool cond, const char* what) {
  if (cond) return;
  std::fprintf(stderr, "kiln: assertion failed: %s at %s\n", what, __FILE__);
  std::abort();
}

// Dynamic shared memory: kTopkWarps * n_expert floats (one token's probabilities per warp).
__global__ void moe_topk_kernel(const float* logits, int64_t n_tokens, int32_t n_expert, int32_t k,
                                int32_t* chosen, float* weights, int32_t* x_rows) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = int64_t{blockIdx.x} * kTopkWarps + warp;
  pdl_start();  // the router logits come from the kernel before
  if (t >= n_tokens) return;  // whole warps only: nothing below syncs the block
  topk_warp(logits + t * n_expert, n_expert, k, smem + warp * n_expert, lane, t, chosen, weights,
            x_rows);
}

// out[t][c] = sum_j w[t*k+j] * slots[t*k+j][c], rounded per product and per add in slot order
// from 0 (the CPU writes w * out per slot, then adds the slots to a zeroed row).
__global__ void moe_combine_kernel(const float* slots, const float* weights, int64_t n_tokens,
                                   int32_t k, int64_t n, float* out, bool vec) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  pdl_start();  // the expert outputs come from the kernel before
  if (vec) {
    const int64_t n4 = n / 4, total = n_tokens * n4;
    const float4* s4 = reinterpret_cast<const float4*>(slots);
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += stride) {
      const int64_t t = i / n4, c = i - t * n4;
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int32_t j = 0; j < k; ++j) {
        const float w = weights[t * k + j];
        const float4 v = s4[(t * k + j) * n4 + c];
        acc.x = __fadd_rn(acc.x, __fmul_rn(w, v.x));
        acc.y = __fadd_rn(acc.y, __fmul_rn(w, v.y));
        acc.z = __fadd_rn(acc.z, __fmul_rn(w, v.z));
        acc.w = __fadd_rn(acc.w, __fmul_rn(w, v.w));
      }
      reinterpret_cast<float4*>(out)[i] = acc;
    }
    return;
  }
  const int64_t total = n_tokens * n;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t t = i / n, c = i - t * n;
    float acc = 0.0f;
    for (int32_t j = 0; j < k; ++j)
      acc = __fadd_rn(acc, __fmul_rn(weights[t * k + j], slots[(t * k + j) * n + c]));
    out[i] = acc;
  }
}

}  // namespace

void moe_topk(const float* logits, int64_t n_tokens, int32_t n_expert, int32_t k, int32_t* chosen,
              float* weights, int32_t* x_rows, cudaStream_t s) {
  if (n_tokens <= 0) return;
  require(k >= 1 && k <= kMaxTopk && k <= n_expert, "moe_topk: 1 <= k <= min(32, n_expert)");
  require(n_expert <= kTopkMaxExperts, "moe_topk: n_expert <= 3072");
  const size_t smem = size_t{kTopkWarps} * n_expert * sizeof(float);
  const int64_t blocks = (n_tokens + kTopkWarps - 1) / kTopkWarps;
  launch_pdl(moe_topk_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kTopkWarps * 32), smem, s,
             logits, n_tokens, n_expert, k, chosen, weights, x_rows);
}

__global__ void moe_localize_kernel(int32_t* chosen, float* weights, int64_t pairs,
                                    int32_t first, int32_t held) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= pairs) return;
  const int32_t e = chosen[i] - first;
  const bool mine = e >= 0 && e < held;
  chosen[i] = mine ? e : 0;
  if (!mine) weights[i] = 0.0f;
}

void moe_localize(int32_t* chosen, float* weights, int64_t pairs, int32_t first, int32_t held,
                  cudaStream_t s) {
  if (pairs <= 0) return;
  constexpr int kThreads = 256;
  moe_localize_kernel<<<static_cast<unsigned>((pairs + kThreads - 1) / kThreads), kThreads, 0, s>>>(
      chosen, weights, pairs, first, held);
}

void moe_combine(const float* slots, const float* weights, int64_t n_tokens, int32_t k, int64_t n,
                 float* out, cudaStream_t s) {
  if (n_tokens <= 0 || n <= 0) return;
  const bool vec = n % 4 == 0 && (reinterpret_cast<uintptr_t>(slots) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(out) & 15) == 0;
  const int64_t items = n_tokens * (vec ? n / 4 : n);
  constexpr int kThreads = 256;
  int64_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks > 2048) blocks = 2048;
  launch_pdl(moe_combine_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, s, slots,
             weights, n_tokens, k, n, out, vec);
}

}  // namespace kiln::backend::cuda
