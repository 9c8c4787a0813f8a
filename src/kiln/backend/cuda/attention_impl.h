// attention()'s two kernels, callable one by one for the tests and the benchmark: each
// handles any batch (mixed decode and prefill); attention() picks by max_q_len.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kiln/backend/cuda/kernels.h"

namespace kiln::backend::cuda {

enum class AttnKernel {
  Auto,    // DecodeTc (else Decode) when max_q_len <= 1, else PrefillTc (else Prefill)
  Decode,  // one CTA per (query row, kv head, <= 8 query heads, context split); split-K
  // Decode's CTAs and splits on the tensor cores, with K and V loaded straight into mma
  // fragments, where it takes the cache (F16, dk == dv in {64, 128, 256}), else Decode. Auto
  // takes it for decode rows unless KILN_CUDA_ATTN_DECODE_TC=0.
  DecodeTc,
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

bool attention_decode_tc_supports(const KvLayer& kv);

// The context splits the decode kernel uses for this shape (1 = no split-K).
// (Auto: the kernel attention() picks for a decode batch.)
int32_t attention_decode_splits(const KvLayer& kv, int64_t n_tokens, const AttnParams& p,
                                AttnKernel kernel = AttnKernel::Auto);

}  // namespace kiln::backend::cuda
