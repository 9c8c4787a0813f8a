// The RMS norm of one row as rmsnorm_kernel (ops_elementwise.cu) computes it, shared with the
// kernels that fuse a norm into their own work (rope_kv_write's per-head q/k norms), so that a
// fused norm gives the same bits as the separate op. Private to the .cu files.
#pragma once

#include <cstdint>

namespace kiln::backend::cuda {

// The sum of v over the block, in double, every thread ending with the total: a butterfly over
// each warp, then over the warps' partials. Its order depends only on blockDim.x, and threads
// that add 0.0 do not change it (a block of 128 threads of which the first 32 hold values sums
// as a block of 32). Calls must be separated by a __syncthreads (the partials are reused).
__device__ __forceinline__ double block_sum(double v) {
  __shared__ double partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < n_warps ? partial[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;  // every thread holds the total
}

// 1 / rms of a row of n values held as one float4 per thread (zeros past the row): the sum of
// squares in double (each fp32 square exact), float(1 / sqrt(mean + eps)) in double. Every
// thread of the block calls it.
__device__ __forceinline__ float row_rms_inv(float4 v, int64_t n, float eps) {
  const double sum = block_sum(static_cast<double>(v.x) * v.x + static_cast<double>(v.y) * v.y +
                               static_cast<double>(v.z) * v.z + static_cast<double>(v.w) * v.w);
  return static_cast<float>(1.0 / sqrt(sum / static_cast<double>(n) + eps));
}

// (x * inv) * w in fp32, per value.
__device__ __forceinline__ float4 row_rms_apply(float4 v, float inv, float4 g) {
  return make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
}

}  // namespace kiln::backend::cuda
