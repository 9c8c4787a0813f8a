// OpenAI Responses (https://platform.openai.com/docs/api-reference/responses, and the Open
// Responses specification, https://www.openresponses.org) translated to and from the chat
// pipeline (chat_pipeline.h), as pure functions the handlers and the tests share:
//  - the request: instructions, input (a string or items: message, reasoning, function_call,
//    function_call_output, custom_tool_call(_output), local_shell_call(_output)), tools
//    (function; custom free-form tools and local_shell with synthesized schemas; hosted tools
//    left out with a warning), tool_choice, reasoning.effort -> a ChatTurn;
//  - the output: the output parser's events -> output items (reasoning, message,
//    function_call, custom_tool_call, local_shell_call) and the stream's named events, the
//    same sequence for a stream and for a whole response;
//  - the response object and its usage.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/chat/output_parser.h"
#include "kiln/engine/api.h"
#include "kiln/server/chat_pipeline.h"
#include "kiln/server/errors.h"

namespace kiln::server::responses {

// How a tool offered to the model is called, and so which output item its calls become.
enum class ToolKind {
  kFunction,    // function_call with JSON arguments
  kCustom,      // custom_tool_call with free-form text: the model sees {"input": string}
  kLocalShell,  // local_shell_call with an exec action: the model sees {"command": [..], ..}
};

// What a Responses body becomes before tokenization.
struct ResponsesRequest {
  ChatTurn turn;
  Json input_items = Json::array();            // this request's input as items (a string: one
                                               // user message item), for the store
  std::map<std::string, ToolKind> tool_kinds;  // by the name the model calls
  std::vector<std::string> warnings;           // what was left out (hosted tools, items)
  bool parallel_tool_calls = true;
  std::optional<std::string> reasoning_effort;
};

// Reads instructions, input, tools, tool_choice, parallel_tool_calls, reasoning and metadata
// (not the sampling fields, max_output_tokens or text.format, which the generic readers
// take). `history` holds the items of the previous response's conversation (input and
// output, as stored), or null. Errors name the field at fault ("input[2].content[0]").
std::variant<ResponsesRequest, ApiError> parse_request(const Json& body, const Json& history);

// The function schema the model sees for a custom tool (free-form text in one "input" field)
// and for local_shell.
Json custom_tool_function(const Json& tool);
Json local_shell_function();

// A function_call_output's output (a string or content parts) as text for the template:
// text parts as text, images and files as placeholders.
std::string tool_output_text(const Json& output);

// ---------------------------------------------------------------------------------------
// Context compaction (POST /v1/responses/compact). The model writes a summary of the
// conversation; the compacted output keeps the conversation's user messages and ends with
// one `compaction` item whose encrypted_content carries the summary. kiln does not encrypt
// it (the client owns the conversation and the server): the content is opaque by contract,
// a versioned prefix and the summary in base64, and the only thing a client does with it is
// send the item back in a later input, where it becomes the summary as a user message.

// The instruction appended as the last user message of the conversation to compact.
extern const char* const kCompactionPrompt;
// The text a compaction item becomes in the prompt: a heading, then the summary.
extern const char* const kCompactionSummaryHeading;

std::string encode_compaction(std::string_view summary);
// The summary, or nullopt when `encrypted_content` is not kiln's (another server's
// compaction, encrypted with a key this server does not hold) or is corrupt (is_kiln true).
std::optional<std::string> decode_compaction(std::string_view encrypted_content, bool* is_kiln);

// The compacted output of `conversation` (input items as stored: earlier turns, then this
// request's input, without the compaction prompt): its user messages as output message items
// (earlier compaction items dropped: the new summary covers them), then the compaction item.
Json compacted_output(const Json& conversation, std::string_view summary);

// The usage object; input_tokens is the whole prompt, cached_tokens the part read from the
// prefix cache.
Json usage(int32_t num_prompt, int32_t num_cached, int32_t num_output, int32_t num_reasoning);

// Counts the output tokens spent inside the reasoning block (output_tokens_details.
// reasoning_tokens): every token fed from the block's start to the one closing it.
class ReasoningCounter {
 public:
  explicit ReasoningCounter(chat::ParserConfig config) : config_(std::move(config)) {}
  void feed(std::string_view token_text);  // one token's text
  int32_t num_reasoning_tokens() const { return num_reasoning_; }

 private:
  chat::ParserConfig config_;
  std::string text_;
  bool done_ = false;          // the block closed, or the output had none
  int32_t num_undecided_ = 0;  // leading tokens not yet known to open a block
  int32_t num_reasoning_ = 0;
};

// Output items built from the parser's events. feed() and finish() return the stream events
// they cause (each {"type": .., ...} without its sequence_number); the accumulated items are
// output(). The stream and the whole response go through the same builder, so a streamed
// response accumulates to the non-streamed one.
class OutputBuilder {
 public:
  OutputBuilder(std::map<std::string, ToolKind> tool_kinds, bool parallel_tool_calls)
      : tool_kinds_(std::move(tool_kinds)), single_tool_(!parallel_tool_calls) {}

  std::vector<Json> feed(const std::vector<chat::Event>& events);
  // Closes the open item; `incomplete`: the output was cut (max_output_tokens), so an open
  // message ends with status "incomplete".
  std::vector<Json> finish(bool incomplete);

  const Json& output() const { return output_; }
  bool saw_tool_call() const { return num_tools_ > 0; }

 private:
  enum class Open { kNone, kReasoning, kMessage, kToolCall };
  void open(Open kind, Json item, std::vector<Json>& events);
  void close(const char* status, std::vector<Json>& events);
  void append_text(const std::string& text, std::vector<Json>& events);
  void close_tool_call(std::vector<Json>& events);
  int index() const { return static_cast<int>(output_.size()) - 1; }

  std::map<std::string, ToolKind> tool_kinds_;
  Json output_ = Json::array();
  Open open_ = Open::kNone;
  std::string text_;  // of the open reasoning or message item
  std::string tool_args_;
  ToolKind tool_kind_ = ToolKind::kFunction;
  int num_tools_ = 0;
  bool single_tool_ = false;
  bool skipping_tool_ = false;  // a second call when parallel calls are off
};

// The fields of a response object that echo the request (the Open Responses
// ResponseResource requires each of them).
struct Echo {
  Json instructions;  // string or null
  Json tools = Json::array();
  Json tool_choice = "auto";
  bool parallel_tool_calls = true;
  Json text = Json{{"format", {{"type", "text"}}}};
  Json reasoning = Json{{"effort", nullptr}, {"summary", nullptr}};
  Json metadata = Json::object();
  bool store = true;
  Json previous_response_id;  // string or null
  Json max_output_tokens;     // integer or null
  double temperature = 1.0;
  double top_p = 1.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  Json user;               // string or null
  Json prompt_cache_key;   // string or null
  Json safety_identifier;  // string or null
};

// Reads the echoed fields from a body (after parse_request accepted it).
Echo read_echo(const Json& body);

struct ResponseState {
  std::string id;
  int64_t created_at = 0;
  std::string status = "in_progress";  // in_progress, completed, incomplete, failed
  std::string model;
  Json output = Json::array();
  Json usage;               // null until the end
  Json incomplete_details;  // {"reason": "max_output_tokens"} or null
  Json error;               // {"code", "message"} or null
  std::optional<int64_t> completed_at;
  std::vector<std::string> warnings;
};

// The response object: every required field of the spec, in the spec's order.
Json response_object(const ResponseState& state, const Echo& echo);

}  // namespace kiln::server::responses
