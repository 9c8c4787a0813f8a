// kiln tokenize: the token ids (and pieces) a model's tokenizer gives for a text.
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kiln/cli/commands.h"
#include "kiln/cli/model_files.h"

namespace kiln::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string text;
  std::string file;
  bool json = false;
  bool pieces = false;
  bool no_special = false;        // do not add BOS/EOS
  bool no_parse_special = false;  // "<|im_start|>" in the text stays plain text
};

int run_tokenize(const TokenizeOptions& o) {
  auto path = model_path_or_default(o.model);
  if (!path.ok()) {
    fmt::print(stderr, "kiln tokenize: {}\n", path.error().message);
    return 1;
  }
  auto tm = load_text_model(*path);
  if (!tm.ok()) {
    fmt::print(stderr, "kiln tokenize: {}\n", tm.error().message);
    return 1;
  }
  std::string text = o.text;
  if (!o.file.empty()) {
    auto t = read_text_file(o.file);
    if (!t.ok()) {
      fmt::print(stderr, "kiln tokenize: {}\n", t.error().message);
      return 1;
    }
    text = std::move(*t);
  }
  auto ids = tm->tokenizer.encode(text, !o.no_special, !o.no_parse_special);
  if (!ids.ok()) {
    fmt::print(stderr, "kiln tokenize: {}\n", ids.error().message);
    return 1;
  }
  if (o.pieces) {
    nlohmann::json arr = nlohmann::json::array();
    for (int32_t id : *ids) {
      const std::string piece(tm->tokenizer.token_text(id));
      if (o.json) {
        arr.push_back({{"id", id}, {"piece", piece}});
      } else {
        fmt::print(
            "{:>8}  {}\n", id,
            nlohmann::json(piece).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      }
    }
    if (o.json)
      fmt::print("{}\n", arr.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return 0;
  }
  if (o.json) {
    fmt::print("[{}]\n", fmt::join(*ids, ","));
  } else {
    fmt::print("{}\n", fmt::join(*ids, " "));
  }
  return 0;
}

}  // namespace

RunFn add_tokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Print the token ids of a text");
  auto o = std::make_shared<TokenizeOptions>();
  cmd->add_option("-m,--model", o->model, kDefaultModelHelp);
  auto* text = cmd->add_option("text", o->text, "the text");
  auto* file = cmd->add_option("-f,--file", o->file, "read the text from a file ('-': stdin)");
  text->excludes(file);
  cmd->add_flag("--json", o->json, "print a JSON array");
  cmd->add_flag("--pieces", o->pieces, "print each token's text too");
  cmd->add_flag("--no-special", o->no_special, "do not add BOS/EOS tokens");
  cmd->add_flag("--no-parse-special", o->no_parse_special,
                "treat special-token text like <|im_start|> as plain text");
  return [o]() { return run_tokenize(*o); };
}

}  // namespace kiln::cli
