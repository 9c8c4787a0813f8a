// Mistral tool calls. Older models (v3, Nemo): [TOOL_CALLS][{"name": .., "arguments": {..},
// "id": ..}, ...]. Newer tokenizers (v11+, tekken; Mistral Small 3.2, Devstral, Ministral):
// [TOOL_CALLS]NAME[ARGS]{..} or [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{..}, one marker per call.
#include "kiln/chat/parsers/tool_formats.h"

namespace kiln::chat::detail {
namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.' || c == ':';
}

BlockResult need_more_or_text(std::string_view buf, bool eof) {
  return eof ? BlockResult{BlockStatus::kText, buf.size()} : BlockResult{BlockStatus::kNeedMore};
}

BlockResult parse_array(std::string_view buf, size_t pos, size_t after_marker, bool eof,
                        ScanCache& cache) {
  JsonScan scan = scan_json_container(buf, pos, &cache);
  if (scan.status == JsonScan::kNeedMore) return need_more_or_text(buf, eof);
  if (scan.status == JsonScan::kInvalid) return {BlockStatus::kText, after_marker};
  if (auto calls = calls_from_json_array(buf.substr(pos, scan.end - pos))) {
    return {BlockStatus::kCalls, scan.end, std::move(*calls)};
  }
  return {BlockStatus::kText, scan.end};
}

// NAME[ARGS]{..} or NAME[CALL_ID]ID[ARGS]{..} from pos.
BlockResult parse_named(std::string_view buf, size_t pos, size_t after_marker, bool eof,
                        ScanCache& cache) {
  const BlockResult text{BlockStatus::kText, after_marker};
  const size_t name_start = pos;
  while (pos < buf.size() && is_name_char(buf[pos]) && pos - name_start <= kMaxNameBytes) ++pos;
  if (pos - name_start > kMaxNameBytes) return text;
  if (pos == buf.size()) return need_more_or_text(buf, eof);
  if (buf[pos] != '[' || pos == name_start) return text;
  std::string name(buf.substr(name_start, pos - name_start));
  switch (match_at(buf, pos, kMistralCallId)) {
    case Match::kPartial:
      return need_more_or_text(buf, eof);
    case Match::kFull:  // the model's id is dropped: ids are ours (make_tool_call_id)
      pos += kMistralCallId.size();
      for (const size_t id_start = pos; pos < buf.size() && is_name_char(buf[pos]); ++pos) {
        if (pos - id_start == kMaxNameBytes) return text;
      }
      if (pos == buf.size()) return need_more_or_text(buf, eof);
      break;
    case Match::kNo:
      break;
  }
  switch (match_at(buf, pos, kMistralArgs)) {
    case Match::kNo:
      return text;
    case Match::kPartial:
      return need_more_or_text(buf, eof);
    case Match::kFull:
      break;
  }
  pos = skip_space_bounded(buf, pos + kMistralArgs.size());
  if (pos == std::string_view::npos) return text;
  if (pos == buf.size()) return need_more_or_text(buf, eof);
  if (buf[pos] != '{') return text;
  JsonScan scan = scan_json_container(buf, pos, &cache);
  if (scan.status == JsonScan::kNeedMore) return need_more_or_text(buf, eof);
  if (scan.status == JsonScan::kInvalid) return text;
  if (auto args = compact_object(buf.substr(pos, scan.end - pos))) {
    return {BlockStatus::kCalls, scan.end, {RawCall{std::move(name), std::move(*args)}}};
  }
  return {BlockStatus::kText, scan.end};
}

}  // namespace

BlockResult parse_mistral_block(std::string_view buf, bool eof, ScanCache& cache) {
  const size_t after_marker = skip_space(buf, 0) + kMistralCalls.size();
  const size_t pos = skip_space_bounded(buf, after_marker);
  if (pos == std::string_view::npos) return {BlockStatus::kText, after_marker};
  if (pos == buf.size()) return need_more_or_text(buf, eof);
  if (buf[pos] == '[') return parse_array(buf, pos, after_marker, eof, cache);
  return parse_named(buf, pos, after_marker, eof, cache);
}

}  // namespace kiln::chat::detail
