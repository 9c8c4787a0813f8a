// Structured output fields of a chat or completions body, compiled into the request's grammar:
//   response_format {"type":"json_object"} | {"type":"json_schema","json_schema":{"schema":..}}
//   guided_json / guided_regex / guided_grammar / guided_choice (vLLM's names), and the shorter
//   json_schema / regex / grammar / choice (llama-server's `grammar`, `json_schema`).
// At most one may be given; compile errors are a 400 naming the field.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/engine/api.h"
#include "kiln/grammar/constraint.h"
#include "kiln/grammar/json_schema.h"
#include "kiln/server/context.h"
#include "kiln/server/errors.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::server {

// A chat format's tool-call syntax (what its parser in chat/parsers reads back) and the strings
// that open a call in free text. The template text tells Qwen3-Coder's XML body from
// Hermes JSON and DeepSeek V3/R1 from V3.1. nullopt: kNone.
struct ToolCallFormat {
  grammar::ToolCallSyntax syntax;
  std::vector<engine::GrammarStart::Trigger> triggers;
};
std::optional<ToolCallFormat> tool_call_format(chat::ToolFormat format,
                                               std::string_view chat_template, bool parallel);
// Keeps the syntax's token markers that are control tokens of `tok` (those become token
// terminals: the mask allows the control token itself, not its text spelled out); the others
// stay text (a vocabulary that writes the marker as ordinary text, or lacks it).
void keep_control_markers(const tokenizer::Tokenizer& tok, grammar::ToolCallSyntax* syntax);

// spec_out (optional): the spec of the constraint read, when there is one (lazy_tool_call
// joins it with the tool calls).
std::optional<ApiError> read_constraint(const nlohmann::ordered_json& body, ServerContext& ctx,
                                        engine::GenerationRequest* request,
                                        grammar::ConstraintSpec* spec_out = nullptr);

// tool_choice required or named: the output is a tool call in the model's own format (its chat
// template's: Hermes/Qwen <tool_call> JSON, Qwen3-Coder's XML body, Llama 3 JSON, Mistral's
// [TOOL_CALLS] array, DeepSeek's call tokens) naming one of `tools` with arguments valid
// against its parameters; several calls unless parallel_tool_calls is false. A template without
// a tool-call format is left unconstrained. A request that already has a constraint
// (response_format, guided_*) is a 400.
std::optional<ApiError> force_tool_call(const nlohmann::ordered_json& body,
                                        const nlohmann::ordered_json& tools, ServerContext& ctx,
                                        engine::GenerationRequest* request);
// The same with the parallel switch given by the caller (Anthropic's tool_choice any / tool,
// whose disable_parallel_tool_use turns `parallel` off): at most one call when false.
std::optional<ApiError> force_tool_call(const nlohmann::ordered_json& tools, bool parallel,
                                        ServerContext& ctx, engine::GenerationRequest* request);

// tool_choice auto: a lazy grammar (engine/constraint_gate.h). The output is free until it opens
// a tool call in the format's syntax (its trigger: <tool_call>, [TOOL_CALLS], DeepSeek's
// calls-begin token, Llama 3's <|python_tag|> or a {"name" object at the start), and from there
// on it is calls of the offered tools with valid arguments, as with force_tool_call.
// With a response format (`answer`: the spec read_constraint read into request->grammar), the
// output is either an answer of that format or tool calls, constrained from its first byte:
// the grammar becomes the union of the two (vLLM's and llama.cpp's behaviour for
// response_format beside tools). Nothing changes when a tool's parameters cannot be compiled
// (logged; the calls stay unconstrained, or the response format alone), or when the request
// has a grammar and no `answer`.
void lazy_tool_call(const nlohmann::ordered_json& tools, bool parallel, ServerContext& ctx,
                    engine::GenerationRequest* request,
                    const grammar::ConstraintSpec* answer = nullptr);

// The reasoning exemption: with a reasoning template, the request's grammar (if any) applies
// from the end of the thinking block (engine::GrammarStart). `config`: the parser's
// configuration refined for the rendered prompt (adjust_for_prompt). A prompt that ends with
// the closing tag (thinking switched off by the template) gets no exemption.
void exempt_reasoning(const chat::ParserConfig& config, std::string_view rendered_prompt,
                      engine::GenerationRequest* request);

}  // namespace kiln::server
