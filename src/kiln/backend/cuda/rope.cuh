// The rotation of one rope pair, shared by rope.cu and the fused rope + KV write
// (attention.cu). Private to the .cu files.
#pragma once

#include <cstdint>

namespace kiln::backend::cuda {

// Rotates pair i of the head row v (dims i and i + n_pairs for neox, 2i and 2i + 1 otherwise)
// by (c, s), rounding each product and sum as the CPU does (the _rn intrinsics stop nvcc from
// fusing them into FMAs), so equal tables give equal rotated values.
__device__ __forceinline__ void rope_pair(float* v, int32_t i, int32_t n_pairs, bool neox, float c,
                                          float s) {
  const int32_t a = neox ? i : 2 * i;
  const int32_t b = neox ? i + n_pairs : 2 * i + 1;
  const float x0 = v[a], x1 = v[b];
  v[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  v[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

}  // namespace kiln::backend::cuda
