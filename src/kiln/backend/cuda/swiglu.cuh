// silu(g) * u as the swiglu op computes it (ops_elementwise.cu), shared with the kernels that
// fuse it into their own work (moe_decode.cu), so that a fused activation gives the same bits.
// Private to the .cu files.
#pragma once

namespace kiln::backend::cuda {

// The reference's order: (g / (1 + exp(-g))) * u; expf is the accurate one (no
// -use_fast_math), within 2 ulp.
__device__ __forceinline__ float swiglu_value(float g, float u) {
  return g / (1.0f + expf(-g)) * u;
}

}  // namespace kiln::backend::cuda
