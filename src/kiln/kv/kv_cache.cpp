#include "kiln/kv/kv_cache.h"

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

}  // namespace kiln::kv
