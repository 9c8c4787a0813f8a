// Llama 3.x JSON tool calls: the output is {"name": .., "parameters": {..}} (or
// "arguments"), possibly after <|python_tag|>. The decision is made on the first key:
// content that starts with '{' is held only until its first key is known, so an ordinary
// JSON answer ({"answer": 42}) flows as content at once.
#include <array>

#include "kiln/chat/parsers/tool_formats.h"

namespace kiln::chat::detail {
namespace {

// First keys that mark a call. Llama 3.2 sometimes writes {"type": "function", "name": ..}.
constexpr std::array<std::string_view, 2> kFirstKeys = {"name", "type"};

// Whether s[pos..] ('{' at pos) starts like a call object: kFull once the first key is
// one of kFirstKeys, kPartial while it could still be, kNo otherwise.
Match call_object_prefix(std::string_view s, size_t pos) {
  size_t p = skip_space_bounded(s, pos + 1);
  if (p == std::string_view::npos) return Match::kNo;
  if (p == s.size()) return Match::kPartial;
  if (s[p] != '"') return Match::kNo;
  const size_t key_start = p + 1;
  const size_t quote = s.find('"', key_start);
  std::string_view key = s.substr(
      key_start, quote == std::string_view::npos ? std::string_view::npos : quote - key_start);
  bool any_partial = false;
  for (std::string_view want : kFirstKeys) {
    if (quote != std::string_view::npos && key == want) return Match::kFull;
    if (quote == std::string_view::npos && want.substr(0, key.size()) == key) any_partial = true;
  }
  return any_partial ? Match::kPartial : Match::kNo;
}

}  // namespace

BlockResult parse_llama_block(std::string_view buf, bool eof, ScanCache& cache) {
  size_t pos = skip_space(buf, 0);
  const bool tagged = match_at(buf, pos, kLlamaPythonTag) == Match::kFull;
  size_t after_tag = pos;
  if (tagged) {
    after_tag = pos + kLlamaPythonTag.size();
    pos = skip_space_bounded(buf, after_tag);
    if (pos == std::string_view::npos) return {BlockStatus::kText, after_tag};
  }
  // Not a call: after the tag, the tag itself is text and the rest is content again.
  const BlockResult not_a_call =
      tagged ? BlockResult{BlockStatus::kText, after_tag} : BlockResult{BlockStatus::kNotACall};
  if (pos == buf.size()) return eof ? not_a_call : BlockResult{BlockStatus::kNeedMore};
  if (buf[pos] != '{') return not_a_call;
  switch (call_object_prefix(buf, pos)) {
    case Match::kNo:
      return not_a_call;
    case Match::kPartial:
      return eof ? not_a_call : BlockResult{BlockStatus::kNeedMore};
    case Match::kFull:
      break;
  }
  JsonScan scan = scan_json_container(buf, pos, &cache);
  if (scan.status == JsonScan::kNeedMore) {
    return eof ? BlockResult{BlockStatus::kText, buf.size()} : BlockResult{BlockStatus::kNeedMore};
  }
  // Not JSON: the text up to the offending byte is content, and the rest is parsed as
  // content (the byte may start a UTF-8 sequence, so it is not cut off here).
  if (scan.status == JsonScan::kInvalid) return {BlockStatus::kText, scan.end};
  if (auto call = call_from_json(buf.substr(pos, scan.end - pos), {"parameters", "arguments"},
                                 /*args_required=*/true)) {
    return {BlockStatus::kCalls, scan.end, {std::move(*call)}};
  }
  return {BlockStatus::kText, scan.end};
}

}  // namespace kiln::chat::detail
