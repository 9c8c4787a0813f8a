// Paged KV cache storage: fixed blocks of kBlockTokens tokens. Layout per layer and block:
// K as [kBlockTokens][n_kv_heads][head_dim], V the same, F32 for now (F16/Q8_0 later).
// Which block belongs to which sequence is the block manager's business (block_pool.h); this
// class only owns the memory.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/util/status.h"

namespace kiln::kv {

inline constexpr int32_t kBlockTokens = 16;

struct KvShape {
  int32_t n_layer = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;
};

class KvCache {
 public:
  // Sizes the cache from a byte budget; at least one block. Errors on an absurd shape.
  static Expected<KvCache> create(const KvShape& shape, uint64_t budget_bytes);
  static uint64_t bytes_per_block(const KvShape& shape);

  int32_t num_blocks() const { return num_blocks_; }
  const KvShape& shape() const { return shape_; }

  // [kBlockTokens][n_kv_heads][head_dim] for (layer, block).
  float* k_block(int32_t layer, int32_t block) { return k_.data() + k_offset(layer, block); }
  float* v_block(int32_t layer, int32_t block) { return v_.data() + v_offset(layer, block); }
  const float* k_block(int32_t layer, int32_t block) const {
    return k_.data() + k_offset(layer, block);
  }
  const float* v_block(int32_t layer, int32_t block) const {
    return v_.data() + v_offset(layer, block);
  }

 private:
  size_t k_offset(int32_t layer, int32_t block) const {
    return (static_cast<size_t>(layer) * num_blocks_ + block) * k_block_elems_;
  }
  size_t v_offset(int32_t layer, int32_t block) const {
    return (static_cast<size_t>(layer) * num_blocks_ + block) * v_block_elems_;
  }

  KvShape shape_;
  int32_t num_blocks_ = 0;
  size_t k_block_elems_ = 0;
  size_t v_block_elems_ = 0;
  std::vector<float> k_;
  std::vector<float> v_;
};

}  // namespace kiln::kv
