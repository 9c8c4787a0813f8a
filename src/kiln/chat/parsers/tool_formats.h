// Internal to the output parser: the per-family tool-call syntax. Each function looks at
// the undecided buffer (which starts, after optional whitespace, with the family's marker)
// and either needs more text or decides how many bytes to take and what they are.
// Every decision depends only on the bytes it looked at, plus eof, so that any chunking of
// the output gives the same result (see output_parser.h).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/chat/output_parser.h"

namespace kiln::chat::detail {

struct RawCall {
  std::string name;
  std::string arguments_json;  // compact JSON object
};

enum class BlockStatus {
  kNeedMore,  // undecidable yet (never returned when eof)
  kCalls,     // the first num_consumed_bytes are well-formed calls
  kText,      // the first num_consumed_bytes (> 0) are malformed markup: content
  kNotACall,  // not a call after all; nothing consumed, continue as content
  kExit,      // DeepSeek block ends; num_consumed_bytes (whitespace, end marker) dropped
};

struct BlockResult {
  BlockStatus status = BlockStatus::kNeedMore;
  size_t num_consumed_bytes = 0;
  std::vector<RawCall> calls;
  bool stay_in_block = false;  // DeepSeek: more calls of the same block may follow
};

// ---- shared scanning helpers (json_scan.cpp) ----

bool is_json_space(char c);
size_t skip_space(std::string_view s, size_t pos);

// Most whitespace accepted where a tool-call syntax allows it (after a marker, between '{'
// and the first key); a longer run means "not a call". This bounds what a waiting block
// rescans on each feed when a model degenerates into emitting whitespace.
inline constexpr size_t kMaxSpaceBytes = 64;
// skip_space, but npos when the run is longer than kMaxSpaceBytes.
size_t skip_space_bounded(std::string_view s, size_t pos);

enum class Match { kNo, kPartial, kFull };
// Whether s[pos..] starts with lit (kFull), is a proper prefix of it (kPartial), or neither.
Match match_at(std::string_view s, size_t pos, std::string_view lit);

struct JsonScan {
  enum Status { kNeedMore, kEnd, kInvalid } status = kNeedMore;
  size_t end = 0;  // one past the closing bracket when kEnd
};
// ScanCache and kMaxJsonDepth: in scan_cache.h.

// s.find(lit, from), skipping what an earlier call with the same cache already searched.
// One literal per cache.
size_t find_resumable(std::string_view s, std::string_view lit, size_t from, ScanCache* cache);

// Finds the end of the JSON object or array starting at s[pos] ('{' or '['), by bracket
// balance outside strings. Deeper than kMaxJsonDepth, mismatched brackets, or a byte that
// JSON never has outside strings: kInvalid (end is the offending byte). With a cache, resumes an
// earlier scan from the same pos.
JsonScan scan_json_container(std::string_view s, size_t pos, ScanCache* cache = nullptr);

// Longest tool name (and Mistral call id) accepted; longer is not a call.
inline constexpr size_t kMaxNameBytes = 256;

// A call from a parsed JSON object {"name": str, <args_key>: object|string-of-object}; the
// first present key of args_keys is used; none present means {} unless args_required.
std::optional<RawCall> call_from_json(std::string_view object_text,
                                      const std::vector<std::string_view>& args_keys,
                                      bool args_required);
// Compact form of a JSON object text, or nullopt when it is not a valid JSON object.
std::optional<std::string> compact_object(std::string_view text);
// Validates and compacts a list of call objects: [{"name":..,"arguments":{..}}, ...].
std::optional<std::vector<RawCall>> calls_from_json_array(std::string_view array_text);

// ---- per family ----
BlockResult parse_hermes_block(std::string_view buf, bool eof, ScanCache& cache);
// buf starts with '{' or <|python_tag|>
BlockResult parse_llama_block(std::string_view buf, bool eof, ScanCache& cache);
BlockResult parse_mistral_block(std::string_view buf, bool eof, ScanCache& cache);
BlockResult parse_deepseek_block(std::string_view buf, bool eof, ScanCache& cache);
BlockResult parse_deepseek_inside(std::string_view buf, bool eof, ScanCache& cache);

// The marker that starts a tool-call block inside content ("" for none).
std::string_view tool_marker(ToolFormat format);

inline constexpr std::string_view kHermesOpen = "<tool_call>";
inline constexpr std::string_view kHermesClose = "</tool_call>";
inline constexpr std::string_view kLlamaPythonTag = "<|python_tag|>";
inline constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
inline constexpr std::string_view kMistralArgs = "[ARGS]";
inline constexpr std::string_view kMistralCallId = "[CALL_ID]";
inline constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
inline constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
inline constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
inline constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
inline constexpr std::string_view kDsSep = "<｜tool▁sep｜>";

}  // namespace kiln::chat::detail
