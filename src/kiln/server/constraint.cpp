#include "kiln/server/constraint.h"

#include <fmt/format.h>

#include "kiln/engine/sequence.h"
#include "kiln/grammar/constraint.h"

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

}  // namespace

std::optional<ApiError> read_constraint(const Json& body, ServerContext& ctx,
                                        engine::GenerationRequest* request) {
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
  return std::nullopt;
}

std::optional<ApiError> force_tool_call(const Json& body, const Json& tools, ServerContext& ctx,
                                        engine::GenerationRequest* request) {
  bool parallel = true;
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && it->is_boolean())
    parallel = it->get<bool>();
  return force_tool_call(tools, parallel, ctx, request);
}

std::optional<ApiError> force_tool_call(const Json& tools, bool parallel, ServerContext& ctx,
                                        engine::GenerationRequest* request) {
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::kToolCalls;
  switch (ctx.parser_config.format) {
    case chat::ToolFormat::kHermes:
      spec.json.prefix = "<tool_call>\n";
      spec.json.suffix = "\n</tool_call>";
      spec.json.separator = "\n";
      break;
    case chat::ToolFormat::kLlama3:
      spec.arguments_key = "parameters";
      spec.json.separator = "; ";
      break;
    default:
      return std::nullopt;  // no grammar for this format yet: the template's choice only
  }
  if (request->grammar)
    return invalid_request(
        "'tool_choice' required or named forces a tool call; it cannot be combined with "
        "response_format or guided_* constraints",
        "tool_choice");
  spec.json.max_repeats = parallel ? 8 : 1;
  spec.text = tools.dump();
  auto compiled = grammar_cache(ctx).get(spec);
  if (!compiled.ok()) return invalid_request(compiled.error().message, "tools");
  request->grammar = std::move(compiled).value();
  return std::nullopt;
}

}  // namespace kiln::server
