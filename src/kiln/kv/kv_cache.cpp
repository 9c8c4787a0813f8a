#include "kiln/kv/kv_cache.h"

#include <algorithm>

namespace kiln::kv {

uint64_t KvCache::bytes_per_block(const KvShape& s) {
  return static_cast<uint64_t>(s.n_layer) * kBlockTokens * s.n_kv_heads *
         (static_cast<uint64_t>(s.head_dim_k) + s.head_dim_v) * sizeof(float);
}

Expected<KvCache> KvCache::create(const KvShape& s, uint64_t budget_bytes) {
  if (s.n_layer <= 0 || s.n_kv_heads <= 0 || s.head_dim_k <= 0 || s.head_dim_v <= 0)
    return err("kv: invalid cache shape (layers {}, kv heads {}, head dims {}/{})", s.n_layer,
               s.n_kv_heads, s.head_dim_k, s.head_dim_v);
  const uint64_t per_block = bytes_per_block(s);
  const uint64_t blocks = std::max<uint64_t>(1, budget_bytes / per_block);
  if (blocks > (1u << 30)) return err("kv: budget of {} bytes is too large", budget_bytes);
  KvCache c;
  c.shape_ = s;
  c.num_blocks_ = static_cast<int32_t>(blocks);
  c.k_block_elems_ = static_cast<size_t>(kBlockTokens) * s.n_kv_heads * s.head_dim_k;
  c.v_block_elems_ = static_cast<size_t>(kBlockTokens) * s.n_kv_heads * s.head_dim_v;
  c.k_.assign(c.k_block_elems_ * s.n_layer * blocks, 0.0f);
  c.v_.assign(c.v_block_elems_ * s.n_layer * blocks, 0.0f);
  return c;
}

}  // namespace kiln::kv
