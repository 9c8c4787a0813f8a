// On-the-fly quantization of activations for the integer matmul kernels (llama.cpp's
// quantize_row_q8_0 / quantize_row_q8_K, in a struct-of-arrays layout the kernels load
// directly): per token row, int8 values qs[n_in], one fp32 scale per block (32 elements for
// the Q8_0 format, 256 for Q8_K) and, for Q8_K, the sum of every 16 consecutive qs.
//
// Per block: d = amax / 127, q = round_half_even(x / d) clamped to [-127, 127] (so
// |q| <= 127 always, which the kernels' 16-bit pair sums rely on), d = 0 and q = 0 for an
// all-zero block. A token row is quantized the same way whatever the batch around it, so the
// kernels stay batch invariant.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/quant/types.h"
#include "kiln/util/thread_pool.h"

namespace kiln::backend::cpu {

enum class ActFormat {
  F32,   // activations stay fp32 (F32, F16, BF16 weights)
  Q8_0,  // blocks of 32 (Q8_0, Q4_0 weights)
  Q8_K,  // blocks of 256 with 16-element sums (Q4_K, Q5_K, Q6_K weights)
};

// The activation format the kernels use for a weight type; F32 for types without kernels.
ActFormat act_format(quant::Type weight_type);
// Elements per activation block: 1, 32 or 256.
int act_block_elems(ActFormat f);

// Quantized activations of n_tokens rows of n_in elements. Row t of each array starts at
// t * *_stride (strides in elements; qs_stride is a multiple of 64 bytes).
struct QuantizedActs {
  ActFormat format = ActFormat::F32;
  int64_t n_in = 0;
  int64_t n_tokens = 0;
  int64_t qs_stride = 0;
  int64_t d_stride = 0;
  int64_t bsums_stride = 0;    // 0 unless Q8_K
  int64_t offs_stride = 0;     // 0 unless Q8_0
  int64_t bsums32_stride = 0;  // 0 unless Q8_K
  std::vector<int8_t> qs;
  std::vector<float> d;
  std::vector<int16_t> bsums;
  // Starting values of the packed kernels' integer accumulators (backend/cpu/pack.h). Q8_0:
  // -128 x the sum of each block's qs (the weight bytes are stored +128, unsigned: sum((w +
  // 128) x) - 128 sum(x) is sum(w x) exactly). Q8_K: -32 x each 16-sum (Q6_K's -32 offset).
  std::vector<int32_t> offs;
  // Q8_K: the sum of every 32 consecutive qs (the packed Q4_K kernel's min term).
  std::vector<int16_t> bsums32;
};

// Quantizes one row of n elements (a multiple of the block) into qs[n], d[n / block] and,
// when bsums is non-null, bsums[n / 16]. Uses the AVX2 version where the small ops do
// (ops.h: the CPU has AVX2 and the ops mode is Fast, i.e. KILN_SCALAR_OPS is not 1); both
// give the same bits.
void quantize_act_row(const float* x, int64_t n, int block_elems, int8_t* qs, float* d,
                      int16_t* bsums);
// The scalar reference and the AVX2 version (x86-64 with AVX2 only; block_elems a multiple
// of 32).
void quantize_act_row_scalar(const float* x, int64_t n, int block_elems, int8_t* qs, float* d,
                             int16_t* bsums);
void quantize_act_row_avx2(const float* x, int64_t n, int block_elems, int8_t* qs, float* d,
                           int16_t* bsums);

// Quantizes x ([n_tokens, n_in]) into out (grown as needed, never shrunk). format must not
// be F32 and n_in must be a multiple of its block. Splits tokens over pool when given.
void quantize_acts(ActFormat format, const float* x, int64_t n_tokens, int64_t n_in,
                   QuantizedActs* out, util::ThreadPool* pool);

}  // namespace kiln::backend::cpu
