// attention()'s two kernels, callable one by one for the tests and the benchmark: each
// handles any batch (mixed decode and prefill); attention() picks by max_q_len.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kiln/backend/cuda/kernels.h"

namespace kiln::backend::cuda {

enum class AttnKernel {
  Auto,     // Decode when max_q_len <= 1, else Prefill
  Decode,   // one CTA per (query row, kv head, <= 8 query heads, context split); split-K
  Prefill,  // one CTA per (sequence, tile of query rows, kv head, <= 8 query heads)
  // The tensor-core prefill (attention_tc.cu) where it takes the cache (F16, dk == dv in
  // {64, 128}), else Prefill. Auto takes it for max_q_len > 1 unless KILN_CUDA_ATTN_TC=0.
  PrefillTc,
};

// Returns whether p.xq / p.xds now hold out quantized (as attention()).
bool attention_with(AttnKernel kernel, const KvLayer& kv, const AttnBatch& b, int64_t n_tokens,
                    int32_t max_q_len, const float* q, float* out, const AttnParams& p,
                    cudaStream_t s);

// The tensor-core prefill: whether it takes this cache, and the launch (false, nothing run,
// when it does not).
bool attention_prefill_tc_supports(const KvLayer& kv);
bool attention_prefill_tc(const KvLayer& kv, const AttnBatch& b, int64_t n_tokens,
                          int32_t max_q_len, const float* q, float* out, const AttnParams& p,
                          cudaStream_t s);

// The context splits the decode kernel uses for this shape (1 = no split-K).
int32_t attention_decode_splits(const KvLayer& kv, int64_t n_tokens, const AttnParams& p);

}  // namespace kiln::backend::cuda
