// The paged KV cache's constants and the user's choice of its storage type. The storage
// itself belongs to the backend that computes on it (backend/backend.h: KvSpec, KvCache,
// Backend::create_kv), which also defines the layout inside a block; which block belongs to
// which sequence is the block manager's business (block_pool.h).
#pragma once

#include <cstdint>
#include <string_view>

#include "kiln/quant/types.h"
#include "kiln/util/status.h"

namespace kiln::kv {

inline constexpr int32_t kBlockTokens = 16;

// "f16", "f32", "q8_0" (case-insensitive) -> the cache type; an error naming the choices.
Expected<quant::Type> parse_kv_type(std::string_view name);
bool is_kv_type(quant::Type t);

}  // namespace kiln::kv
