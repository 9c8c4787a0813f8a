// JSON Schema to grammar: the output is a JSON value (compact: no whitespace, unless
// whitespace is flexible) that validates against the schema. docs/api.md lists the keywords.
//
// Policies (each documented in docs/api.md):
//  - Properties are written in the order the schema lists them; required ones always, optional
//    ones may be left out. additionalProperties absent means none (a valid choice: the output
//    still validates); true or a schema allows extra "key": value pairs after the listed ones.
//  - anyOf and oneOf are alternatives (oneOf's branches are assumed disjoint, as they are in
//    the schemas people write); allOf is merged when its parts are objects or agree.
//  - Keywords that would constrain the value but are not enforced (not, if/then/else,
//    patternProperties, uniqueItems: true, multipleOf, bounds on non-integer numbers...) are
//    an error naming the keyword and its JSON pointer; never silently ignored. Annotations
//    (title, description, default, examples, $comment...) and formats this compiler does not
//    know (format is an annotation by default since draft 2019-09) are ignored.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kiln/grammar/grammar.h"
#include "kiln/util/status.h"

namespace kiln::grammar {

struct JsonSchemaOptions {
  // false: up to 16 whitespace characters around structural characters (a model trained on
  // pretty-printed JSON may want them); true: none (the default: fewer tokens, same value).
  bool compact = true;
  // With compact false: at most this many whitespace characters in a row.
  int32_t max_whitespace = 16;
  // The output is `prefix value suffix`, repeated 1..max_repeats times with `separator`
  // between (tool calls in a model's format: "<tool_call>\n" {..} "\n</tool_call>").
  std::string prefix;
  std::string suffix;
  std::string separator;
  int32_t max_repeats = 1;
  // Strings never hold a raw '<' (it is written \u003c): for tool-call formats whose parser
  // ends a call at the first closing tag, however it is quoted (Qwen3-Coder, DeepSeek).
  bool escape_lt = false;
};

// schema_text: the schema as JSON text. Errors say what and where ("#/properties/a").
Expected<Grammar> compile_json_schema(std::string_view schema_text,
                                      const JsonSchemaOptions& options = {});

// A tool call in a model's JSON tool-call format: {"name": <one of the tools>, <arguments_key>:
// <that tool's parameters>}, with whitespace as the model likes it (compact false and at most
// one whitespace character in a row, set here), framed by options.prefix/suffix. tools_json: the
// OpenAI `tools` array
// ({"type":"function","function":{"name","parameters"}}). Errors name the tool.
Expected<Grammar> compile_tool_calls(std::string_view tools_json, std::string_view arguments_key,
                                     JsonSchemaOptions options);

// How a model's chat format writes tool calls (the output parsers in chat/ read the same shapes):
//   one of `opens`, then CALL (separator CALL){0, max_calls - 1}, then close
//   CALL = call_open BODY call_close
// BODY names one of the tools and gives arguments valid against that tool's `parameters`:
//   kJson:  {"name": "NAME", "<arguments_key>": ARGS}, at most max_whitespace whitespace
//           characters in a row wherever JSON allows them (Hermes/Qwen, Llama 3, Mistral's array)
//   kNamed: before_name NAME after_name ARGS, ARGS compact JSON (DeepSeek)
//   kXml:   <function=NAME>\n then per parameter, in the schema's order (required ones always,
//           optional ones may be left out) <parameter=KEY>\nVALUE\n</parameter>\n, then
//           </function>; VALUE is the property's value as compact JSON (a string quoted), which
//           the Qwen3-Coder parser reads back as that JSON value (Qwen3-Coder). Parameters must be
//           an object schema with `properties`.
struct ToolCallSyntax {
  enum class Body : uint8_t { kJson, kNamed, kXml };
  Body body = Body::kJson;
  std::string arguments_key = "arguments";
  std::string before_name, after_name;    // kNamed
  std::vector<std::string> opens = {""};  // the block starts with one of these
  std::string call_open, call_close, separator, close;
  int32_t max_calls = 1;
  // kJson: at most this many whitespace characters (' ', '\t', '\n') in a row wherever JSON
  // allows them (1: `{"name": "f", "arguments": {..}}`; Llama 3 takes more, for its
  // pretty-printed calls and the lazy trigger's `{  "name"`).
  int32_t max_whitespace = 1;
  // Control tokens of the format that the framing strings above hold ([TOOL_CALLS], DeepSeek's
  // call markers, <|python_tag|>): each occurrence becomes a token terminal (grammar.h), so the
  // output holds that control token and not its text spelled out of text tokens. Only markers
  // that are single tokens of the vocabulary belong here (the caller checks); others stay text.
  std::vector<std::string> token_markers;
};

// tools_json: the OpenAI `tools` array. Errors name the tool.
Expected<Grammar> compile_tool_call_syntax(std::string_view tools_json,
                                           const ToolCallSyntax& syntax);

// Any JSON object (response_format json_object).
Grammar json_object_grammar(const JsonSchemaOptions& options = {});

}  // namespace kiln::grammar
