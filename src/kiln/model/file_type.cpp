#include "kiln/model/file_type.h"

#include <cstdlib>

#include "kiln/quant/convert.h"

namespace kiln::model {
namespace {

// llama.cpp's use_more_bits(i, n): the layers a *_M mixture gives more bits.
bool use_more_bits(uint32_t i, uint32_t n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

uint32_t layer_of(const std::string& name) {  // "blk.<i>.<...>"
  return static_cast<uint32_t>(std::strtoul(name.c_str() + 4, nullptr, 10));
}

}  // namespace

Expected<FileType> parse_file_type(std::string_view name) {
  struct Row {
    std::string_view name;
    uint32_t id;
    quant::Type base;
    bool mixture;
  };
  static constexpr Row kRows[] = {
      {"f32", 0, quant::Type::F32, false},     {"f16", 1, quant::Type::F16, false},
      {"q4_0", 2, quant::Type::Q4_0, false},   {"q4_1", 3, quant::Type::Q4_1, false},
      {"q8_0", 7, quant::Type::Q8_0, false},   {"q5_0", 8, quant::Type::Q5_0, false},
      {"q5_1", 9, quant::Type::Q5_1, false},   {"q4_k", 14, quant::Type::Q4_K, false},
      {"q4_k_m", 15, quant::Type::Q4_K, true}, {"q5_k", 16, quant::Type::Q5_K, false},
      {"q5_k_m", 17, quant::Type::Q5_K, true}, {"q6_k", 18, quant::Type::Q6_K, false},
      {"bf16", 32, quant::Type::BF16, false},
  };
  for (const Row& r : kRows) {
    if (r.name == name) return FileType{std::string(r.name), r.id, r.base, r.mixture};
  }
  return err(
      "unknown file type '{}' (f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k "
      "q4_k_m q5_k_m)",
      name);
}

quant::Type tensor_type(const FileType& ft, const TensorSpec& spec, const HParams& hp) {
  // Vectors stay F32, as llama.cpp keeps every 1-D tensor (the shared expert's gate row too).
  if (spec.kind == TensorKind::kNorm || spec.ne.size() == 1) return quant::Type::F32;
  // The MoE router stays F32, as llama.cpp's quantize leaves it (real MoE files carry F32
  // routers; a benchmark file should too).
  if (spec.name.ends_with("ffn_gate_inp.weight")) return quant::Type::F32;
  quant::Type t = ft.base;
  if (ft.mixture) {
    const bool is_output =
        spec.name == "output.weight" || (hp.tied_embeddings && spec.name == "token_embd.weight");
    const bool more_bits =
        spec.name.starts_with("blk.") && use_more_bits(layer_of(spec.name), hp.n_layer);
    if (is_output) t = quant::Type::Q6_K;
    if (more_bits &&
        (spec.name.ends_with("attn_v.weight") || spec.name.ends_with("ffn_down.weight")))
      t = quant::Type::Q6_K;
  }
  const uint32_t block = quant::traits(t).block_elems;
  if (spec.ne[0] % block != 0) t = spec.ne[0] % 32 == 0 ? quant::Type::Q8_0 : quant::Type::F16;
  return t;
}

Status add_tensor_f32(gguf::Writer& w, const TensorSpec& spec, quant::Type type,
                      std::span<const float> values) {
  const int64_t row = spec.ne[0];
  const int64_t n_rows = static_cast<int64_t>(values.size()) / row;
  const uint64_t row_bytes = *quant::row_bytes(type, static_cast<uint64_t>(row));
  std::vector<uint8_t> data(row_bytes * static_cast<uint64_t>(n_rows));
  for (int64_t r = 0; r < n_rows; ++r) {
    KILN_TRY_STATUS(quant::quantize_row(type, values.data() + r * row,
                                        data.data() + static_cast<uint64_t>(r) * row_bytes, row));
  }
  return w.add_tensor(spec.name, type, spec.ne, data);
}

}  // namespace kiln::model
