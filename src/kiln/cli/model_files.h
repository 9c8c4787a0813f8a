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

// The bundled default model (kiln-tiny) that `kiln run` and `kiln serve` use without -m:
// $KILN_MODEL when set, else models/kiln-tiny.gguf in the folder of the kiln executable or
// in one of its four parent folders (build/kiln and build/release/kiln both find the source
// tree's models/). Fails naming the places it looked.
Expected<std::string> default_model_path();
inline constexpr const char* kDefaultModelHelp =
    "GGUF file (default: the bundled kiln-tiny: $KILN_MODEL, else models/kiln-tiny.gguf beside "
    "the kiln executable or up to four folders above it)";

// `given` when not empty, else default_model_path() (logged).
Expected<std::string> model_path_or_default(const std::string& given);

// Reads a whole file ("-" for standard input).
Expected<std::string> read_text_file(const std::string& path);

}  // namespace kiln::cli
