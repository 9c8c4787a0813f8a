// Output file types for the writers (make-model, convert): llama.cpp's general.file_type ids
// and its choice of quant type per tensor for the *_M mixtures.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "kiln/gguf/writer.h"
#include "kiln/model/arch/arch.h"
#include "kiln/quant/types.h"
#include "kiln/util/status.h"

namespace kiln::model {

struct FileType {
  std::string name;  // "f16", "q4_k_m", ...
  uint32_t id = 0;   // general.file_type (enum llama_ftype)
  quant::Type base = quant::Type::F16;
  bool mixture = false;  // *_M: Q6_K for the output and some attn_v/ffn_down
};

// f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m q5_k_m.
Expected<FileType> parse_file_type(std::string_view name);

// The type one tensor gets: F32 for norms, biases and MoE routers; the base type, or Q6_K where a
// mixture asks for more bits; a fallback (Q8_0, else F16) for rows that are not a multiple of the
// block.
quant::Type tensor_type(const FileType& ft, const TensorSpec& spec, const HParams& hp);

// Quantizes `values` (all rows of the tensor, row-major) to `type` and adds the tensor.
Status add_tensor_f32(gguf::Writer& w, const TensorSpec& spec, quant::Type type,
                      std::span<const float> values);

}  // namespace kiln::model
