// One token's MoE routing by one warp (moe.cu's moe_topk, and the fused router + top-k of
// moe_decode.cu), as Forward::moe_block computes it on the CPU: softmax over the router logits,
// the top k (ties to the lower expert index), their probabilities renormalised to sum 1. The
// arithmetic repeats the CPU's step by step so that the choice and the weights come out the
// same: exp of (logit - max) rounded to fp32 (evaluated in double here, which rounds as the
// CPU's expf does but for inputs within ~1e-16 of a rounding midpoint), the sum of those in
// double in expert order, each probability the double quotient rounded to fp32, the weight sum
// in fp32 in slot order. Private to the .cu files.
#pragma once

#include <cstdint>

namespace kiln::backend::cuda {

// topk_warp's bounds: a lane holds each chosen expert; a warp's probabilities, for 4 warps a
// CTA, in the 48 KiB of dynamic shared memory a launch gets without asking.
constexpr int kMaxTopk = 32;
constexpr int kTopkMaxExperts = 3072;

__device__ __forceinline__ bool topk_better(float v, int32_t e, float bv, int32_t be) {
  return v > bv || (v == bv && e < be);
}

// Token t's logits r [n_expert] (read with __ldcg: another CTA of the same grid may have
// written them) -> chosen / weights / x_rows [t * k .. + k). p: n_expert floats of shared
// memory for this warp. Every lane of the warp calls it. 1 <= k <= 32, k <= n_expert.
__device__ __forceinline__ void topk_warp(const float* r, int32_t n_expert, int32_t k, float* p,
                                          int lane, int64_t t, int32_t* chosen, float* weights,
                                          int32_t* x_rows) {
  float mx = -INFINITY;
  for (int32_t e = lane; e < n_expert; e += 32) mx = fmaxf(mx, __ldcg(r + e));
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  for (int32_t e = lane; e < n_expert; e += 32)
    p[e] = static_cast<float>(exp(static_cast<double>(__ldcg(r + e) - mx)));
  __syncwarp();
  // The CPU's double sum runs in expert order; one lane repeats it (n_expert adds).
  double sum = 0.0;
  if (lane == 0)
    for (int32_t e = 0; e < n_expert; ++e) sum += p[e];
  sum = __shfl_sync(0xffffffffu, sum, 0);
  for (int32_t e = lane; e < n_expert; e += 32)
    p[e] = static_cast<float>(static_cast<double>(p[e]) / sum);
  __syncwarp();

  // k rounds of a warp argmax (larger probability, then lower index); a chosen expert's entry
  // becomes -1, below every probability. Lane j keeps the j-th choice.
  float my_prob = 0.0f;
  int32_t my_expert = 0;
  for (int32_t j = 0; j < k; ++j) {
    float bv = -INFINITY;
    int32_t be = INT32_MAX;
    for (int32_t e = lane; e < n_expert; e += 32)
      if (topk_better(p[e], e, bv, be)) {
        bv = p[e];
        be = e;
      }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int32_t oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (topk_better(ov, oe, bv, be)) {
        bv = ov;
        be = oe;
      }
    }
    if (lane == j) {
      my_prob = bv;
      my_expert = be;
    }
    __syncwarp();
    if (lane == 0) p[be] = -1.0f;
    __syncwarp();
  }
  float wsum = 0.0f;  // fp32 in slot order, as the CPU
  for (int32_t j = 0; j < k; ++j) wsum += __shfl_sync(0xffffffffu, my_prob, j);
  if (lane < k) {
    chosen[t * k + lane] = my_expert;
    weights[t * k + lane] = my_prob / wsum;
    x_rows[t * k + lane] = static_cast<int32_t>(t);
  }
}

}  // namespace kiln::backend::cuda
