#include "kiln/server/constraint.h"

#include <fmt/format.h>

#include "kiln/engine/sequence.h"
#include "kiln/grammar/constraint.h"
#include "kiln/util/log.h"

namespace kiln::server {

namespace {

using Json = nlohmann::ordered_json;
using grammar::ConstraintSpec;

grammar::GrammarCache& grammar_cache(ServerContext& ctx) {
  std::call_once(ctx.grammar_once, [&] {
    // End tokens: what the engine stops on (EOS, EOT, <|im_end|>...), so a finished grammar
    // lets the model end its turn the way it was trained to.
    auto index =
        grammar::TokenIndex::create(ctx.tokenizer, engine::end_of_generation_ids(ctx.tokenizer));
    ctx.grammar_cache = std::make_shared<grammar::GrammarCache>(std::move(index));
  });
  return *ctx.grammar_cache;
}

std::optional<ApiError> string_field(const Json& v, const std::string& name, std::string* out) {
  if (!v.is_string()) return invalid_request(fmt::format("'{}' must be a string", name), name);
  *out = v.get<std::string>();
  return std::nullopt;
}

// Llama 3's JSON calls: whitespace runs up to this long (pretty-printed with indentation).
constexpr int32_t kLlama3MaxWhitespace = 16;

}  // namespace

std::optional<ApiError> read_constraint(const Json& body, ServerContext& ctx,
                                        engine::GenerationRequest* request,
                                        grammar::ConstraintSpec* spec_out) {
  std::optional<ConstraintSpec> spec;
  std::string field;
  auto take = [&](const std::string& name) -> std::optional<ApiError> {
    if (spec)
      return invalid_request(
          fmt::format("'{}' and '{}' both constrain the output: give one", field, name), name);
    field = name;
    spec.emplace();
    return std::nullopt;
  };
  if (auto it = body.find("response_format"); it != body.end() && it->is_object()) {
    const std::string type =
        it->contains("type") && (*it)["type"].is_string() ? (*it)["type"].get<std::string>() : "";
    if (type == "json_object") {
      if (auto e = take("response_format")) return e;
      spec->kind = ConstraintSpec::Kind::kJsonObject;
    } else if (type == "json_schema") {
      if (auto e = take("response_format")) return e;
      const Json* js = it->contains("json_schema") ? &(*it)["json_schema"] : nullptr;
      if (!js || !js->is_object() || !js->contains("schema"))
        return invalid_request("'response_format.json_schema.schema' is required",
                               "response_format.json_schema");
      spec->kind = ConstraintSpec::Kind::kJsonSchema;
      spec->text = (*js)["schema"].dump();
    }
  }
  for (const char* name : {"guided_json", "json_schema"}) {
    if (auto it = body.find(name); it != body.end() && !it->is_null()) {
      if (auto e = take(name)) return e;
      spec->kind = ConstraintSpec::Kind::kJsonSchema;
      spec->text = it->is_string() ? it->get<std::string>() : it->dump();
    }
  }
  for (const char* name : {"guided_regex", "regex"}) {
    if (auto it = body.find(name); it != body.end() && !it->is_null()) {
      if (auto e = take(name)) return e;
      spec->kind = ConstraintSpec::Kind::kRegex;
      if (auto e = string_field(*it, name, &spec->text)) return e;
    }
  }
  for (const char* name : {"guided_grammar", "grammar"}) {
    if (auto it = body.find(name); it != body.end() && !it->is_null()) {
      if (auto e = take(name)) return e;
      spec->kind = ConstraintSpec::Kind::kGbnf;
      if (auto e = string_field(*it, name, &spec->text)) return e;
    }
  }
  for (const char* name : {"guided_choice", "choice"}) {
    if (auto it = body.find(name); it != body.end() && !it->is_null()) {
      if (auto e = take(name)) return e;
      spec->kind = ConstraintSpec::Kind::kChoice;
      if (!it->is_array() || it->empty())
        return invalid_request(fmt::format("'{}' must be a non-empty array of strings", name),
                               name);
      for (const Json& c : *it) {
        if (!c.is_string())
          return invalid_request(fmt::format("'{}' must be a non-empty array of strings", name),
                                 name);
        spec->choices.push_back(c.get<std::string>());
      }
    }
  }
  if (!spec) return std::nullopt;
  auto compiled = grammar_cache(ctx).get(*spec);
  if (!compiled.ok()) return invalid_request(compiled.error().message, field);
  request->grammar = std::move(compiled).value();
  if (spec_out) *spec_out = std::move(*spec);
  return std::nullopt;
}

std::optional<ApiError> force_tool_call(const Json& body, const Json& tools, ServerContext& ctx,
                                        engine::GenerationRequest* request) {
  bool parallel = true;
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && it->is_boolean())
    parallel = it->get<bool>();
  return force_tool_call(tools, parallel, ctx, request);
}

std::optional<ToolCallFormat> tool_call_format(chat::ToolFormat format,
                                               std::string_view chat_template, bool parallel) {
  ToolCallFormat f;
  grammar::ToolCallSyntax& syn = f.syntax;
  syn.max_calls = parallel ? 8 : 1;
  switch (format) {
    case chat::ToolFormat::kHermes:
      // Qwen3-Coder writes an XML body inside the same tags.
      if (chat_template.find("<function=") != std::string::npos)
        syn.body = grammar::ToolCallSyntax::Body::kXml;
      syn.call_open = "<tool_call>\n";
      syn.call_close = "\n</tool_call>";
      syn.separator = "\n";
      f.triggers = {{"<tool_call>", false}};
      break;
    case chat::ToolFormat::kLlama3:
      syn.arguments_key = "parameters";
      syn.opens = {"", "<|python_tag|>"};
      syn.token_markers = {"<|python_tag|>"};
      syn.separator = "; ";
      f.triggers = {{"<|python_tag|>", false}};
      // A call is a JSON object at the start of the answer whose first key is "name" (or
      // "type", which the parser also takes for a call and the grammar refuses), with as much
      // whitespace after '{' as the grammar allows there (a pretty-printed call).
      syn.max_whitespace = kLlama3MaxWhitespace;
      for (const char* key : {"name", "type"}) {
        f.triggers.push_back({fmt::format("{{\"{}\"", key), true, 1, syn.max_whitespace});
      }
      break;
    case chat::ToolFormat::kMistral:
      // The array form (the parser also reads the newer NAME[ARGS]{..} form; which one a model
      // was trained on is not told by the template here).
      syn.opens = {"[TOOL_CALLS]["};
      syn.token_markers = {"[TOOL_CALLS]"};
      syn.separator = ",";
      syn.close = "]";
      f.triggers = {{"[TOOL_CALLS]", false}};
      break;
    case chat::ToolFormat::kDeepSeek: {
      syn.body = grammar::ToolCallSyntax::Body::kNamed;
      syn.opens = {"<\uFF5Ctool\u2581calls\u2581begin\uFF5C>"};
      syn.call_open = "<\uFF5Ctool\u2581call\u2581begin\uFF5C>";
      syn.close = "<\uFF5Ctool\u2581calls\u2581end\uFF5C>";
      const std::string call_end = "<\uFF5Ctool\u2581call\u2581end\uFF5C>";
      const std::string sep = "<\uFF5Ctool\u2581sep\uFF5C>";
      if (chat_template.find("```json") != std::string::npos) {  // V3, R1
        syn.before_name = "function" + sep;
        syn.after_name = "\n```json\n";
        syn.call_close = "\n```" + call_end;
        syn.separator = "\n";
      } else {  // V3.1: NAME<sep>{..}
        syn.after_name = sep;
        syn.call_close = call_end;
      }
      syn.token_markers = {syn.opens[0], syn.call_open, syn.close, call_end, sep};
      f.triggers = {{syn.opens[0], false}};
      break;
    }
    case chat::ToolFormat::kNone:
      return std::nullopt;
  }
  return f;
}

void keep_control_markers(const tokenizer::Tokenizer& tok, grammar::ToolCallSyntax* syntax) {
  std::erase_if(syntax->token_markers, [&](const std::string& m) {
    const std::optional<int32_t> id = tok.find_token(m);
    return !id || tok.token_type(*id) != tokenizer::TokenType::kControl;
  });
}

std::optional<ApiError> force_tool_call(const Json& tools, bool parallel, ServerContext& ctx,
                                        engine::GenerationRequest* request) {
  auto format = tool_call_format(ctx.parser_config.format, ctx.chat_template, parallel);
  if (!format) return std::nullopt;  // no tool-call format: the template's choice only
  keep_control_markers(ctx.tokenizer, &format->syntax);
  if (request->grammar)
    return invalid_request(
        "'tool_choice' required or named forces a tool call; it cannot be combined with "
        "response_format or guided_* constraints",
        "tool_choice");
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::kToolCallSyntax;
  spec.syntax = std::move(format->syntax);
  spec.text = tools.dump();
  auto compiled = grammar_cache(ctx).get(spec);
  if (!compiled.ok()) return invalid_request(compiled.error().message, "tools");
  request->grammar = std::move(compiled).value();
  return std::nullopt;
}

void lazy_tool_call(const Json& tools, bool parallel, ServerContext& ctx,
                    engine::GenerationRequest* request, const ConstraintSpec* answer) {
  if (!tools.is_array() || tools.empty()) return;
  if (request->grammar && !answer) return;
  auto format = tool_call_format(ctx.parser_config.format, ctx.chat_template, parallel);
  if (!format) return;
  keep_control_markers(ctx.tokenizer, &format->syntax);
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::kToolCallSyntax;
  spec.syntax = std::move(format->syntax);
  spec.text = tools.dump();
  if (request->grammar) {
    // The answer's format or calls, from the first byte of the answer (no trigger: text of the
    // format is not free text to wait in).
    ConstraintSpec both = *answer;
    both.either.push_back(std::move(spec));
    auto compiled = grammar_cache(ctx).get(both);
    if (!compiled.ok()) {
      log::warn("tool_choice auto: tool calls left unconstrained beside the response format: {}",
                compiled.error().message);
      return;
    }
    request->grammar = std::move(compiled).value();
    return;
  }
  auto compiled = grammar_cache(ctx).get(spec);
  if (!compiled.ok()) {
    log::warn("tool_choice auto: tool calls left unconstrained: {}", compiled.error().message);
    return;
  }
  request->grammar = std::move(compiled).value();
  request->grammar_start.triggers = std::move(format->triggers);
}

void exempt_reasoning(const chat::ParserConfig& config, std::string_view rendered_prompt,
                      engine::GenerationRequest* request) {
  if (!request->grammar || !config.reasoning) return;
  // A prompt that closed the block itself (Qwen3 with enable_thinking false writes an empty
  // one) asks for the answer: constrained from the first token.
  const size_t end = rendered_prompt.find_last_not_of(" \t\r\n");
  const std::string_view trimmed =
      end == std::string_view::npos ? std::string_view() : rendered_prompt.substr(0, end + 1);
  if (!config.think_close.empty() && trimmed.ends_with(config.think_close)) return;
  engine::GrammarStart& start = request->grammar_start;
  start.reasoning = true;
  start.reasoning_open_at_start = config.reasoning_open_at_start;
  start.think_open = config.think_open;
  start.think_close = config.think_close;
}

}  // namespace kiln::server
