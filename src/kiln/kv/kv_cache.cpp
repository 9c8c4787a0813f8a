#include "kiln/kv/kv_cache.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace kiln::kv {

bool is_kv_type(quant::Type t) {
  return t == quant::Type::F32 || t == quant::Type::F16 || t == quant::Type::Q8_0;
}

Expected<quant::Type> parse_kv_type(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "f16") return quant::Type::F16;
  if (lower == "f32") return quant::Type::F32;
  if (lower == "q8_0") return quant::Type::Q8_0;
  return err("kv: unknown KV cache type '{}' (choose f16, f32 or q8_0)", name);
}

namespace {

// Bytes of one head's row; 0 when the type cannot hold head_dim elements.
uint64_t head_row_bytes(quant::Type t, int32_t head_dim) {
  return quant::row_bytes(t, static_cast<uint64_t>(head_dim)).value_or(0);
}

}  // namespace

uint64_t KvCache::bytes_per_block(const KvShape& s) {
  return static_cast<uint64_t>(s.n_layer) * kBlockTokens * s.n_kv_heads *
         (head_row_bytes(s.type, s.head_dim_k) + head_row_bytes(s.type, s.head_dim_v));
}

Expected<KvCache> KvCache::create(const KvShape& s, uint64_t budget_bytes) {
  if (s.n_layer <= 0 || s.n_kv_heads <= 0 || s.head_dim_k <= 0 || s.head_dim_v <= 0)
    return err("kv: invalid cache shape (layers {}, kv heads {}, head dims {}/{})", s.n_layer,
               s.n_kv_heads, s.head_dim_k, s.head_dim_v);
  if (!is_kv_type(s.type))
    return err("kv: the KV cache cannot store {} (choose f16, f32 or q8_0)",
               quant::type_name(s.type));
  if (head_row_bytes(s.type, s.head_dim_k) == 0 || head_row_bytes(s.type, s.head_dim_v) == 0)
    return err("kv: a {} KV cache needs head dims that are multiples of {}; this model has {}/{}",
               quant::type_name(s.type), quant::traits(s.type).block_elems, s.head_dim_k,
               s.head_dim_v);
  const uint64_t per_block = bytes_per_block(s);
  const uint64_t blocks = std::max<uint64_t>(1, budget_bytes / per_block);
  if (blocks > (1u << 30)) return err("kv: budget of {} bytes is too large", budget_bytes);
  KvCache c;
  c.shape_ = s;
  c.num_blocks_ = static_cast<int32_t>(blocks);
  c.k_block_bytes_ = uint64_t{kBlockTokens} * s.n_kv_heads * head_row_bytes(s.type, s.head_dim_k);
  c.v_block_bytes_ = uint64_t{kBlockTokens} * s.n_kv_heads * head_row_bytes(s.type, s.head_dim_v);
  // Zero bytes are 0.0 in every type (an f16 scale of 0 with zero quants for Q8_0).
  c.k_.assign(c.k_block_bytes_ * s.n_layer * blocks, 0);
  c.v_.assign(c.v_block_bytes_ * s.n_layer * blocks, 0);
  return c;
}

}  // namespace kiln::kv
