// Anthropic Messages (https://docs.anthropic.com/en/api/messages) translated to and from the
// chat pipeline (chat_pipeline.h), as pure functions the handlers and the tests share:
//  - the request: system (string or text blocks; cache_control accepted and ignored),
//    messages of content blocks, tools (custom ones with input_schema, and Anthropic's
//    server tools with a synthesized schema), tool_choice and thinking -> a ChatTurn;
//  - the output: the output parser's events -> content blocks (thinking, text, tool_use),
//    the same sequence for a stream (block start/delta/stop) and for a whole message.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/chat/output_parser.h"
#include "kiln/engine/api.h"
#include "kiln/server/chat_pipeline.h"
#include "kiln/server/errors.h"

namespace kiln::server::anthropic {

struct ConvertOptions {
  // Drop the known-volatile lines of the system prompt (normalize_system_prompt).
  bool normalize_volatile_system = true;
};

// What a Messages body becomes before tokenization.
struct MessagesRequest {
  ChatTurn turn;
  bool thinking = false;                   // thinking.type enabled (or adaptive)
  std::optional<int32_t> thinking_budget;  // thinking.budget_tokens
  bool disable_parallel_tool_use = false;  // keep only the first tool_use of a reply
  std::vector<std::string> stop_sequences;
};

// Reads system, messages, tools, tool_choice, thinking and stop_sequences (not the sampling
// fields or max_tokens, which the generic readers take). Errors name the field at fault
// ("messages[2].content[0]").
std::variant<MessagesRequest, ApiError> parse_request(const Json& body, const ConvertOptions& opts);

// Claude Code writes "x-anthropic-billing-header: cc_version=...; cch=<changes every
// request>;" as the first line of its system prompt: a value that carries no meaning for
// the model and would defeat prefix caching from the first token. Such lines are removed.
std::string normalize_system_prompt(std::string_view system);

// The function schema of an Anthropic server tool ({"type":"bash_20250124","name":"bash"}):
// {"type":"function","function":{"name","description","parameters"}}; nullopt when `tool`
// is not a server tool (it has an input_schema, or no versioned type).
std::optional<Json> server_tool_function(const Json& tool);

// A tool_result's content (a string or blocks) as the text the template shows the model:
// text, documents, search results and tool references as text, images as a placeholder.
std::string tool_result_text(const Json& content);

// Content blocks built from the parser's events. The stream and the whole message go
// through the same builder, so a streamed message accumulates to the non-streamed one.
class BlockBuilder {
 public:
  // What happened to the blocks, in order; `index` is the block's position in content.
  struct Op {
    enum class Kind { kStart, kDelta, kStop } kind = Kind::kStart;
    int index = 0;
    Json block;  // kStart: the content_block; kDelta: the delta object
  };

  explicit BlockBuilder(bool disable_parallel_tool_use = false)
      : single_tool_(disable_parallel_tool_use) {}

  // Feeds parser events; returns the block operations they cause.
  std::vector<Op> feed(const std::vector<chat::Event>& events);
  // Closes the open block (the thinking block gets its signature delta first).
  std::vector<Op> finish();

  const Json& content() const { return content_; }  // the accumulated blocks
  bool saw_tool_use() const { return num_tools_ > 0; }

 private:
  enum class Open { kNone, kThinking, kText, kToolUse };
  void open(Open kind, Json block, std::vector<Op>& ops);
  void close(std::vector<Op>& ops);
  void delta(Json d, std::vector<Op>& ops);

  Json content_ = Json::array();
  Open open_ = Open::kNone;
  std::string thinking_;  // of the open thinking block (its signature)
  std::string tool_args_;
  int num_tools_ = 0;
  bool single_tool_ = false;
  bool skipping_tool_ = false;  // a second tool call when parallel calls are disabled
};

// An opaque signature of a thinking block (clients send it back with the block; kiln does
// not check it).
std::string thinking_signature(std::string_view thinking);

// "end_turn", "max_tokens", "stop_sequence" or "tool_use".
const char* stop_reason(const engine::FinishEvent& finish, bool saw_tool_use);

// The usage object: input_tokens counts the prompt tokens not read from the prefix cache,
// as Anthropic's API does (input_tokens + cache_read_input_tokens is the whole prompt).
Json usage(int32_t num_prompt, int32_t num_cached, int32_t num_output);

}  // namespace kiln::server::anthropic
