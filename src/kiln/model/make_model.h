// Random-weight GGUF models of a given architecture and shape, with a real tokenizer's
// metadata: the fixtures of unit tests and the subjects of benchmarks (`kiln make-model`).
#pragma once

#include <cstdint>
#include <string>

#include "kiln/gguf/writer.h"
#include "kiln/model/arch/arch.h"
#include "kiln/util/status.h"

namespace kiln::model {

struct MakeModelOptions {
  std::string arch = "llama";
  std::string tokenizer_dir;  // folder with tokenizer.json (+ tokenizer_config.json)
  // A Hugging Face config.json. When set, the architecture and every hyperparameter come from
  // it as `kiln convert` reads them (rope scaling included: llama3 as rope_freqs.weight,
  // linear and yarn as rope.scaling.* keys; tie_word_embeddings), the vocabulary is padded to
  // its vocab_size with "[PAD<id>]" unused tokens as llama.cpp's converter does, and the shape
  // fields below (arch through n_ff_expert, tied_embeddings) are not used.
  std::string config_path;
  uint32_t n_layer = 2;
  uint32_t n_embd = 256;
  uint32_t n_head = 4;
  uint32_t n_head_kv = 2;
  uint32_t n_ff = 512;
  uint32_t head_dim = 0;  // 0: n_embd / n_head
  uint32_t n_ctx = 4096;
  uint32_t n_expert = 0;  // MoE architectures: experts per layer
  uint32_t n_expert_used = 0;
  uint32_t n_ff_expert = 0;
  // Weight type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, or the
  // llama.cpp mixtures q4_k_m / q5_k_m (Q6_K for the output and for attn_v/ffn_down of
  // some layers, as llama-quantize chooses).
  std::string type = "f16";
  bool tied_embeddings = false;
  bool vocab_only = false;  // tokenizer and hyperparameters, no tensors
  uint64_t seed = 42;
  // > 0: each tensor's rows past the first distinct_rows repeat those rows cyclically (made and
  // quantized once): a 35B file in seconds instead of minutes, for speed benchmarks only.
  uint32_t distinct_rows = 0;
};

// Builds the file in memory (a Writer ready to write).
Expected<gguf::Writer> make_model(const MakeModelOptions& opts);
// Builds and writes it to `path`.
Status make_model_file(const MakeModelOptions& opts, const std::string& path);

}  // namespace kiln::model
