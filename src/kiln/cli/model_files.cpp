#include "kiln/cli/model_files.h"

#include <fstream>
#include <iostream>
#include <iterator>

#include "kiln/chat/template.h"
#include "kiln/tokenizer/gguf_vocab.h"
#include "kiln/util/log.h"

namespace kiln::cli {

Expected<TextModel> load_text_model(const std::string& path) {
  KILN_TRY(std::unique_ptr<gguf::File> file, gguf::File::open(path));
  KILN_TRY(tokenizer::VocabData vocab, tokenizer::load_vocab(*file));
  std::string tmpl = vocab.chat_template;
  KILN_TRY(tokenizer::Tokenizer tok, tokenizer::Tokenizer::create(std::move(vocab)));
  if (tmpl.empty()) {
    log::info("'{}' has no chat template; using the ChatML fallback", path);
    tmpl = chat::kChatMLTemplate;
  }
  return TextModel{std::move(file), std::move(tok), std::move(tmpl)};
}

Expected<std::string> read_text_file(const std::string& path) {
  if (path == "-") {
    return std::string((std::istreambuf_iterator<char>(std::cin)), {});
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) return err("cannot read '{}'", path);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

}  // namespace kiln::cli
