// Chat prompt rendering: a model's Jinja chat template applied to OpenAI-style messages, with
// the variables Hugging Face's apply_chat_template passes (messages, tools, documents,
// add_generation_prompt, bos_token, eos_token, and every chat_template_kwargs key).
#pragma once

#include <ctime>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kiln/chat/jinja/jinja.h"
#include "kiln/util/status.h"

namespace kiln::chat {

// Messages and tools are nlohmann::ordered_json: key order is observable in templates
// (tojson of a tool schema, iteration over a dict), and must be the order the client sent.
struct ChatOptions {
  nlohmann::ordered_json tools;  // null: the template sees tools = none (as in HF)
  bool add_generation_prompt = true;
  std::string bos_token;
  std::string eos_token;
  // Each key becomes a template variable (enable_thinking, reasoning_effort, ...); these
  // override the variables above on a name clash, as in HF.
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  // Further template variables (e.g. other special tokens), applied before the kwargs.
  nlohmann::ordered_json extra_context = nlohmann::ordered_json::object();
  // What strftime_now() formats; unset: the current local time.
  std::optional<std::tm> now;
};

// Renders `tmpl` over `messages` (a JSON array of {role, content, tool_calls, ...} objects,
// passed to the template as given). Errors name the template line; a template's own
// raise_exception("...") surfaces its message.
Expected<std::string> render_chat(const std::string& tmpl, const nlohmann::ordered_json& messages,
                                  const ChatOptions& opts);
// The same with a template parsed once (jinja::Template::parse) and rendered per request.
Expected<std::string> render_chat(const jinja::Template& tmpl,
                                  const nlohmann::ordered_json& messages, const ChatOptions& opts);

// Names a caller's chat_template_kwargs must not set when the caller is untrusted (a server
// request): the variables render_chat itself sets (messages, tools, documents,
// add_generation_prompt, bos_token, eos_token) and the template globals (range, dict,
// namespace, raise_exception, strftime_now). Replacing them would skip the validation of
// the messages or a template's own checks.
bool is_reserved_template_variable(std::string_view name);

// The template used when a GGUF has no tokenizer.chat_template: ChatML
// (<|im_start|>role\ncontent<|im_end|>\n per message, then <|im_start|>assistant\n when a
// generation prompt is wanted). Content-part arrays are joined from their text parts.
extern const char* const kChatMLTemplate;

// The template a model is served with: its own, or ChatML when it has none (the one place
// the fallback is chosen).
inline std::string template_or_chatml(std::string model_template) {
  return model_template.empty() ? std::string(kChatMLTemplate) : std::move(model_template);
}

}  // namespace kiln::chat
