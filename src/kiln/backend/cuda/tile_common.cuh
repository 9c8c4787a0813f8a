// Pieces the tiled matmuls (mmq.cu, mmh.cu, matmul.cu's direct kernels) share: cp.async into
// shared memory, shared-memory reads at byte offsets, and split-K (the count a launch takes, the
// finish).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kiln/backend/cuda/device.h"

namespace kiln::backend::cuda::tile {

// 16 / 8 / 4 bytes global -> shared (dst: a shared-memory address), asynchronously.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Shared-memory reads at a byte offset from base.
__device__ __forceinline__ uint32_t lds_u32(const uint8_t* base, int off) {  // 4-byte aligned
  return *reinterpret_cast<const uint32_t*>(base + off);
}
__device__ __forceinline__ uint32_t lds_u16(const uint8_t* base, int off) {
  return *reinterpret_cast<const uint16_t*>(base + off);
}
// 4 bytes at a 2-byte aligned offset: two aligned words shifted into place.
__device__ __forceinline__ uint32_t lds4_a2(const uint8_t* base, int off) {
  const int a = off & ~3;
  return __funnelshift_r(lds_u32(base, a), lds_u32(base, a + 4), (off & 3) * 8);
}

// The current device's SMs (132, an H100/H200's, when it cannot say).
inline int sm_count() {
  const int n = current_sm_count();
  return n > 0 ? n : 132;
}

// Split-K's count for a launch of `tiles` output tiles of `per_sm` resident CTAs an SM over
// n_steps K steps (forced > 0: that many): doubled while the CTAs fit the GPU twice over and each
// split keeps 4+ steps, at most max_splits and n_steps; halved until the partial sums of
// `outputs` values per split fit partial_floats; 1 without partials or a counter per tile.
inline int splitk_count(int64_t tiles, int per_sm, int64_t n_steps, int64_t outputs, int forced,
                        int max_splits, float* partials, int64_t partial_floats,
                        int64_t n_counters) {
  int splits = 1;
  if (forced > 0) {
    splits = forced;
  } else {
    while (splits < max_splits && tiles * splits * 2 <= int64_t{per_sm} * sm_count() &&
           n_steps >= 4 * splits * 2)
      splits *= 2;
  }
  splits = static_cast<int>(
      std::clamp<int64_t>(splits, 1, std::min<int64_t>(max_splits, n_steps)));
  while (splits > 1 && splits * outputs > partial_floats) splits /= 2;
  if (tiles > n_counters || partials == nullptr) splits = 1;
  return splits;
}

// Split-K: each of `splits` CTAs of an output tile (kRows rows from row0 x kTokens tokens from
// tok0) has written its partial sums to partials[split][token][row]; the last of them to
// arrive (counter: one per tile, zero before and left zero after) adds them in split order
// into y, so the result does not depend on the order the CTAs ran in. Every thread of the CTA
// calls it after its partial stores.
template <int kRows, int kTokens, int kThreads, int kMaxSplits>
__device__ __forceinline__ void splitk_finish(float* y, const float* partials, int* counter,
                                              int splits, int64_t n_out, int n_tokens,
                                              int64_t row0, int tok0) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1) == splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = threadIdx.x; i < kRows * kTokens; i += kThreads) {
    const int64_t row = row0 + i % kRows;
    const int tok = tok0 + i / kRows;
    if (row >= n_out || tok >= n_tokens) continue;
    const float* p = partials + tok * n_out + row;
    float part[kMaxSplits];  // every load in flight at once, then the sum in split order
#pragma unroll
    for (int k = 0; k < kMaxSplits; ++k)
      part[k] = k < splits ? __ldcg(p + int64_t{k} * n_tokens * n_out) : 0.0f;
    float v = part[0];
#pragma unroll
    for (int k = 1; k < kMaxSplits; ++k)
      if (k < splits) v += part[k];
    y[tok * n_out + row] = v;
  }
  if (threadIdx.x == 0) *counter = 0;
}

}  // namespace kiln::backend::cuda::tile
