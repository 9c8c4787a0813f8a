// DeepSeek tool calls (tokens spelled with fullwidth bars U+FF5C and U+2581, as in the
// DeepSeek V3/R1/V3.1 chat templates):
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{..}\n```
//   <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>                                 (V3, R1)
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{..}<｜tool▁call▁end｜>...  (V3.1)
// Each call is emitted as soon as its <｜tool▁call▁end｜> arrives.
#include "kiln/chat/parsers/tool_formats.h"

namespace kiln::chat::detail {
namespace {

std::string_view trim(std::string_view s) {
  size_t b = skip_space(s, 0);
  size_t e = s.size();
  while (e > b && is_json_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

bool valid_name(std::string_view name) {
  return !name.empty() && name.find_first_of(" \t\r\n`{<") == std::string_view::npos;
}

std::optional<RawCall> parse_call_body(std::string_view body) {
  const size_t sep = body.find(kDsSep);
  if (sep == std::string_view::npos) return std::nullopt;
  std::string_view left = trim(body.substr(0, sep));
  std::string_view right = body.substr(sep + kDsSep.size());
  const size_t fence = right.find("```");
  std::string_view name;
  std::string_view json;
  if (fence != std::string_view::npos) {  // V3/R1: TYPE<sep>NAME\n```json\n{..}\n```
    name = trim(right.substr(0, fence));
    std::string_view rest = right.substr(fence + 3);
    if (rest.substr(0, 4) == "json") rest.remove_prefix(4);
    const size_t close = rest.rfind("```");
    if (close == std::string_view::npos || !trim(rest.substr(close + 3)).empty()) {
      return std::nullopt;
    }
    json = rest.substr(0, close);
  } else {  // V3.1: NAME<sep>{..}
    name = left;
    json = right;
  }
  if (!valid_name(name)) return std::nullopt;
  auto args = compact_object(trim(json));
  if (!args) return std::nullopt;
  return RawCall{std::string(name), std::move(*args)};
}

// One <｜tool▁call▁begin｜>..<｜tool▁call▁end｜> starting at pos (which matches the begin
// token at least partially); `otherwise` is the answer when it does not.
BlockResult parse_call(std::string_view buf, size_t pos, bool eof, ScanCache& cache,
                       BlockResult otherwise) {
  switch (match_at(buf, pos, kDsCallBegin)) {
    case Match::kNo:
      return otherwise;
    case Match::kPartial:
      return eof ? otherwise : BlockResult{BlockStatus::kNeedMore};
    case Match::kFull:
      break;
  }
  const size_t body_start = pos + kDsCallBegin.size();
  const size_t close = find_resumable(buf, kDsCallEnd, body_start, &cache);
  if (close == std::string_view::npos) {
    return eof ? BlockResult{BlockStatus::kText, buf.size()} : BlockResult{BlockStatus::kNeedMore};
  }
  const size_t end = close + kDsCallEnd.size();
  if (auto call = parse_call_body(buf.substr(body_start, close - body_start))) {
    return {BlockStatus::kCalls, end, {std::move(*call)}, /*stay_in_block=*/true};
  }
  return {BlockStatus::kText, end};
}

}  // namespace

BlockResult parse_deepseek_block(std::string_view buf, bool eof, ScanCache& cache) {
  const size_t after_marker = skip_space(buf, 0) + kDsCallsBegin.size();
  const size_t pos = skip_space_bounded(buf, after_marker);
  if (pos == std::string_view::npos) return {BlockStatus::kText, after_marker};
  if (pos == buf.size()) {
    return eof ? BlockResult{BlockStatus::kText, buf.size()} : BlockResult{BlockStatus::kNeedMore};
  }
  // A block that does not go on with a call: its marker is text.
  return parse_call(buf, pos, eof, cache, {BlockStatus::kText, after_marker});
}

BlockResult parse_deepseek_inside(std::string_view buf, bool eof, ScanCache& cache) {
  const size_t pos = skip_space(buf, 0);
  if (pos == buf.size()) {
    return eof ? BlockResult{BlockStatus::kExit, pos} : BlockResult{BlockStatus::kNeedMore};
  }
  switch (match_at(buf, pos, kDsCallsEnd)) {
    case Match::kFull:
      return {BlockStatus::kExit, pos + kDsCallsEnd.size()};
    case Match::kPartial:
      // Both end tokens share "<｜tool▁call"; wait until one of them is decided.
      if (!eof) return {BlockStatus::kNeedMore};
      break;
    case Match::kNo:
      break;
  }
  // Anything else ends the block (the model left out the end token); it is content.
  return parse_call(buf, pos, eof, cache, {BlockStatus::kExit, 0});
}

}  // namespace kiln::chat::detail
