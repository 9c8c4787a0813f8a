// The paged KV cache's layout per layer (kernels.h): host arithmetic, beside the kernels that
// read it (attention.cu).
#include <optional>

#include "kiln/backend/cuda/kernels.h"
#include "kiln/quant/types.h"
#include "kiln/util/status.h"

namespace kiln::backend::cuda {

int64_t kv_block_bytes(quant::Type type, int32_t block_tokens, int32_t n_kv_heads,
                       int32_t head_dim) {
  const std::optional<uint64_t> row = quant::row_bytes(type, static_cast<uint64_t>(head_dim));
  KILN_ASSERT(row.has_value());
  return int64_t{block_tokens} * n_kv_heads * static_cast<int64_t>(*row);
}

KvLayer make_kv_layer(quant::Type type, uint8_t* k, uint8_t* v, int32_t block_tokens,
                      int32_t n_kv_heads, int32_t head_dim_k, int32_t head_dim_v) {
  KvLayer kv;
  kv.type = type;
  kv.k = k;
  kv.v = v;
  kv.block_tokens = block_tokens;
  kv.n_kv_heads = n_kv_heads;
  kv.head_dim_k = head_dim_k;
  kv.head_dim_v = head_dim_v;
  kv.k_block_bytes = kv_block_bytes(type, block_tokens, n_kv_heads, head_dim_k);
  kv.v_block_bytes = kv_block_bytes(type, block_tokens, n_kv_heads, head_dim_v);
  return kv;
}

}  // namespace kiln::backend::cuda
