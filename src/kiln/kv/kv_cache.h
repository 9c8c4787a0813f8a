// Paged KV cache storage: fixed blocks of kBlockTokens tokens, per layer a K and a V array of
// blocks. The cache type is F16 (default), F32 or Q8_0; with Q8_0 each head's row is
// head_dim / 32 ggml block_q8_0 (an f16 scale and 32 int8), so head dims must be multiples of
// 32. Inside a block the layout is head-major and is defined with the ops that read and write
// it (backend/cpu/ops.h, KvLayerView): F32/F16 K transposed per head, Q8_0 K and all V as
// token rows. Which block belongs to which sequence is the block manager's business
// (block_pool.h); this class only owns the memory.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kiln/quant/types.h"
#include "kiln/util/status.h"

namespace kiln::kv {

inline constexpr int32_t kBlockTokens = 16;

struct KvShape {
  int32_t n_layer = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;
  quant::Type type = quant::Type::F16;  // F32, F16 or Q8_0
};

// "f16", "f32", "q8_0" (case-insensitive) -> the cache type; an error naming the choices.
Expected<quant::Type> parse_kv_type(std::string_view name);
bool is_kv_type(quant::Type t);

class KvCache {
 public:
  // Sizes the cache from a byte budget; at least one block. Errors on an absurd shape, a type
  // other than F32/F16/Q8_0, or a head dim that Q8_0 cannot hold.
  static Expected<KvCache> create(const KvShape& shape, uint64_t budget_bytes);
  // Bytes of one block over all layers (K and V), for the shape's type.
  static uint64_t bytes_per_block(const KvShape& shape);

  int32_t num_blocks() const { return num_blocks_; }
  const KvShape& shape() const { return shape_; }
  quant::Type type() const { return shape_.type; }
  uint64_t k_block_bytes() const { return k_block_bytes_; }
  uint64_t v_block_bytes() const { return v_block_bytes_; }

  // The bytes of (layer, block): n_kv_heads parts of k_block_bytes() / n_kv_heads each.
  uint8_t* k_block(int32_t layer, int32_t block) { return k_.data() + k_offset(layer, block); }
  uint8_t* v_block(int32_t layer, int32_t block) { return v_.data() + v_offset(layer, block); }
  const uint8_t* k_block(int32_t layer, int32_t block) const {
    return k_.data() + k_offset(layer, block);
  }
  const uint8_t* v_block(int32_t layer, int32_t block) const {
    return v_.data() + v_offset(layer, block);
  }

 private:
  size_t k_offset(int32_t layer, int32_t block) const {
    return (static_cast<size_t>(layer) * num_blocks_ + block) * k_block_bytes_;
  }
  size_t v_offset(int32_t layer, int32_t block) const {
    return (static_cast<size_t>(layer) * num_blocks_ + block) * v_block_bytes_;
  }

  KvShape shape_;
  int32_t num_blocks_ = 0;
  uint64_t k_block_bytes_ = 0;
  uint64_t v_block_bytes_ = 0;
  std::vector<uint8_t> k_;
  std::vector<uint8_t> v_;
};

}  // namespace kiln::kv
