#include "kiln/chat/template.h"

#include "kiln/chat/jinja/jinja.h"

namespace kiln::chat {
namespace {

// Request JSON nested deeper than this is refused (the conversion and templates recurse).
constexpr int kMaxJsonDepth = 128;

bool too_deep(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxJsonDepth) return true;
  if (!j.is_structured()) return false;
  for (const auto& e : j) {
    if (too_deep(e, depth + 1)) return true;
  }
  return false;
}

}  // namespace

const char* const kChatMLTemplate =
    "{%- for message in messages -%}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}\n"
    "{%- if message['content'] is string -%}\n"
    "{{- message['content'] -}}\n"
    "{%- elif message['content'] is iterable -%}\n"
    "{%- for part in message['content'] -%}\n"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- endif -%}\n"
    "{{- '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n";

bool is_reserved_template_variable(std::string_view name) {
  static constexpr std::string_view kReserved[] = {
      "messages", "tools", "documents", "add_generation_prompt", "bos_token",   "eos_token",
      "range",    "dict",  "namespace", "raise_exception",       "strftime_now"};
  for (std::string_view r : kReserved)
    if (name == r) return true;
  return false;
}

Expected<std::string> render_chat(const std::string& tmpl, const nlohmann::ordered_json& messages,
                                  const ChatOptions& opts) {
  KILN_TRY(auto parsed, jinja::Template::parse(tmpl));
  return render_chat(parsed, messages, opts);
}

Expected<std::string> render_chat(const jinja::Template& tmpl,
                                  const nlohmann::ordered_json& messages, const ChatOptions& opts) {
  using jinja::Value;
  if (!messages.is_array()) return err("chat messages must be a JSON array");
  if (!opts.chat_template_kwargs.is_null() && !opts.chat_template_kwargs.is_object()) {
    return err("chat_template_kwargs must be a JSON object");
  }
  if (too_deep(messages, 0) || too_deep(opts.tools, 0) || too_deep(opts.chat_template_kwargs, 0) ||
      too_deep(opts.extra_context, 0)) {
    return err("chat messages, tools or kwargs nested deeper than {} levels", kMaxJsonDepth);
  }
  jinja::RenderContext ctx;
  ctx.vars.emplace_back("messages", Value::from_json(messages));
  ctx.vars.emplace_back("tools", Value::from_json(opts.tools));
  ctx.vars.emplace_back("documents", Value::none());
  ctx.vars.emplace_back("add_generation_prompt", Value(opts.add_generation_prompt));
  ctx.vars.emplace_back("bos_token", Value(opts.bos_token));
  ctx.vars.emplace_back("eos_token", Value(opts.eos_token));
  if (opts.extra_context.is_object()) {
    for (auto it = opts.extra_context.begin(); it != opts.extra_context.end(); ++it) {
      ctx.vars.emplace_back(it.key(), Value::from_json(it.value()));
    }
  }
  if (opts.chat_template_kwargs.is_object()) {
    for (auto it = opts.chat_template_kwargs.begin(); it != opts.chat_template_kwargs.end(); ++it) {
      ctx.vars.emplace_back(it.key(), Value::from_json(it.value()));
    }
  }
  if (opts.now) {
    ctx.now = *opts.now;
  } else {
    std::time_t t = std::time(nullptr);
    localtime_r(&t, &ctx.now);
  }
  return tmpl.render(ctx);
}

}  // namespace kiln::chat
