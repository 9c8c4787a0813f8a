// The GGUF/ggml tensor types: ids as written on disk (ggml.h `enum ggml_type`, append-only),
// and each type's block geometry. A row of n elements of a blocked type takes
// n / block_elems * block_bytes bytes; n must be a multiple of block_elems.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kiln::quant {

// On-disk ids. Never renumber.
enum class Type : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  // 4, 5: Q4_2, Q4_3 (removed from ggml)
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  // 31..33: Q4_0_4_4, Q4_0_4_8, Q4_0_8_8 (removed)
  TQ1_0 = 34,
  TQ2_0 = 35,
  // 36..38: IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8 (removed)
  MXFP4 = 39,
};

struct TypeTraits {
  Type type;
  std::string_view name;  // as ggml spells it: "q4_K", "f16", ...
  uint32_t block_elems;   // elements per block (1 for plain types)
  uint32_t block_bytes;   // bytes per block
  bool is_quantized;      // a blocked quant format
  bool kiln_supported;    // kiln can dequantize it (reference path exists)
};

// Traits of a known type id, or nullopt for an id ggml never defined (or removed).
std::optional<TypeTraits> traits(uint32_t type_id);
const TypeTraits& traits(Type t);

inline std::string_view type_name(Type t) {
  return traits(t).name;
}
// Parse a name like "q4_k", "Q4_K", "f16", "bf16" (case-insensitive).
std::optional<Type> type_from_name(std::string_view name);

// Bytes for a row of n elements; nullopt when n is not a multiple of the block size or the
// byte count does not fit 64 bits.
std::optional<uint64_t> row_bytes(Type t, uint64_t n_elems);

}  // namespace kiln::quant
