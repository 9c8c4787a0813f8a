// The batched int8 tensor-core matmul (mmq.cu) and the matmul context's switch for it: a
// header of its own beside kernels.h, which matmul.cu, mmq.cu and their tests include.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kiln/backend/cuda/kernels.h"

namespace kiln::backend::cuda {

// The largest token count the context's int8 activations (and so the mmq path) can hold.
constexpr int kMmqMaxTokens = 256;
// Whether mmq takes w: Q4_0 or Q8_0 with n_in % 32 == 0, Q4_K, Q5_K or Q6_K with n_in % 256 ==
// 0 (any 2-byte aligned rows).
bool mmq_supports(const Weight& w);
// Device scratch for mmq's split-K (partial sums and one counter per output tile, zero between
// launches: each launch leaves them so). tile_tokens (16, 32, 64) and splits force a tiling
// (for benchmarks and tests); 0 lets mmq choose from the shape.
struct MmqScratch {
  float* partials = nullptr;
  int64_t partial_floats = 0;
  int32_t* counters = nullptr;
  int64_t n_counters = 0;
  int tile_tokens = 0;
  int splits = 0;
};
// y = w x for n_tokens of x quantized by quantize_q8_32 (xq [n_tokens, w.n_in], xds [n_tokens,
// w.n_in / 32]), with int8 MMA on the weights as stored (mmq.cu says how): the exact weights'
// dot with the rounded activations up to fp32 summation, as matvec_q8. Meant for 9..~256
// tokens; any count works.
void mmq(const Weight& w, float* y, const int8_t* xq, const float2* xds, int64_t n_tokens,
         const MmqScratch& scratch, cudaStream_t s);

// For benchmarks and tests: the context's matmul sends 9..max_tokens tokens to mmq for weights
// of every size (at most what its int8 activations hold; 0: none, everything above 8 tokens goes
// to dequantize + cuBLAS), with the tiling forced when tile_tokens / splits are nonzero
// (MmqScratch). By default mmq takes 9..64 tokens for weights of 4096 x 4096 values or more,
// 9..16 for smaller ones (matmul.cu).
void matmul_set_mmq(MatmulContext* ctx, int64_t max_tokens, int tile_tokens = 0, int splits = 0);

}  // namespace kiln::backend::cuda
