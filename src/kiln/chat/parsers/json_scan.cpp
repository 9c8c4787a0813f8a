// Scanning helpers shared by the tool-call formats: literal matching that knows about
// partial input, and finding where a JSON object ends before parsing it.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "kiln/chat/parsers/tool_formats.h"

namespace kiln::chat::detail {

using ordered_json = nlohmann::ordered_json;

bool is_json_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

size_t skip_space(std::string_view s, size_t pos) {
  while (pos < s.size() && is_json_space(s[pos])) ++pos;
  return pos;
}

size_t skip_space_bounded(std::string_view s, size_t pos) {
  const size_t end = skip_space(s.substr(0, std::min(s.size(), pos + kMaxSpaceBytes + 1)), pos);
  return end - pos > kMaxSpaceBytes ? std::string_view::npos : end;
}

Match match_at(std::string_view s, size_t pos, std::string_view lit) {
  std::string_view rest = pos < s.size() ? s.substr(pos) : std::string_view();
  if (rest.size() >= lit.size())
    return rest.substr(0, lit.size()) == lit ? Match::kFull : Match::kNo;
  return lit.substr(0, rest.size()) == rest ? Match::kPartial : Match::kNo;
}

size_t find_resumable(std::string_view s, std::string_view lit, size_t from, ScanCache* cache) {
  const size_t start = cache ? std::max(from, cache->find_from) : from;
  const size_t found = s.find(lit, start);
  if (found == std::string_view::npos && cache) {
    // A later match may start in the last lit.size() - 1 bytes, not before.
    cache->find_from = s.size() >= lit.size() ? s.size() - lit.size() + 1 : 0;
  }
  return found;
}

namespace {

// Outside strings JSON has only structure, numbers and true/false/null.
bool can_appear_outside_strings(char c) {
  switch (c) {
    case ',':
    case ':':
    case '-':
    case '+':
    case '.':
    case 't':
    case 'r':
    case 'u':
    case 'e':
    case 'f':
    case 'a':
    case 'l':
    case 's':
    case 'n':
    case 'E':
      return true;
    default:
      return (c >= '0' && c <= '9') || is_json_space(c);
  }
}

}  // namespace

JsonScan scan_json_container(std::string_view s, size_t pos, ScanCache* cache) {
  ScanCache local;
  ScanCache& st = cache ? *cache : local;
  if (st.json_start != pos) {
    st.json_start = pos;
    st.json_pos = pos;
    st.depth = 0;
    st.in_string = false;
    st.escaped = false;
    st.json_done = false;
  }
  // A finished scan keeps its answer: the buffer is only appended to while cached.
  if (st.json_done) return {static_cast<JsonScan::Status>(st.json_status), st.json_end};
  auto done = [&st](JsonScan::Status status, size_t end) {
    st.json_done = true;
    st.json_status = status;
    st.json_end = end;
    return JsonScan{status, end};
  };
  for (size_t i = st.json_pos; i < s.size(); ++i) {
    const char c = s[i];
    if (st.in_string) {
      if (st.escaped) {
        st.escaped = false;
      } else if (c == '\\') {
        st.escaped = true;
      } else if (c == '"') {
        st.in_string = false;
      }
      continue;
    }
    if (c == '"') {
      st.in_string = true;
    } else if (c == '{' || c == '[') {
      if (st.depth == kMaxJsonDepth) return done(JsonScan::kInvalid, i);
      st.stack[st.depth++] = c;
    } else if (c == '}' || c == ']') {
      if (st.depth == 0 || st.stack[st.depth - 1] != (c == '}' ? '{' : '[')) {
        return done(JsonScan::kInvalid, i);
      }
      if (--st.depth == 0) return done(JsonScan::kEnd, i + 1);
    } else if (st.depth == 0 || !can_appear_outside_strings(c)) {
      // s[pos] was not a bracket, or this cannot be JSON: stop at once rather than wait
      // for brackets to balance (a '<' of a close tag after a missing '}', say).
      return done(JsonScan::kInvalid, i);
    }
  }
  st.json_pos = s.size();
  return {JsonScan::kNeedMore, s.size()};
}

namespace {

// Parses text that scan_json_container accepted; discarded value on any error.
ordered_json parse_bounded(std::string_view text) {
  size_t start = skip_space(text, 0);
  if (start == text.size() || (text[start] != '{' && text[start] != '[')) {
    return ordered_json(ordered_json::value_t::discarded);
  }
  JsonScan scan = scan_json_container(text, start);
  if (scan.status != JsonScan::kEnd || skip_space(text, scan.end) != text.size()) {
    return ordered_json(ordered_json::value_t::discarded);
  }
  return ordered_json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

std::string dump_compact(const ordered_json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, ordered_json::error_handler_t::replace);
}

std::optional<RawCall> call_from_value(const ordered_json& j,
                                       const std::vector<std::string_view>& args_keys,
                                       bool args_required) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    return std::nullopt;
  }
  RawCall call{name->get<std::string>(), "{}"};
  bool found = false;
  for (std::string_view key : args_keys) {
    auto args = j.find(std::string(key));
    if (args == j.end()) continue;
    if (args->is_object()) {
      call.arguments_json = dump_compact(*args);
    } else if (args->is_string()) {  // some models quote the arguments object
      auto inner = compact_object(args->get_ref<const std::string&>());
      if (!inner) return std::nullopt;
      call.arguments_json = std::move(*inner);
    } else {
      return std::nullopt;
    }
    found = true;
    break;
  }
  if (!found && args_required) return std::nullopt;
  return call;
}

}  // namespace

std::optional<std::string> compact_object(std::string_view text) {
  ordered_json j = parse_bounded(text);
  if (!j.is_object()) return std::nullopt;
  return dump_compact(j);
}

std::optional<RawCall> call_from_json(std::string_view object_text,
                                      const std::vector<std::string_view>& args_keys,
                                      bool args_required) {
  return call_from_value(parse_bounded(object_text), args_keys, args_required);
}

std::optional<std::vector<RawCall>> calls_from_json_array(std::string_view array_text) {
  ordered_json j = parse_bounded(array_text);
  if (!j.is_array() || j.empty()) return std::nullopt;
  std::vector<RawCall> calls;
  for (const auto& item : j) {
    auto call = call_from_value(item, {"arguments", "parameters"}, /*args_required=*/false);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
  }
  return calls;
}

}  // namespace kiln::chat::detail
