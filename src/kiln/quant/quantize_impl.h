// Per-type reference quantizers behind quantize_row (convert.h). Each writes num_blocks
// blocks of its type from num_blocks * block_elems floats. Internal to the quant room.
#pragma once

#include <cstdint>

namespace kiln::quant::detail {

// A scale for an f16 field: round to nearest, but saturate at the largest finite f16
// (65504) instead of overflowing to inf, and map NaN to 0, so finite input never yields a
// non-finite block.
uint16_t scale_to_fp16(float d);

// The value of largest magnitude, with its sign (0 for an all-zero group).
float signed_absmax(const float* x, int n);

// xs[i] = x[i] / max|x| (so the scale fits' sums of squares can neither overflow nor
// underflow whatever the input's magnitude); returns max|x|, 0 for an all-zero group (xs
// then untouched).
float normalize_by_absmax(const float* x, int n, float* xs);

void quantize_q2_k(const float* x, void* dst, int64_t num_blocks);
void quantize_q3_k(const float* x, void* dst, int64_t num_blocks);
void quantize_q4_k(const float* x, void* dst, int64_t num_blocks);
void quantize_q5_k(const float* x, void* dst, int64_t num_blocks);
void quantize_q6_k(const float* x, void* dst, int64_t num_blocks);
void quantize_iq4_nl(const float* x, void* dst, int64_t num_blocks);
void quantize_iq4_xs(const float* x, void* dst, int64_t num_blocks);

}  // namespace kiln::quant::detail
