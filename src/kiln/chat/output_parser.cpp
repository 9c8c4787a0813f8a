// The output parser's state machine. Each step looks at the undecided buffer and either
// decides a prefix of it (emitting events and consuming it) or reports that it needs more
// text. A step decides only what no continuation of the text could change; with eof it
// always decides. That is what makes the events independent of the chunking.
#include "kiln/chat/output_parser.h"

#include <algorithm>
#include <utility>

#include "kiln/chat/parsers/tool_formats.h"
#include "kiln/util/status.h"

namespace kiln::chat {

using detail::BlockResult;
using detail::BlockStatus;
using detail::Match;
using detail::match_at;

namespace {

// Length of the longest proper prefix of lit that ends s (a tag that may be starting).
size_t partial_suffix(std::string_view s, std::string_view lit) {
  for (size_t n = std::min(s.size(), lit.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == lit.substr(0, n)) return n;
  }
  return 0;
}

// Largest n <= s.size() such that s[0, n) does not end inside a UTF-8 sequence that s
// cannot complete. Invalid bytes are passed through (they are not ours to judge).
size_t utf8_safe_prefix(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (c >= 0xF8) len = 1;  // invalid lead byte
    return len > back ? n - back : n;
  }
  return n;
}

size_t rtrim_length(std::string_view s) {
  size_t n = s.size();
  while (n > 0 && detail::is_json_space(s[n - 1])) --n;
  return n;
}

// Trailing whitespace of content and reasoning is held back (it is dropped when a call or
// the close tag follows), but at most this much: a model stuck emitting newlines must not
// make every feed rescan them. Whitespace beyond it is text. Returns where the held
// whitespace starts.
constexpr size_t kMaxHeldSpaceBytes = 64;
size_t held_space_start(std::string_view s) {
  return std::max(rtrim_length(s),
                  s.size() > kMaxHeldSpaceBytes ? s.size() - kMaxHeldSpaceBytes : 0);
}

// splitmix64: a fixed, well-mixed function of (seed, index), for stable ids in tests.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::string_view tool_format_name(ToolFormat format) {
  switch (format) {
    case ToolFormat::kNone:
      return "none";
    case ToolFormat::kHermes:
      return "hermes";
    case ToolFormat::kLlama3:
      return "llama3";
    case ToolFormat::kMistral:
      return "mistral";
    case ToolFormat::kDeepSeek:
      return "deepseek";
  }
  return "unknown";
}

std::optional<ToolFormat> tool_format_from_name(std::string_view name) {
  for (ToolFormat f : {ToolFormat::kNone, ToolFormat::kHermes, ToolFormat::kLlama3,
                       ToolFormat::kMistral, ToolFormat::kDeepSeek}) {
    if (tool_format_name(f) == name) return f;
  }
  return std::nullopt;
}

std::string make_tool_call_id(ToolFormat format, uint64_t seed, int index) {
  static constexpr char kAlphabet[] =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  uint64_t x = mix(mix(seed) ^ static_cast<uint64_t>(index));
  std::string id = format == ToolFormat::kMistral ? "" : "call_";
  for (int i = 0; i < 9; ++i) {
    id.push_back(kAlphabet[x % 62]);
    x /= 62;
  }
  return id;
}

std::string_view detail::tool_marker(ToolFormat format) {
  switch (format) {
    case ToolFormat::kHermes:
      return kHermesOpen;
    case ToolFormat::kLlama3:
      return kLlamaPythonTag;
    case ToolFormat::kMistral:
      return kMistralCalls;
    case ToolFormat::kDeepSeek:
      return kDsCallsBegin;
    case ToolFormat::kNone:
      break;
  }
  return {};
}

void accumulate(ParsedMessage& message, const std::vector<Event>& events) {
  for (const Event& e : events) {
    switch (e.kind) {
      case Event::Kind::kContent:
        message.content += e.text;
        break;
      case Event::Kind::kReasoning:
        message.reasoning += e.text;
        break;
      case Event::Kind::kToolCallBegin:
        message.tool_calls.push_back({e.tool_id, e.tool_name, ""});
        break;
      case Event::Kind::kToolCallArgs:
        if (!message.tool_calls.empty()) message.tool_calls.back().arguments_json += e.text;
        break;
      case Event::Kind::kToolCallEnd:
        break;
    }
  }
}

OutputParser::OutputParser(ParserConfig config) : config_(std::move(config)) {
  if (config_.think_open.empty() || config_.think_close.empty()) config_.reasoning = false;
  if (!config_.reasoning) config_.reasoning_open_at_start = false;
  state_ = config_.reasoning_open_at_start ? State::kReasoningStart : State::kStart;
}

std::vector<Event> OutputParser::feed(std::string_view text) {
  if (finished_) return {};
  text_.append(text);
  run(/*eof=*/false);
  return std::exchange(out_, {});
}

std::vector<Event> OutputParser::finish() {
  if (finished_) return {};
  run(/*eof=*/true);
  finished_ = true;
  return std::exchange(out_, {});
}

void OutputParser::run(bool eof) {
  while (!buf().empty() && step(eof)) {
  }
}

void OutputParser::consume(size_t num_bytes) {
  start_ += num_bytes;
  KILN_ASSERT(start_ <= text_.size());
  if (start_ == text_.size()) {
    text_.clear();
    start_ = 0;
  } else if (start_ >= 4096 && start_ * 2 >= text_.size()) {
    text_.erase(0, start_);
    start_ = 0;
  }
}

void OutputParser::emit_text(Event::Kind kind, std::string_view text) {
  if (text.empty()) return;
  if (!out_.empty() && out_.back().kind == kind) {
    out_.back().text.append(text);  // one delta per kind per feed() is enough
  } else {
    out_.push_back(Event{kind, std::string(text)});
  }
}

void OutputParser::emit_call(const std::string& name, const std::string& arguments_json) {
  const int index = num_calls_++;
  Event begin{Event::Kind::kToolCallBegin};
  begin.tool_index = index;
  begin.tool_id = make_tool_call_id(config_.format, config_.id_seed, index);
  begin.tool_name = name;
  out_.push_back(std::move(begin));
  Event args{Event::Kind::kToolCallArgs, arguments_json};
  args.tool_index = index;
  out_.push_back(std::move(args));
  Event end{Event::Kind::kToolCallEnd};
  end.tool_index = index;
  out_.push_back(std::move(end));
}

bool OutputParser::step(bool eof) {
  switch (state_) {
    case State::kStart:
      return step_start(eof);
    case State::kReasoningStart:
      return step_reasoning_start(eof);
    case State::kReasoning:
      return step_reasoning(eof);
    case State::kContentStart:
      return step_content_start();
    case State::kContent:
      return step_content(eof);
    case State::kToolBlock:
    case State::kLlamaStart:
    case State::kDeepSeekInside:
      return step_tool(eof);
  }
  return false;
}

// Leading whitespace of the output is dropped whatever follows, so it goes at once.
bool OutputParser::step_start(bool eof) {
  consume(detail::skip_space(buf(), 0));
  if (buf().empty()) return false;
  if (config_.reasoning) {
    switch (match_at(buf(), 0, config_.think_open)) {
      case Match::kFull:
        consume(config_.think_open.size());
        state_ = State::kReasoningStart;
        return true;
      case Match::kPartial:
        if (!eof) return false;
        break;
      case Match::kNo:
        break;
    }
  }
  state_ = State::kContentStart;
  return true;
}

// Reasoning's leading whitespace is dropped; when the prompt opened the block, a repeated
// open tag here is dropped too.
bool OutputParser::step_reasoning_start(bool eof) {
  consume(detail::skip_space(buf(), 0));
  if (buf().empty()) return false;
  if (config_.reasoning_open_at_start && !open_tag_checked_) {
    switch (match_at(buf(), 0, config_.think_open)) {
      case Match::kFull:
        consume(config_.think_open.size());
        open_tag_checked_ = true;
        return true;  // stay: whitespace after the tag is still leading whitespace
      case Match::kPartial:
        if (!eof) return false;
        break;
      case Match::kNo:
        break;
    }
  }
  state_ = State::kReasoning;
  return true;
}

// Reasoning runs to think_close; its trailing whitespace is dropped, so whitespace is held
// until something follows it.
bool OutputParser::step_reasoning(bool eof) {
  const size_t close = buf().find(config_.think_close);
  if (close != std::string::npos) {
    emit_text(Event::Kind::kReasoning, buf().substr(0, held_space_start(buf().substr(0, close))));
    consume(close + config_.think_close.size());
    state_ = State::kContentStart;
    return true;
  }
  std::string_view view = buf();
  if (eof) {
    emit_text(Event::Kind::kReasoning, view.substr(0, held_space_start(view)));
    consume(buf().size());
    return false;
  }
  view.remove_suffix(partial_suffix(view, config_.think_close));
  view = view.substr(0, held_space_start(view));
  view = view.substr(0, utf8_safe_prefix(view));
  emit_text(Event::Kind::kReasoning, view);
  consume(view.size());
  return false;
}

// After reasoning or a call: whitespace is dropped; for Llama 3 a '{' may start a call.
bool OutputParser::step_content_start() {
  size_t pos = 0;
  while (pos < buf().size() &&
         (detail::is_json_space(buf()[pos]) ||
          (after_call_ && buf()[pos] == ';' && config_.format == ToolFormat::kLlama3))) {
    ++pos;
  }
  consume(pos);
  if (buf().empty()) return false;
  if (config_.format == ToolFormat::kLlama3 && buf()[0] == '{') {
    state_ = State::kLlamaStart;
  } else {
    state_ = State::kContent;
  }
  return true;
}

// Content up to the family's tool-call marker. Held back: a suffix that may be the start
// of the marker, trailing whitespace (dropped if a call follows), an incomplete UTF-8
// sequence.
bool OutputParser::step_content(bool eof) {
  const std::string_view marker = detail::tool_marker(config_.format);
  std::string_view view = buf();
  const size_t found = marker.empty() ? std::string::npos : buf().find(marker);
  if (found != std::string::npos) {
    // Whitespace before the marker stays in the buffer: the block takes it (dropped if
    // the block is a call, content if it is not).
    const size_t n = held_space_start(view.substr(0, found));
    emit_text(Event::Kind::kContent, view.substr(0, n));
    consume(n);
    state_ = State::kToolBlock;
    return true;
  }
  if (eof) {
    emit_text(Event::Kind::kContent, view);
    consume(buf().size());
    return false;
  }
  if (!marker.empty()) view.remove_suffix(partial_suffix(view, marker));
  view = view.substr(0, held_space_start(view));
  view = view.substr(0, utf8_safe_prefix(view));
  emit_text(Event::Kind::kContent, view);
  consume(view.size());
  return false;
}

bool OutputParser::step_tool(bool eof) {
  BlockResult r;
  if (state_ == State::kDeepSeekInside && detail::skip_space(buf(), 0) > 0) {
    // Whitespace between calls is a separator whatever follows: drop it now, so a long run
    // is not rescanned. (Nothing is cached yet: the buffer starts a fresh attempt.)
    consume(detail::skip_space(buf(), 0));
    scan_cache_ = {};
    return !buf().empty();
  }
  if (state_ == State::kDeepSeekInside) {
    r = detail::parse_deepseek_inside(buf(), eof, scan_cache_);
  } else if (state_ == State::kLlamaStart) {
    r = detail::parse_llama_block(buf(), eof, scan_cache_);
  } else {
    switch (config_.format) {
      case ToolFormat::kHermes:
        r = detail::parse_hermes_block(buf(), eof, scan_cache_);
        break;
      case ToolFormat::kLlama3:
        r = detail::parse_llama_block(buf(), eof, scan_cache_);
        break;
      case ToolFormat::kMistral:
        r = detail::parse_mistral_block(buf(), eof, scan_cache_);
        break;
      case ToolFormat::kDeepSeek:
        r = detail::parse_deepseek_block(buf(), eof, scan_cache_);
        break;
      case ToolFormat::kNone:
        r = {BlockStatus::kNotACall};
        break;
    }
  }
  if (r.status != BlockStatus::kNeedMore) scan_cache_ = {};  // the buffer changes now
  switch (r.status) {
    case BlockStatus::kNeedMore:
      return false;
    case BlockStatus::kCalls:
      for (const auto& call : r.calls) emit_call(call.name, call.arguments_json);
      consume(r.num_consumed_bytes);
      after_call_ = true;
      state_ = r.stay_in_block ? State::kDeepSeekInside : State::kContentStart;
      return true;
    case BlockStatus::kText:
      emit_text(Event::Kind::kContent, buf().substr(0, r.num_consumed_bytes));
      consume(r.num_consumed_bytes);
      after_call_ = false;
      state_ = State::kContent;
      return true;
    case BlockStatus::kNotACall:
      after_call_ = false;
      state_ = State::kContent;
      return true;
    case BlockStatus::kExit:
      consume(r.num_consumed_bytes);
      state_ = State::kContentStart;
      return true;
  }
  return false;
}

namespace {

// Whether `tail` (template text) holds a string literal that ends with `tag`, optionally
// followed by escaped newlines: '...<think>' or '...<think>\n'.
bool literal_ends_with(std::string_view tail, std::string_view tag) {
  for (size_t at = tail.find(tag); at != std::string_view::npos; at = tail.find(tag, at + 1)) {
    size_t pos = at + tag.size();
    while (tail.substr(pos, 2) == "\\n") pos += 2;
    if (pos < tail.size() && (tail[pos] == '\'' || tail[pos] == '"')) return true;
  }
  return false;
}

}  // namespace

ParserConfig config_for_template(std::string_view tmpl) {
  auto has = [&](std::string_view s) { return tmpl.find(s) != std::string_view::npos; };
  ParserConfig config;
  if (has(detail::kDsCallsBegin)) {
    config.format = ToolFormat::kDeepSeek;
  } else if (has(detail::kMistralCalls)) {
    config.format = ToolFormat::kMistral;
  } else if (has(detail::kHermesOpen)) {
    config.format = ToolFormat::kHermes;
  } else if (has(detail::kLlamaPythonTag) ||
             (has("<|start_header_id|>") && has("\"parameters\""))) {
    config.format = ToolFormat::kLlama3;
  }
  if (has("[THINK]") && has("[/THINK]")) {
    config.think_open = "[THINK]";
    config.think_close = "[/THINK]";
  }
  config.reasoning = has(config.think_open) && has(config.think_close);
  if (config.reasoning) {
    // Only the part after the last mention of add_generation_prompt writes the prompt's end.
    const size_t gen = tmpl.rfind("add_generation_prompt");
    if (gen != std::string_view::npos) {
      config.reasoning_open_at_start = literal_ends_with(tmpl.substr(gen), config.think_open);
    }
  }
  return config;
}

void adjust_for_prompt(ParserConfig& config, std::string_view prompt) {
  if (config.think_open.empty() || config.think_close.empty()) return;
  prompt = prompt.substr(0, rtrim_length(prompt));
  auto ends_with = [&](std::string_view tag) {
    return prompt.size() >= tag.size() && prompt.substr(prompt.size() - tag.size()) == tag;
  };
  if (ends_with(config.think_close)) {
    config.reasoning_open_at_start = false;
  } else if (ends_with(config.think_open)) {
    config.reasoning = true;
    config.reasoning_open_at_start = true;
  }
}

ParsedMessage parse_all(const ParserConfig& config, std::string_view text) {
  OutputParser parser(config);
  ParsedMessage message;
  accumulate(message, parser.feed(text));
  accumulate(message, parser.finish());
  return message;
}

}  // namespace kiln::chat
