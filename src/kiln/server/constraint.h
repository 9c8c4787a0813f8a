// Structured output fields of a chat or completions body, compiled into the request's grammar:
//   response_format {"type":"json_object"} | {"type":"json_schema","json_schema":{"schema":..}}
//   guided_json / guided_regex / guided_grammar / guided_choice (vLLM's names), and the shorter
//   json_schema / regex / grammar / choice (llama-server's `grammar`, `json_schema`).
// At most one may be given; compile errors are a 400 naming the field.
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

#include "kiln/engine/api.h"
#include "kiln/server/context.h"
#include "kiln/server/errors.h"

namespace kiln::server {

std::optional<ApiError> read_constraint(const nlohmann::ordered_json& body, ServerContext& ctx,
                                        engine::GenerationRequest* request);

// tool_choice required or named: the output is a tool call in the model's own format (its chat
// template's: Hermes/Qwen <tool_call> JSON, Llama 3 JSON) naming one of `tools` with arguments
// valid against its parameters; several calls unless parallel_tool_calls is false. Formats
// without a grammar yet (Mistral, DeepSeek) are left unconstrained. A request that already has
// a constraint (response_format, guided_*) is a 400.
std::optional<ApiError> force_tool_call(const nlohmann::ordered_json& body,
                                        const nlohmann::ordered_json& tools, ServerContext& ctx,
                                        engine::GenerationRequest* request);
// The same with the parallel switch given by the caller (Anthropic's tool_choice any / tool,
// whose disable_parallel_tool_use turns `parallel` off): at most one call when false.
std::optional<ApiError> force_tool_call(const nlohmann::ordered_json& tools, bool parallel,
                                        ServerContext& ctx, engine::GenerationRequest* request);

}  // namespace kiln::server
