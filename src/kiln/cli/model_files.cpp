#include "kiln/cli/model_files.h"

#include <cstdlib>
#include <filesystem>
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
  if (tmpl.empty()) log::info("'{}' has no chat template; using the ChatML fallback", path);
  tmpl = chat::template_or_chatml(std::move(tmpl));
  return TextModel{std::move(file), std::move(tok), std::move(tmpl)};
}

Expected<std::string> default_model_path() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("KILN_MODEL"); env != nullptr && *env != '\0') {
    if (!fs::exists(env)) return err("$KILN_MODEL names '{}', which does not exist", env);
    return std::string(env);
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return err("no -m given and the kiln executable's folder is unknown: {}", ec.message());
  std::string looked;
  fs::path dir = exe.parent_path();
  for (int up = 0; up <= 4 && !dir.empty(); ++up) {
    const fs::path candidate = dir / "models" / "kiln-tiny.gguf";
    if (fs::exists(candidate, ec)) return candidate.string();
    looked += (looked.empty() ? "" : ", ") + candidate.string();
    if (dir == dir.parent_path()) break;
    dir = dir.parent_path();
  }
  return err("no -m given and no bundled model found (looked at $KILN_MODEL, {})", looked);
}

Expected<std::string> model_path_or_default(const std::string& given) {
  if (!given.empty()) return given;
  KILN_TRY(std::string path, default_model_path());
  log::info("no -m given: using the bundled model {}", path);
  return path;
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
