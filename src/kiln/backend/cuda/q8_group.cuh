// Quantizing a matmul's input to int8 inside the kernel that produces it (rmsnorm, swiglu), so
// the matvec (matvec.cu) needs no quantize kernel of its own. Private to the .cu files.
#pragma once

#include <cstdint>

namespace kiln::backend::cuda {

// The 32 values held by 8 consecutive lanes (a float4 each, the group's first at lane % 8 == 0)
// quantized exactly as matvec.cu's quantize_q8_32: d = max|x| / 127, levels round(x / d), and
// (d, d * sum of levels). Writes the lane's 4 levels at q and, from the group's first lane, the
// pair at ds, when `active`. Every lane of the warp must call it (the shuffles); an inactive
// lane passes zeros, and a group is wholly active or not.
__device__ __forceinline__ void q8_group4(float4 v, bool active, int8_t* q, float2* ds) {
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int o = 1; o < 8; o *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.0f;
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  const int q0 = __float2int_rn(v.x * inv), q1 = __float2int_rn(v.y * inv);
  const int q2 = __float2int_rn(v.z * inv), q3 = __float2int_rn(v.w * inv);
  int sum = q0 + q1 + q2 + q3;
#pragma unroll
  for (int o = 1; o < 8; o *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (active) {
    *reinterpret_cast<char4*>(q) =
        make_char4(static_cast<signed char>(q0), static_cast<signed char>(q1),
                   static_cast<signed char>(q2), static_cast<signed char>(q3));
    if ((threadIdx.x & 7) == 0) *ds = make_float2(d, d * static_cast<float>(sum));
  }
}

}  // namespace kiln::backend::cuda
