// The chat pipeline every chat-shaped surface shares (OpenAI chat, Anthropic messages and
// count_tokens): template-ready messages and tools -> the rendered, tokenized prompt (the
// BOS rule and the content guard of chat_prompt.h) -> the output parser's configuration for
// that prompt (tool format, reasoning open at the start, tool-call id seed) -> n engine
// requests. Each surface only translates its own request shape into a ChatTurn and the
// parsed output events back into its own response shape.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "kiln/chat/output_parser.h"
#include "kiln/engine/api.h"
#include "kiln/server/chat_prompt.h"
#include "kiln/server/context.h"
#include "kiln/server/errors.h"
#include "kiln/server/generation.h"

namespace kiln::server {

// A conversation in the template's vocabulary (OpenAI-style messages: role, content as a
// string, tool_calls with function.arguments as an object, role "tool" with tool_call_id).
struct ChatTurn {
  Json messages = Json::array();
  Json tools;                    // null: none passed to the template
  bool parse_tools = false;      // tool calls are parsed from the output
  bool force_tool_call = false;  // tool_choice required or named (server/constraint.h)
  Json chat_template_kwargs = Json::object();
};

struct PreparedChat {
  ChatPrompt prompt;                 // text and tokens
  chat::ParserConfig parser_config;  // for this prompt
  int32_t num_prompt_tokens() const { return static_cast<int32_t>(prompt.tokens.size()); }
};

// Renders and tokenizes; a template that cannot render is a 400 naming `messages`.
std::variant<PreparedChat, ApiError> prepare_chat(ServerContext& ctx, ChatTurn turn);

// n requests over the prepared prompt (seeds engine::choice_seed(seed, i); request ids
// "<id>-<i>" when n > 1). Special tokens stay in the text when the parser needs to see
// tool-call or reasoning markers.
std::vector<engine::GenerationRequest> fan_out(const PreparedChat& chat,
                                               const engine::GenerationRequest& base,
                                               const std::string& request_id, int32_t n);

}  // namespace kiln::server
