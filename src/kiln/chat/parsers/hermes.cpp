// Hermes / Qwen tool calls: <tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>, and
// the Qwen3-Coder body inside the same tags:
//   <function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>
#include <nlohmann/json.hpp>

#include "kiln/chat/parsers/tool_formats.h"

namespace kiln::chat::detail {
namespace {

using ordered_json = nlohmann::ordered_json;

std::string_view trim(std::string_view s) {
  size_t b = skip_space(s, 0);
  size_t e = s.size();
  while (e > b && is_json_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// A parameter value of the XML style. The template writes objects and lists as JSON and
// everything else with |string, so without the tool's schema: a value that is valid JSON
// (number, true/false/null, object, list, quoted string) is taken as that JSON value,
// anything else as a string.
ordered_json xml_value(std::string_view raw) {
  std::string_view v = trim(raw);
  if (!v.empty() && (v[0] == '{' || v[0] == '[')) {
    if (JsonScan scan = scan_json_container(v, 0);
        scan.status == JsonScan::kEnd && scan.end == v.size()) {
      ordered_json j = ordered_json::parse(v.begin(), v.end(), nullptr, false);
      if (!j.is_discarded()) return j;
    }
  } else if (!v.empty()) {
    ordered_json j = ordered_json::parse(v.begin(), v.end(), nullptr, false);
    if (!j.is_discarded()) return j;
  }
  // The template writes "<parameter=k>\n" VALUE "\n</parameter>": drop exactly those newlines.
  if (!raw.empty() && raw.front() == '\n') raw.remove_prefix(1);
  if (!raw.empty() && raw.back() == '\n') raw.remove_suffix(1);
  return ordered_json(std::string(raw));
}

std::optional<RawCall> parse_xml_call(std::string_view body) {
  constexpr std::string_view kFunction = "<function=";
  constexpr std::string_view kFunctionEnd = "</function>";
  constexpr std::string_view kParam = "<parameter=";
  constexpr std::string_view kParamEnd = "</parameter>";
  if (body.substr(0, kFunction.size()) != kFunction) return std::nullopt;
  size_t pos = kFunction.size();
  size_t gt = body.find('>', pos);
  if (gt == std::string_view::npos || gt == pos) return std::nullopt;
  RawCall call{std::string(body.substr(pos, gt - pos)), ""};
  if (call.name.find_first_of(" \t\r\n<") != std::string::npos) return std::nullopt;
  ordered_json args = ordered_json::object();
  pos = gt + 1;
  for (;;) {
    pos = skip_space(body, pos);
    if (body.substr(pos, kFunctionEnd.size()) == kFunctionEnd) {
      pos += kFunctionEnd.size();
      break;
    }
    if (body.substr(pos, kParam.size()) != kParam) return std::nullopt;
    pos += kParam.size();
    gt = body.find('>', pos);
    if (gt == std::string_view::npos || gt == pos) return std::nullopt;
    std::string key(body.substr(pos, gt - pos));
    size_t end = body.find(kParamEnd, gt + 1);
    if (end == std::string_view::npos) return std::nullopt;
    args[key] = xml_value(body.substr(gt + 1, end - gt - 1));
    pos = end + kParamEnd.size();
  }
  if (skip_space(body, pos) != body.size()) return std::nullopt;
  call.arguments_json = args.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  return call;
}

std::optional<RawCall> parse_body(std::string_view body) {
  body = trim(body);
  if (body.substr(0, 1) == "<") return parse_xml_call(body);
  return call_from_json(body, {"arguments", "parameters"}, /*args_required=*/false);
}

}  // namespace

namespace {

BlockResult need_more_or_text(std::string_view buf, bool eof) {
  return eof ? BlockResult{BlockStatus::kText, buf.size()} : BlockResult{BlockStatus::kNeedMore};
}

// A JSON body is delimited by its own brackets, then </tool_call>: an argument string may
// itself contain "</tool_call>". nullopt: not that shape, fall back to the first close tag.
std::optional<BlockResult> parse_json_block(std::string_view buf, size_t json_start, bool eof,
                                            ScanCache& cache) {
  const JsonScan scan = scan_json_container(buf, json_start, &cache);
  if (scan.status == JsonScan::kNeedMore) return need_more_or_text(buf, eof);
  if (scan.status == JsonScan::kInvalid) return std::nullopt;
  const std::string_view json = buf.substr(json_start, scan.end - json_start);
  const size_t after = skip_space_bounded(buf, scan.end);
  if (after == buf.size()) {
    if (!eof) return BlockResult{BlockStatus::kNeedMore};
    // The output ended without the closing tag: accept a complete call anyway (small
    // models often stop right after the JSON).
    if (auto call = parse_body(json)) return BlockResult{BlockStatus::kCalls, buf.size(), {*call}};
    return BlockResult{BlockStatus::kText, buf.size()};
  }
  if (after == std::string_view::npos) return std::nullopt;
  switch (match_at(buf, after, kHermesClose)) {
    case Match::kFull: {
      const size_t end = after + kHermesClose.size();
      if (auto call = parse_body(json)) return BlockResult{BlockStatus::kCalls, end, {*call}};
      return BlockResult{BlockStatus::kText, end};
    }
    case Match::kPartial:
      return need_more_or_text(buf, eof);
    case Match::kNo:
      break;
  }
  return std::nullopt;
}

}  // namespace

BlockResult parse_hermes_block(std::string_view buf, bool eof, ScanCache& cache) {
  const size_t open = skip_space(buf, 0);
  const size_t body_start = open + kHermesOpen.size();
  const size_t json_start = skip_space_bounded(buf, body_start);
  if (json_start == buf.size()) return need_more_or_text(buf, eof);
  if (json_start != std::string_view::npos && buf[json_start] == '{') {
    if (auto r = parse_json_block(buf, json_start, eof, cache)) return std::move(*r);
  }
  // Other bodies (Qwen3-Coder XML) and malformed JSON end at the first close tag.
  const size_t close = find_resumable(buf, kHermesClose, body_start, &cache);
  if (close == std::string_view::npos) {
    if (!eof) return {BlockStatus::kNeedMore};
    if (auto call = parse_body(buf.substr(body_start))) {
      return {BlockStatus::kCalls, buf.size(), {std::move(*call)}};
    }
    return {BlockStatus::kText, buf.size()};
  }
  const size_t end = close + kHermesClose.size();
  if (auto call = parse_body(buf.substr(body_start, close - body_start))) {
    return {BlockStatus::kCalls, end, {std::move(*call)}};
  }
  return {BlockStatus::kText, end};
}

}  // namespace kiln::chat::detail
