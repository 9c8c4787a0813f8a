// Hugging Face checkpoint (config.json + *.safetensors [+ tokenizer.json]) -> GGUF, naming
// and laying out tensors exactly as llama.cpp's convert_hf_to_gguf.py does, so converted files
// exercise the same code path as downloaded GGUFs. That includes the row permutation of
// Llama-family Q/K weights from HF's rotate-half rope layout to GGUF's adjacent-pair layout.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "kiln/gguf/writer.h"
#include "kiln/model/arch/arch.h"
#include "kiln/model/file_type.h"
#include "kiln/util/status.h"

namespace kiln::model {

struct ConvertOptions {
  std::string hf_dir;
  std::string type = "f16";    // see file_type.h
  bool with_tokenizer = true;  // when the folder has a tokenizer.json
};

// The GGUF hyperparameters of a Hugging Face config.json (transformers 4 and 5 styles), rope
// scaling included. Tensor-dependent fields (tied embeddings) are settled by convert_hf.
Expected<HParams> hparams_from_hf_config(const nlohmann::json& config);

// A config.json's rope settings: rope_parameters (transformers >= 5) or rope_scaling (older);
// an empty object when it has neither.
nlohmann::json hf_rope_settings(const nlohmann::json& config);
// Their rope type ("default" when unnamed; "llama3", "linear", "yarn", ...).
std::string hf_rope_type(const nlohmann::json& rope);

// llama3 rope scaling (rope_scaling / rope_parameters of type llama3) as the per-pair divisors
// llama.cpp's converter writes as rope_freqs.weight ([n_rot / 2]).
std::vector<float> llama3_rope_factors(const nlohmann::json& rope, const HParams& hp);

// The pooling of a sentence-transformers folder, as llama.cpp's converter reads it: the
// Pooling module named in modules.json, its config's pooling_mode_* switch. None when the
// folder has no modules.json (a generation model).
Expected<Pooling> pooling_from_sentence_transformers(const std::string& dir);

Expected<gguf::Writer> convert_hf(const ConvertOptions& opts);

// What every decoder conversion writes before its tensors: the hyperparameters, general.name
// (the folder's name), file type and quantization version, and the folder's tokenizer.json
// when it has one and opts ask for it.
Status write_file_header(gguf::Writer& w, const HParams& hp, const ConvertOptions& opts,
                         const FileType& ft);
// An error unless `values` holds exactly the elements of spec's shape.
Status check_tensor_size(const TensorSpec& spec, size_t values);
Status convert_hf_file(const ConvertOptions& opts, const std::string& out_path);

// The llama.cpp permutation of one Q or K weight ([n_head * head_dim, n_in], row-major):
// within each head, row j * (head_dim / 2) + i moves to row 2 * i + j.
std::vector<float> permute_qk_rows(const std::vector<float>& w, int64_t n_head, int64_t n_in);

}  // namespace kiln::model
