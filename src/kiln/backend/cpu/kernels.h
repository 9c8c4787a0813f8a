// Matmul kernels of the CPU backend, one set per instruction-set path. Internal to the
// backend (matmul.h is the public entry); tests use it to compare the paths.
//
// Arithmetic contract (what makes the matmul batch invariant): a kernel computes each
// output y[t][o] = dot(W row o, x row t) with a fixed sequence of operations that depends
// only on the path, the weight type and n_in: never on n_tokens, on which rows and tokens
// share a register tile, or on the thread that runs it. Quantized types: per block, an exact
// integer dot of the weight's integer values with the int8 activations, then fp32
// multiply-adds by the block scales into per-lane fp32 accumulators, blocks in order, and a
// fixed horizontal sum at the end. Float types: per-lane fused multiply-adds over
// 16-element steps (zero-padded tail), fixed horizontal sum.
#pragma once

#include <cstdint>

#include "kiln/backend/cpu/matmul.h"
#include "kiln/backend/cpu/pack.h"
#include "kiln/backend/cpu/quantize_act.h"
#include "kiln/backend/weight.h"

namespace kiln::backend::cpu {

// One call computes output rows [row_begin, row_end) for all n_tokens tokens.
struct GemmArgs {
  const Weight* w = nullptr;
  const float* x = nullptr;          // ActFormat::F32: [n_tokens, n_in]
  const QuantizedActs* a = nullptr;  // quantized formats
  float* y = nullptr;                // [n_tokens, w->n_out]
  int64_t n_tokens = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
};
using GemmFn = void (*)(const GemmArgs&);

// The kernel for a weight type on a path, or null when that path has none for the type
// (or was not compiled for this architecture).
GemmFn gemm_scalar(quant::Type t);
GemmFn gemm_avx2(quant::Type t);
GemmFn gemm_avx512(quant::Type t);
// Kernels for weights with a packed copy (packed_copy(*w), pack.h) of pack_rows(path) rows: 8 for
// AVX2, 16 for AVX-512; null for types without one. The SIMD paths compute the same integers
// and fp32 operations per row, so they agree bit for bit.
GemmFn gemm_packed_avx2(quant::Type t);
GemmFn gemm_packed_avx512(quant::Type t);

// Scalar reference dots (the oracles): one weight row against one activation row.
// Quantized: per block acc += (d_w * d_x) * isum (minus the dmin term for Q4_K/Q5_K), in
// block order. xq/xd/xbs: the token's qs, d and (Q8_K) bsums.
float vec_dot_q8_0_scalar(const uint8_t* w, const int8_t* xq, const float* xd, int64_t n);
float vec_dot_q4_0_scalar(const uint8_t* w, const int8_t* xq, const float* xd, int64_t n);
float vec_dot_q4_k_scalar(const uint8_t* w, const int8_t* xq, const float* xd, int64_t n);
float vec_dot_q5_k_scalar(const uint8_t* w, const int8_t* xq, const float* xd, int64_t n);
float vec_dot_q6_k_scalar(const uint8_t* w, const int8_t* xq, const float* xd, int64_t n);
// Float types: sequential fp32 sum of w[i] * x[i].
float vec_dot_f32_scalar(const uint8_t* w, const float* x, int64_t n);
float vec_dot_f16_scalar(const uint8_t* w, const float* x, int64_t n);
float vec_dot_bf16_scalar(const uint8_t* w, const float* x, int64_t n);

}  // namespace kiln::backend::cpu
