// Loading the pieces of a GGUF that the text commands need, with errors for the user.
#pragma once

#include <memory>
#include <string>

#include "kiln/gguf/gguf.h"
#include "kiln/tokenizer/tokenizer.h"
#include "kiln/util/status.h"

namespace kiln::cli {

struct TextModel {
  std::unique_ptr<gguf::File> file;
  tokenizer::Tokenizer tokenizer;
  std::string chat_template;  // the file's, or ChatML when it has none (logged)
};

// Opens the GGUF (weights not needed: vocab-only files work) and builds its tokenizer.
Expected<TextModel> load_text_model(const std::string& path);

// Reads a whole file ("-" for standard input).
Expected<std::string> read_text_file(const std::string& path);

}  // namespace kiln::cli
