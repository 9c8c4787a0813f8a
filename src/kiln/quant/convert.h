// Reference (scalar, plainly written) conversion of rows between fp32 and the GGUF tensor
// types. These are the oracles that every fast kernel (SIMD, CUDA) is tested against:
// dequantize_row is bit-exact with ggml's dequantize_row_* for the same block bytes.
//
// A "row" is n consecutive elements; for a blocked type n must be a multiple of the block
// size and the row takes row_bytes(type, n) bytes (types.h). The quantized side may be at
// any address (blocks are read and written with memcpy).
#pragma once

#include <cstdint>

#include "kiln/quant/types.h"
#include "kiln/util/status.h"

namespace kiln::quant {

// F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
// IQ4_NL, IQ4_XS.
bool can_dequantize(Type type);
// The types quantize_row can write (see docs/quant.md for the list).
bool can_quantize(Type type);

// Decode n elements of `type` at src into dst[0..n). Errors: a type without a reference
// decoder, n negative or not a multiple of the block, a null pointer with n > 0.
Status dequantize_row(Type type, const void* src, float* dst, int64_t n);

// Encode src[0..n) as `type` into dst (row_bytes(type, n) bytes). Deterministic. For the
// block types finite input gives finite output: scales that overflow f16 saturate at 65504,
// inputs too small for the f16 scales encode as zeros. Plain F16/BF16 round as IEEE, so
// values past their range become inf. Errors as for dequantize_row.
Status quantize_row(Type type, const float* src, void* dst, int64_t n);

}  // namespace kiln::quant
