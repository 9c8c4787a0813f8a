// The implementations behind ops.h's attention and small ops: the scalar references (the
// oracles, written to be obviously right) and the AVX2+FMA+F16C kernels (attention_avx2.cpp,
// ops_avx2.cpp). ops.h dispatches between them; tests call both and compare.
//
// Accuracy of the AVX2 path against the references (tests/unit/backend/attention_test.cpp):
//  - exp_avx2 (Cephes-style range reduction and degree-6 polynomial): relative error below
//    4e-7 for x in [-87, 88] (1.2e-7 measured); 0 below -87.33 (where exp would be
//    subnormal), inf never.
//  - attention: scores are the same dot products in another order and the softmax is
//    updated per 16-key block; outputs within 1e-6 of the largest |V| (1e-5 with softcap,
//    whose tanh has an absolute error of about 2e-7 times the cap).
//  - swiglu/geglu: within 1e-6 relative (+1e-30 absolute) of the references; rmsnorm sums
//    squares in double as the reference does.
#pragma once

#include <cstdint>

#include "kiln/backend/cpu/ops.h"

namespace kiln::backend::cpu {

void attention_reference(const KvLayerView& kv, const AttnBatch& b, const float* q, float* out,
                         const AttnParams& params, util::ThreadPool* pool);
void rmsnorm_reference(const float* x, const float* w, float* y, int64_t n_rows, int64_t n,
                       float eps);
void swiglu_reference(const float* gate, const float* up, float* out, int64_t n);
void geglu_reference(const float* gate, const float* up, float* out, int64_t n);

// True when this CPU runs the AVX2 kernels below (AVX2, FMA and F16C on x86-64).
bool avx2_ops_available();

// Requires avx2_ops_available(), block_tokens == 16 and head dims that are multiples of 8
// (attention() falls back to the reference otherwise). Parallel over (sequence, kv head,
// query tile) with dynamic scheduling. A query row's result does not depend on which rows
// share its tile, the batch or the thread count.
void attention_avx2(const KvLayerView& kv, const AttnBatch& b, const float* q, float* out,
                    const AttnParams& params, util::ThreadPool* pool);
bool attention_avx2_supports(const KvLayerView& kv);

void rmsnorm_avx2(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps);
void swiglu_avx2(const float* gate, const float* up, float* out, int64_t n);
void geglu_avx2(const float* gate, const float* up, float* out, int64_t n);
void add_avx2(float* x, const float* y, int64_t n);
void scale_avx2(float* x, float s, int64_t n);
// y[i * stride] = fp16(x[i]), rounding to nearest even (F16C; equal to quant::fp32_to_fp16).
void fp32_to_fp16_avx2(const float* x, uint16_t* y, int64_t n, int64_t stride);
// out[i] = exp(x[i]) with the kernels' vector exp (for its accuracy test).
void exp_avx2(const float* x, float* out, int64_t n);

}  // namespace kiln::backend::cpu
