// Streaming parser for a model's output text: splits it into content, reasoning and tool
// calls as the text arrives. One state machine for every model family; the family only
// changes the tag strings and the tool-call syntax (ParserConfig). See docs/output-parsers.md.
//
// Invariants (the tests' oracle):
//  - Chunking does not matter: any split of the text into feed() calls (mid-tag, mid-UTF-8)
//    gives events whose accumulation equals parse_all() of the whole text.
//  - Content and reasoning deltas are never retracted: text that may still turn out to be
//    a tag is held back until it is decided, and no delta ends inside a UTF-8 sequence.
//  - Malformed tool calls (invalid or unterminated JSON, bad syntax) become content; no
//    input text is lost except the markup of well-formed calls and boundary whitespace.
//  - A tool call is emitted only once it is complete and valid, as three events in a row:
//    kToolCallBegin (index, id, name), one kToolCallArgs with the arguments object as
//    compact JSON (key order kept), kToolCallEnd.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/chat/parsers/scan_cache.h"

namespace kiln::chat {

// Tool-call syntax of a model family.
enum class ToolFormat {
  kNone,     // no tool calls: everything outside reasoning is content
  kHermes,   // <tool_call>{"name":..,"arguments":{..}}</tool_call> (Qwen 2.5/3, Hermes),
             // also Qwen3-Coder's <tool_call><function=..><parameter=..>..</tool_call>
  kLlama3,   // {"name":..,"parameters":{..}} at the start of the output (or after
             // <|python_tag|>); several separated by ';' or whitespace
  kMistral,  // [TOOL_CALLS][{"name":..,"arguments":{..}}, ...] or
             // [TOOL_CALLS]name[ARGS]{..} / [TOOL_CALLS]name[CALL_ID]id[ARGS]{..}
  kDeepSeek,  // <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name
              // ```json {..} ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜> (V3/R1), and the
              // V3.1 call body name<｜tool▁sep｜>{..}
};

std::string_view tool_format_name(ToolFormat format);
// The inverse of tool_format_name ("none", "hermes", "llama3", "mistral", "deepseek"), for
// flags that override detection; nullopt for any other name.
std::optional<ToolFormat> tool_format_from_name(std::string_view name);

struct ParserConfig {
  ToolFormat format = ToolFormat::kNone;
  // Recognize a reasoning block: think_open at the start of the output (after whitespace)
  // up to think_close. When false the tags are ordinary content.
  bool reasoning = false;
  // The prompt already opened the block (it ends with think_open): the output starts in
  // reasoning and only think_close ends it. A repeated think_open at the start is dropped.
  bool reasoning_open_at_start = false;
  std::string think_open = "<think>";
  std::string think_close = "</think>";
  // Tool-call ids are make_tool_call_id(format, id_seed, index): deterministic, so pass a
  // per-request value (e.g. the request number) to make them unique across requests.
  uint64_t id_seed = 0;
};

// Guesses the configuration from the chat template's text (markers it writes). Reasoning
// is on when the template mentions the think tags; reasoning_open_at_start when the
// generation-prompt part writes a string ending in the open tag. Prefer to refine with
// adjust_for_prompt() on the prompt actually rendered.
ParserConfig config_for_template(std::string_view chat_template);

// Refines reasoning_open_at_start from the rendered prompt: a prompt ending (whitespace
// aside) with think_open starts in reasoning; one ending with think_close does not.
void adjust_for_prompt(ParserConfig& config, std::string_view rendered_prompt);

// "call_" + 9 alphanumerics, or for kMistral the bare 9 alphanumerics its templates require.
std::string make_tool_call_id(ToolFormat format, uint64_t seed, int index);

struct Event {
  enum class Kind { kContent, kReasoning, kToolCallBegin, kToolCallArgs, kToolCallEnd };
  Kind kind = Kind::kContent;
  std::string text;       // kContent/kReasoning: the delta; kToolCallArgs: arguments JSON delta
  int tool_index = -1;    // tool-call events: 0, 1, ... in order of appearance
  std::string tool_id;    // kToolCallBegin only
  std::string tool_name;  // kToolCallBegin only
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments_json;  // a JSON object, compact
  bool operator==(const ToolCall&) const = default;
};

struct ParsedMessage {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  bool operator==(const ParsedMessage&) const = default;
};

// Folds events into a message (what a client does with the deltas).
void accumulate(ParsedMessage& message, const std::vector<Event>& events);

class OutputParser {
 public:
  explicit OutputParser(ParserConfig config);

  // Appends text (any split, even inside a UTF-8 sequence) and returns what is decided.
  std::vector<Event> feed(std::string_view text);
  // End of output: decides everything still held (unterminated calls become content).
  std::vector<Event> finish();

 private:
  enum class State {
    kStart,           // nothing decided yet; leading whitespace is dropped
    kReasoningStart,  // inside reasoning, before its first non-space character
    kReasoning,       // inside reasoning
    kContentStart,    // after reasoning or a tool call: whitespace dropped, Llama call check
    kContent,         // plain content, scanning for the tool-call marker
    kToolBlock,       // buffer starts (after whitespace) with a tool-call marker
    kLlamaStart,      // buffer starts with '{' at the start of content (Llama 3)
    kDeepSeekInside,  // between calls of a DeepSeek <｜tool▁calls▁begin｜> block
  };

  // One decision on the buffer; false when nothing more can be decided without more text.
  bool step(bool eof);
  bool step_start(bool eof);
  bool step_reasoning_start(bool eof);
  bool step_reasoning(bool eof);
  bool step_content_start();
  bool step_content(bool eof);
  bool step_tool(bool eof);
  void run(bool eof);

  void emit_text(Event::Kind kind, std::string_view text);
  void emit_call(const std::string& name, const std::string& arguments_json);
  // The undecided text: text_ from start_. Consuming moves start_; the consumed prefix is
  // erased only once it is most of text_, so one large feed() stays linear.
  std::string_view buf() const { return std::string_view(text_).substr(start_); }
  void consume(size_t num_bytes);

  ParserConfig config_;
  State state_ = State::kStart;
  std::string text_;  // text received; text_[0, start_) is decided
  size_t start_ = 0;
  std::vector<Event> out_;
  int num_calls_ = 0;
  bool after_call_ = false;  // Llama: ';' between calls is a separator
  bool finished_ = false;
  bool open_tag_checked_ = false;  // a repeated think_open at the start was dropped
  detail::ScanCache scan_cache_;   // resumable scans of a waiting block
};

// The non-streaming parse: one feed of the whole text, then finish().
ParsedMessage parse_all(const ParserConfig& config, std::string_view text);

}  // namespace kiln::chat
