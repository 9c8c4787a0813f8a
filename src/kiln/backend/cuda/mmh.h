// The batched quantized matmul on fp16 tensor cores with the weights dequantized in registers
// (mmh.cu): beside mmq.h, which matmul.cu, mmh.cu and their tests include.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/mmq.h"

namespace kiln::backend::cuda {

// Whether mmh takes w: Q4_K or Q5_K with 16-byte aligned rows (data and row_bytes), Q6_K or Q8_0
// (any 2-byte aligned rows); n_in % 256 == 0 either way; on an sm_90 GPU (wgmma).
bool mmh_supports(const Weight& w);
// x [n_tokens, n_in] (fp32, n_in % 256 == 0, 16-byte aligned) rounded to fp16 into xh (room for
// n_tokens rounded up to 8, x n_in values) in mmh's layout (mmh.cu says which): one pass shared
// by every mmh call on x.
void mmh_prepare(const float* x, int64_t n_tokens, int64_t n_in, __half* xh, cudaStream_t s);
// y [n_tokens, w.n_out] = w x for x as mmh_prepare wrote it: each weight dequantized to fp16
// (one rounding), products summed in fp32 on the tensor cores, as dequantize + cuBLAS computes
// it up to the order of the sums. The split-K scratch and forced tiling are mmq's
// (MmqScratch; tile_tokens 16, 32 or 64). Meant for 9..~128 tokens; any count works. With
// scratch.by_shape a token's row is the same bits whatever n_tokens and the other tokens (the
// split count by the weight's shape, tokens in runs the scratch holds; a column of wgmma's
// product does not depend on the others).
void mmh(const Weight& w, float* y, const __half* xh, int64_t n_tokens, const MmqScratch& scratch,
         cudaStream_t s);
// ys[i] = ws[i] x for weights of one type sharing x (as mmh_prepare wrote it), up to 4 in one
// launch (more launches when there are more or the split-K scratch cannot hold their sums at
// once): each weight's result bit for bit what mmh gives it alone (its own split count,
// summation order and tiling). Weights mmh does not take, or of another type or length than
// ws[0], are skipped; at most 16 weights are taken.
void mmh_shared(const Weight* const* ws, float* const* ys, int n_w, const __half* xh,
                int64_t n_tokens, const MmqScratch& scratch, cudaStream_t s);

// For benchmarks and tests: the context's matmul sends 9..max_tokens tokens to mmh for the
// weights it takes (0: none), with the tiling forced when tile_tokens / splits are nonzero.
// By default 9..kMmhDefaultTokens (matmul.cu); KILN_CUDA_MMH=0 turns it off.
void matmul_set_mmh(MatmulContext* ctx, int64_t max_tokens, int tile_tokens = 0, int splits = 0);

}  // namespace kiln::backend::cuda
