// Rotary embedding (kernels.h): the step's cos/sin tables and their application to Q/K, as
// cpu::rope_angles and cpu::rope_apply. The angles are evaluated in double as on the CPU, so the
// tables agree to the rounding of cos/sin (within an fp32 ulp); the rotation rounds each
// product and sum as the CPU does (the _rn intrinsics stop nvcc from fusing them into FMAs),
// so equal tables give equal rotated values.
#include <cstdint>

#include <cuda_runtime.h>

#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/pdl.cuh"
#include "kiln/backend/cuda/rope.cuh"

namespace kiln::backend::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 2048;

int grid_for(int64_t n_items) {
  const int64_t blocks = (n_items + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

// cos/sin [n_tokens, n_pairs]: attn_factor * cos(positions[t] * inv_freq[i]) in double.
__global__ void rope_angles_kernel(const double* inv_freq, int32_t n_pairs,
                                   const int32_t* positions, int64_t n_tokens, float attn_factor,
                                   float* cos_out, float* sin_out) {
  const int64_t total = n_tokens * n_pairs;
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = idx / n_pairs;
    const int32_t i = static_cast<int32_t>(idx - t * n_pairs);
    const double theta = static_cast<double>(positions[t]) * inv_freq[i];
    double sd, cd;
    sincos(theta, &sd, &cd);
    float c = static_cast<float>(cd), s = static_cast<float>(sd);
    if (attn_factor != 1.0f) {
      c *= attn_factor;
      s *= attn_factor;
    }
    cos_out[idx] = c;
    sin_out[idx] = s;
  }
}

// One thread per (token, head, pair); x [n_tokens, n_heads, head_dim] in place. Heads
// n_heads .. n_heads + n_heads2 are those of x2 [n_tokens, n_heads2, head_dim] (q and k in one
// launch).
__global__ void rope_apply_kernel(float* x, int64_t n_tokens, int32_t n_heads, int32_t head_dim,
                                  int32_t n_pairs, bool neox, const float* cos_in,
                                  const float* sin_in, float* x2, int32_t n_heads2) {
  pdl_start();
  const int32_t all_heads = n_heads + n_heads2;
  const int64_t total = n_tokens * all_heads * n_pairs;
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t th = idx / n_pairs;  // t * all_heads + h
    const int32_t i = static_cast<int32_t>(idx - th * n_pairs);
    const int64_t t = th / all_heads;
    const int32_t h = static_cast<int32_t>(th - t * all_heads);
    float* v = h < n_heads ? x + (t * n_heads + h) * head_dim
                           : x2 + (t * n_heads2 + h - n_heads) * head_dim;
    rope_pair(v, i, n_pairs, neox, cos_in[t * n_pairs + i], sin_in[t * n_pairs + i]);
  }
}

}  // namespace

void rope_angles(const double* inv_freq, int32_t n_pairs, const int32_t* positions,
                 int64_t n_tokens, float attn_factor, float* cos, float* sin, cudaStream_t s) {
  if (n_tokens <= 0 || n_pairs <= 0) return;
  rope_angles_kernel<<<grid_for(n_tokens * n_pairs), kThreads, 0, s>>>(
      inv_freq, n_pairs, positions, n_tokens, attn_factor, cos, sin);
}

void rope_apply(float* x, int64_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t n_pairs,
                bool neox, const float* cos, const float* sin, cudaStream_t s) {
  if (n_tokens <= 0 || n_heads <= 0 || n_pairs <= 0) return;
  launch_pdl(rope_apply_kernel, dim3(grid_for(n_tokens * n_heads * n_pairs)), dim3(kThreads), 0, s,
             x, n_tokens, n_heads, head_dim, n_pairs, neox, cos, sin, nullptr, 0);
}

void rope_apply2(float* x, int32_t n_heads, float* x2, int32_t n_heads2, int64_t n_tokens,
                 int32_t head_dim, int32_t n_pairs, bool neox, const float* cos, const float* sin,
                 cudaStream_t s) {
  if (n_tokens <= 0 || n_heads + n_heads2 <= 0 || n_pairs <= 0) return;
  launch_pdl(rope_apply_kernel, dim3(grid_for(n_tokens * (n_heads + n_heads2) * n_pairs)),
             dim3(kThreads), 0, s, x, n_tokens, n_heads, head_dim, n_pairs, neox, cos, sin, x2,
             n_heads2);
}

}  // namespace kiln::backend::cuda
