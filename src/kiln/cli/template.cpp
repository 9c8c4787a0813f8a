// kiln template: the prompt a model's chat template renders for a conversation.
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/chat/template.h"
#include "kiln/cli/commands.h"
#include "kiln/cli/model_files.h"

namespace kiln::cli {
namespace {

struct TemplateOptions {
  std::string model;
  std::string conversation;
  bool no_generation_prompt = false;
};

int fail(const std::string& msg) {
  fmt::print(stderr, "kiln template: {}\n", msg);
  return 1;
}

int run_template(const TemplateOptions& o) {
  auto path = model_path_or_default(o.model);
  if (!path.ok()) return fail(path.error().message);
  auto tm = load_text_model(*path);
  if (!tm.ok()) return fail(tm.error().message);
  auto text = read_text_file(o.conversation);
  if (!text.ok()) return fail(text.error().message);
  nlohmann::ordered_json conv;
  try {
    conv = nlohmann::ordered_json::parse(*text);
  } catch (const nlohmann::ordered_json::exception& e) {
    // nlohmann's message names the line, column and byte of the fault.
    return fail(fmt::format("'{}' is not valid JSON: {}", o.conversation, e.what()));
  }
  if (!conv.is_object()) return fail(fmt::format("'{}' is not a JSON object", o.conversation));
  if (!conv.contains("messages") || !conv["messages"].is_array())
    return fail("the conversation needs a \"messages\" array");
  chat::ChatOptions opts;
  opts.add_generation_prompt = !o.no_generation_prompt;
  if (conv.contains("tools")) opts.tools = conv["tools"];
  if (conv.contains("chat_template_kwargs")) {
    if (!conv["chat_template_kwargs"].is_object())
      return fail("\"chat_template_kwargs\" must be an object");
    opts.chat_template_kwargs = conv["chat_template_kwargs"];
  }
  const tokenizer::Tokenizer& tok = tm->tokenizer;
  if (auto bos = tok.bos_id()) opts.bos_token = std::string(tok.token_text(*bos));
  if (auto eos = tok.eos_id()) opts.eos_token = std::string(tok.token_text(*eos));
  auto prompt = chat::render_chat(tm->chat_template, conv["messages"], opts);
  if (!prompt.ok()) return fail(prompt.error().message);
  fmt::print("{}", *prompt);
  return 0;
}

}  // namespace

RunFn add_template(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("template", "Render a conversation with the model's chat template");
  auto o = std::make_shared<TemplateOptions>();
  cmd->add_option("-m,--model", o->model, kDefaultModelHelp);
  cmd->add_option("-f,--file", o->conversation,
                  "JSON with \"messages\", optional \"tools\" and \"chat_template_kwargs\" "
                  "('-': stdin)")
      ->required();
  cmd->add_flag("--no-generation-prompt", o->no_generation_prompt,
                "do not append the assistant turn opener");
  return [o]() { return run_template(*o); };
}

}  // namespace kiln::cli
