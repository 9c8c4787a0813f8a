#include "kiln/quant/types.h"

#include <array>
#include <cctype>
#include <string>

namespace kiln::quant {
namespace {

// Block geometry from ggml's block structs (ggml-common.h); QK_K = 256.
constexpr std::array kTable = {
    TypeTraits{Type::F32, "f32", 1, 4, false, true},
    TypeTraits{Type::F16, "f16", 1, 2, false, true},
    TypeTraits{Type::Q4_0, "q4_0", 32, 18, true, true},
    TypeTraits{Type::Q4_1, "q4_1", 32, 20, true, true},
    TypeTraits{Type::Q5_0, "q5_0", 32, 22, true, true},
    TypeTraits{Type::Q5_1, "q5_1", 32, 24, true, true},
    TypeTraits{Type::Q8_0, "q8_0", 32, 34, true, true},
    TypeTraits{Type::Q8_1, "q8_1", 32, 36, true, true},
    TypeTraits{Type::Q2_K, "q2_K", 256, 84, true, true},
    TypeTraits{Type::Q3_K, "q3_K", 256, 110, true, true},
    TypeTraits{Type::Q4_K, "q4_K", 256, 144, true, true},
    TypeTraits{Type::Q5_K, "q5_K", 256, 176, true, true},
    TypeTraits{Type::Q6_K, "q6_K", 256, 210, true, true},
    TypeTraits{Type::Q8_K, "q8_K", 256, 292, true, true},
    TypeTraits{Type::IQ2_XXS, "iq2_xxs", 256, 66, true, false},
    TypeTraits{Type::IQ2_XS, "iq2_xs", 256, 74, true, false},
    TypeTraits{Type::IQ3_XXS, "iq3_xxs", 256, 98, true, false},
    TypeTraits{Type::IQ1_S, "iq1_s", 256, 50, true, false},
    TypeTraits{Type::IQ4_NL, "iq4_nl", 32, 18, true, true},
    TypeTraits{Type::IQ3_S, "iq3_s", 256, 110, true, false},
    TypeTraits{Type::IQ2_S, "iq2_s", 256, 82, true, false},
    TypeTraits{Type::IQ4_XS, "iq4_xs", 256, 136, true, true},
    TypeTraits{Type::I8, "i8", 1, 1, false, false},
    TypeTraits{Type::I16, "i16", 1, 2, false, false},
    TypeTraits{Type::I32, "i32", 1, 4, false, false},
    TypeTraits{Type::I64, "i64", 1, 8, false, false},
    TypeTraits{Type::F64, "f64", 1, 8, false, false},
    TypeTraits{Type::IQ1_M, "iq1_m", 256, 56, true, false},
    TypeTraits{Type::BF16, "bf16", 1, 2, false, true},
    TypeTraits{Type::TQ1_0, "tq1_0", 256, 54, true, false},
    TypeTraits{Type::TQ2_0, "tq2_0", 256, 66, true, false},
    TypeTraits{Type::MXFP4, "mxfp4", 32, 17, true, false},
};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

}  // namespace

std::optional<TypeTraits> traits(uint32_t type_id) {
  for (const auto& t : kTable) {
    if (static_cast<uint32_t>(t.type) == type_id) return t;
  }
  return std::nullopt;
}

const TypeTraits& traits(Type type) {
  for (const auto& t : kTable) {
    if (t.type == type) return t;
  }
  // Every enumerator is in the table (checked by tests); reaching here is a kiln bug.
  return kTable[0];
}

std::optional<Type> type_from_name(std::string_view name) {
  for (const auto& t : kTable) {
    if (iequals(t.name, name)) return t.type;
  }
  return std::nullopt;
}

std::optional<uint64_t> row_bytes(Type type, uint64_t n_elems) {
  const TypeTraits& t = traits(type);
  if (n_elems % t.block_elems != 0) return std::nullopt;
  const uint64_t blocks = n_elems / t.block_elems;
  if (blocks > UINT64_MAX / t.block_bytes) return std::nullopt;  // would wrap
  return blocks * t.block_bytes;
}

}  // namespace kiln::quant
