#include "kiln/server/anthropic_convert.h"

#include <fmt/format.h>

namespace kiln::server::anthropic {

namespace {

bool is_string_field(const Json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string();
}

std::string str(const Json& j, const char* key) {
  return is_string_field(j, key) ? j[key].get<std::string>() : std::string();
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

void append_paragraph(std::string& out, std::string_view text) {
  if (text.empty()) return;
  if (!out.empty()) out += "\n\n";
  out += text;
}

constexpr std::string_view kImagePlaceholder = "[image omitted: this model reads text only]";

// A document block's text: a text source, a content source of blocks, else a placeholder.
std::string document_text(const Json& block) {
  std::string out;
  const std::string title = str(block, "title");
  if (!title.empty()) out = "Document: " + title;
  const Json& source = block.contains("source") ? block["source"] : Json(nullptr);
  const std::string type = str(source, "type");
  if (type == "text") {
    append_paragraph(out, str(source, "data"));
  } else if (type == "content" && source.contains("content")) {
    append_paragraph(out, tool_result_text(source["content"]));
  } else {
    append_paragraph(out, fmt::format("[document omitted: a {} source this model cannot read]",
                                      type.empty() ? "non-text" : type));
  }
  append_paragraph(out, str(block, "context"));
  return out;
}

std::string search_result_text(const Json& block) {
  std::string out = str(block, "title");
  const std::string source = str(block, "source");
  if (!source.empty()) out += out.empty() ? source : " (" + source + ")";
  if (block.contains("content")) append_paragraph(out, tool_result_text(block["content"]));
  return out;
}

// Text of a block that renders as text wherever it appears; nullopt for other kinds.
std::optional<std::string> renderable_text(const Json& block, const std::string& type) {
  if (type == "text") return str(block, "text");
  if (type == "document") return document_text(block);
  if (type == "search_result") return search_result_text(block);
  if (type == "tool_reference") return "Tool available: " + str(block, "tool_name");
  return std::nullopt;
}

Json object_schema(Json properties, Json required) {
  return Json{
      {"type", "object"}, {"properties", std::move(properties)}, {"required", std::move(required)}};
}

Json string_prop(const char* description) {
  return Json{{"type", "string"}, {"description", description}};
}

struct ServerTool {
  std::string_view prefix;
  const char* description;
  Json (*schema)();
};

// The input schemas of Anthropic's server and client tools, as their documentation
// describes the calls (https://docs.anthropic.com/en/docs/agents-and-tools/tool-use).
const ServerTool kServerTools[] = {
    {"bash_", "Run a command in a persistent bash shell.",
     [] {
       return object_schema(
           Json{{"command", string_prop("The bash command to run")},
                {"restart", Json{{"type", "boolean"}, {"description", "Restart the shell"}}}},
           Json::array());
     }},
    {"text_editor_", "View, create and edit text files.",
     [] {
       return object_schema(
           Json{{"command",
                 Json{{"type", "string"},
                      {"enum", {"view", "create", "str_replace", "insert", "undo_edit"}}}},
                {"path", string_prop("Absolute path of the file or directory")},
                {"file_text", string_prop("Content of the file to create")},
                {"old_str", string_prop("Text to replace (must match exactly)")},
                {"new_str", string_prop("Replacement text")},
                {"insert_line", Json{{"type", "integer"}}},
                {"insert_text", string_prop("Text to insert")},
                {"view_range", Json{{"type", "array"}, {"items", {{"type", "integer"}}}}}},
           Json::array({"command", "path"}));
     }},
    {"web_search_", "Search the web.",
     [] {
       return object_schema(Json{{"query", string_prop("The search query")}},
                            Json::array({"query"}));
     }},
    {"web_fetch_", "Fetch the content of a web page.",
     [] {
       return object_schema(Json{{"url", string_prop("The URL to fetch")}}, Json::array({"url"}));
     }},
    {"code_execution_", "Execute code in a sandbox.",
     [] {
       return object_schema(Json{{"code", string_prop("The code to run")}}, Json::array({"code"}));
     }},
    {"computer_", "Control the computer's screen, keyboard and mouse.",
     [] {
       return object_schema(
           Json{{"action", string_prop("screenshot, left_click, type, key, mouse_move, scroll...")},
                {"coordinate", Json{{"type", "array"}, {"items", {{"type", "integer"}}}}},
                {"text", string_prop("Text to type or key to press")}},
           Json::array({"action"}));
     }},
    {"memory_", "Read and write files in the memory directory.",
     [] {
       return object_schema(
           Json{{"command",
                 Json{{"type", "string"},
                      {"enum", {"view", "create", "str_replace", "insert", "delete", "rename"}}}},
                {"path", string_prop("Path inside /memories")},
                {"file_text", string_prop("Content of the file to create")},
                {"old_str", string_prop("Text to replace")},
                {"new_str", string_prop("Replacement text")},
                {"insert_line", Json{{"type", "integer"}}},
                {"insert_text", string_prop("Text to insert")},
                {"old_path", string_prop("Path to rename")},
                {"new_path", string_prop("New path")}},
           Json::array({"command"}));
     }},
};

std::optional<ApiError> read_system(const Json& body, const ConvertOptions& opts, ChatTurn* turn) {
  auto it = body.find("system");
  if (it == body.end() || it->is_null()) return std::nullopt;
  std::string text;
  if (it->is_string()) {
    text = it->get<std::string>();
  } else if (it->is_array()) {
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& b = (*it)[i];
      if (!is_string_field(b, "type") || b["type"] != "text" || !is_string_field(b, "text"))
        return invalid_request(
            fmt::format("system[{}] must be a text block {{\"type\":\"text\",\"text\":..}}", i),
            fmt::format("system[{}]", i));
      std::string block = b["text"].get<std::string>();
      if (opts.normalize_volatile_system) block = normalize_system_prompt(block);
      append_paragraph(text, block);
    }
  } else {
    return invalid_request("'system' must be a string or an array of text blocks", "system");
  }
  if (opts.normalize_volatile_system) text = normalize_system_prompt(text);
  if (!text.empty()) turn->messages.push_back(Json{{"role", "system"}, {"content", text}});
  return std::nullopt;
}

std::optional<ApiError> read_message(const Json& m, size_t i, ChatTurn* turn) {
  const std::string where = fmt::format("messages[{}]", i);
  if (!m.is_object()) return invalid_request(where + " must be an object", where);
  const std::string role = str(m, "role");
  if (role != "user" && role != "assistant")
    return invalid_request(where + ".role must be 'user' or 'assistant'", where + ".role");
  const Json content = m.contains("content") ? m["content"] : Json(nullptr);
  if (content.is_string()) {
    turn->messages.push_back(Json{{"role", role}, {"content", content.get<std::string>()}});
    return std::nullopt;
  }
  if (!content.is_array())
    return invalid_request(where + ".content must be a string or an array of content blocks",
                           where + ".content");
  std::string text;
  std::string reasoning;
  Json tool_calls = Json::array();
  for (size_t k = 0; k < content.size(); ++k) {
    const Json& b = content[k];
    const std::string bw = fmt::format("{}.content[{}]", where, k);
    if (!is_string_field(b, "type"))
      return invalid_request(bw + " must be an object with a 'type'", bw);
    const std::string type = b["type"].get<std::string>();
    if (auto t = renderable_text(b, type)) {
      append_paragraph(text, *t);
    } else if (type == "image") {
      return not_supported(bw + ": image content blocks are not supported (this server serves "
                                "a text-only model)",
                           bw);
    } else if (type == "thinking") {
      if (role == "assistant") append_paragraph(reasoning, str(b, "thinking"));
    } else if (type == "redacted_thinking") {
      // Encrypted reasoning of another model: nothing the template can show.
    } else if (type == "tool_use" || type == "server_tool_use") {
      if (role != "assistant")
        return invalid_request(bw + ": tool_use blocks belong to assistant messages", bw);
      if (!is_string_field(b, "id") || !is_string_field(b, "name"))
        return invalid_request(bw + " must have an 'id' and a 'name'", bw);
      Json input = b.contains("input") && b["input"].is_object() ? b["input"] : Json::object();
      tool_calls.push_back(Json{{"id", b["id"]},
                                {"type", "function"},
                                {"function", {{"name", b["name"]}, {"arguments", input}}}});
    } else if (type == "tool_result") {
      if (!is_string_field(b, "tool_use_id"))
        return invalid_request(bw + ".tool_use_id must be a string", bw + ".tool_use_id");
      // Results come before the user's text in a turn: flush the text gathered so far.
      if (!text.empty()) {
        turn->messages.push_back(Json{{"role", role}, {"content", text}});
        text.clear();
      }
      std::string result = b.contains("content") ? tool_result_text(b["content"]) : "";
      if (b.contains("is_error") && b["is_error"] == true) result = "Error: " + result;
      turn->messages.push_back(
          Json{{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
    } else if (b.contains("text") && b["text"].is_string()) {
      append_paragraph(text, b["text"].get<std::string>());  // a newer kind that carries text
    } else if (type.size() > 12 && type.substr(type.size() - 12) == "_tool_result") {
      // Results of server tools kiln does not run (web_search_tool_result, ...): as text.
      append_paragraph(text, b.contains("content") ? tool_result_text(b["content"]) : "");
    } else {
      return invalid_request(fmt::format("{}: unknown content block type '{}'", bw, type), bw);
    }
  }
  if (role == "assistant") {
    Json out{{"role", "assistant"}, {"content", text}};
    if (!reasoning.empty()) out["reasoning_content"] = reasoning;
    if (!tool_calls.empty()) out["tool_calls"] = std::move(tool_calls);
    turn->messages.push_back(std::move(out));
  } else if (!text.empty() || turn->messages.empty() || turn->messages.back()["role"] != "tool") {
    turn->messages.push_back(Json{{"role", "user"}, {"content", text}});
  }
  return std::nullopt;
}

std::variant<Json, ApiError> read_tool(const Json& t, size_t i) {
  const std::string where = fmt::format("tools[{}]", i);
  if (!is_string_field(t, "name"))
    return invalid_request(where + ".name must be a string", where + ".name");
  if (auto f = server_tool_function(t)) return *f;
  const std::string type = str(t, "type");
  Json schema = t.contains("input_schema") ? t["input_schema"] : Json(nullptr);
  if (!schema.is_null() && !schema.is_object())
    return invalid_request(where + ".input_schema must be an object", where + ".input_schema");
  if (schema.is_null()) schema = Json{{"type", "object"}, {"properties", Json::object()}};
  Json fn{{"name", t["name"]}};
  std::string description = str(t, "description");
  if (description.empty() && !type.empty() && type != "custom") description = "(" + type + ")";
  if (!description.empty()) fn["description"] = description;
  fn["parameters"] = std::move(schema);
  return Json{{"type", "function"}, {"function", std::move(fn)}};
}

std::optional<ApiError> read_tools(const Json& body, MessagesRequest* out) {
  Json tools = Json::array();
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return invalid_request("'tools' must be an array", "tools");
    for (size_t i = 0; i < it->size(); ++i) {
      auto t = read_tool((*it)[i], i);
      if (auto* e = std::get_if<ApiError>(&t)) return *e;
      tools.push_back(std::get<Json>(std::move(t)));
    }
  }
  std::string choice = "auto";
  auto tc = body.find("tool_choice");
  if (tc != body.end() && !tc->is_null()) {
    if (!is_string_field(*tc, "type"))
      return invalid_request("'tool_choice' must be an object with a 'type'", "tool_choice");
    choice = (*tc)["type"].get<std::string>();
    if (choice != "auto" && choice != "any" && choice != "tool" && choice != "none")
      return invalid_request("'tool_choice.type' must be auto, any, tool or none",
                             "tool_choice.type");
    if (tc->contains("disable_parallel_tool_use") && (*tc)["disable_parallel_tool_use"] == true)
      out->disable_parallel_tool_use = true;
    if ((choice == "any" || choice == "tool") && tools.empty())
      return invalid_request(fmt::format("'tool_choice' {} needs 'tools'", choice), "tool_choice");
    if (choice == "tool") {
      if (!is_string_field(*tc, "name"))
        return invalid_request("'tool_choice' of type tool must have a 'name'", "tool_choice.name");
      const Json name = (*tc)["name"];
      Json named = Json::array();
      for (const Json& t : tools)
        if (t["function"]["name"] == name) named.push_back(t);
      if (named.empty())
        // Anthropic's envelope has no param: the message names the field.
        return invalid_request(fmt::format("tool_choice.name: '{}' is not one of the 'tools'",
                                           name.get<std::string>()),
                               "tool_choice.name");
      tools = std::move(named);  // only the named tool is offered to the model
    }
  }
  if (choice != "none" && !tools.empty()) {
    out->turn.tools = std::move(tools);
    out->turn.parse_tools = true;
    // any and tool force a call through a grammar (server/constraint.h), as OpenAI's
    // required and named do.
    out->turn.force_tool_call = choice == "any" || choice == "tool";
  }
  return std::nullopt;
}

std::optional<ApiError> read_thinking(const Json& body, MessagesRequest* out) {
  auto it = body.find("thinking");
  if (it != body.end() && !it->is_null()) {
    if (!is_string_field(*it, "type"))
      return invalid_request("'thinking' must be an object with a 'type'", "thinking");
    const std::string type = (*it)["type"].get<std::string>();
    if (type == "enabled" || type == "adaptive") {
      out->thinking = true;
    } else if (type != "disabled") {
      return invalid_request("'thinking.type' must be enabled, adaptive or disabled",
                             "thinking.type");
    }
    if (auto b = it->find("budget_tokens"); b != it->end() && !b->is_null()) {
      if (!b->is_number_integer() || b->get<int64_t>() < 1 || b->get<int64_t>() > INT32_MAX)
        return invalid_request("'thinking.budget_tokens' must be a positive integer",
                               "thinking.budget_tokens");
      out->thinking_budget = b->get<int32_t>();
    }
  }
  // Templates with a thinking switch (Qwen3's enable_thinking) follow the request; without
  // a thinking field Anthropic's API does not think.
  out->turn.chat_template_kwargs["enable_thinking"] = out->thinking;
  return std::nullopt;
}

std::optional<ApiError> read_stop_sequences(const Json& body, MessagesRequest* out) {
  auto it = body.find("stop_sequences");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_array())
    return invalid_request("'stop_sequences' must be an array of strings", "stop_sequences");
  for (const Json& s : *it) {
    if (!s.is_string() || s.get<std::string>().empty())
      return invalid_request("'stop_sequences' must hold non-empty strings", "stop_sequences");
    out->stop_sequences.push_back(s.get<std::string>());
  }
  return std::nullopt;
}

}  // namespace

std::string normalize_system_prompt(std::string_view system) {
  static constexpr std::string_view kVolatile[] = {"x-anthropic-billing-header:"};
  std::string out;
  out.reserve(system.size());
  size_t pos = 0;
  bool dropped = false;
  while (pos < system.size()) {
    size_t end = system.find('\n', pos);
    const size_t next = end == std::string_view::npos ? system.size() : end + 1;
    const std::string_view line = system.substr(pos, next - pos);
    bool drop = false;
    for (std::string_view v : kVolatile) drop = drop || starts_with(line, v);
    if (!drop) out += line;
    dropped = dropped || drop;
    pos = next;
  }
  if (dropped)  // the lines removed were at the top: no blank lines left in their place
    while (!out.empty() && (out.front() == '\n' || out.front() == '\r')) out.erase(0, 1);
  return out;
}

std::optional<Json> server_tool_function(const Json& tool) {
  if (!tool.is_object() || tool.contains("input_schema") || !is_string_field(tool, "type") ||
      !is_string_field(tool, "name"))
    return std::nullopt;
  const std::string type = tool["type"].get<std::string>();
  for (const ServerTool& s : kServerTools) {
    if (!starts_with(type, s.prefix)) continue;
    Json fn{{"name", tool["name"]}, {"description", s.description}, {"parameters", s.schema()}};
    return Json{{"type", "function"}, {"function", std::move(fn)}};
  }
  return std::nullopt;
}

std::string tool_result_text(const Json& content) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return content.is_null() ? "" : content.dump();
  std::string out;
  for (const Json& b : content) {
    if (b.is_string()) {
      append_paragraph(out, b.get<std::string>());
      continue;
    }
    const std::string type = str(b, "type");
    if (auto t = renderable_text(b, type)) {
      append_paragraph(out, *t);
    } else if (type == "image" || (b.is_object() && b.contains("mimeType"))) {
      append_paragraph(out, kImagePlaceholder);  // also MCP's {data, mimeType}
    } else if (b.is_object() && b.contains("text") && b["text"].is_string()) {
      append_paragraph(out, b["text"].get<std::string>());
    } else if (b.is_object() && b.contains("content")) {
      append_paragraph(out, tool_result_text(b["content"]));
    } else if (!type.empty()) {
      append_paragraph(out, "[" + type + " omitted]");
    }
  }
  return out;
}

std::variant<MessagesRequest, ApiError> parse_request(const Json& body,
                                                      const ConvertOptions& opts) {
  MessagesRequest out;
  if (auto e = read_system(body, opts, &out.turn)) return *e;
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty())
    return invalid_request("'messages' must be a non-empty array", "messages");
  for (size_t i = 0; i < it->size(); ++i)
    if (auto e = read_message((*it)[i], i, &out.turn)) return *e;
  if (auto e = read_tools(body, &out)) return *e;
  if (auto e = read_thinking(body, &out)) return *e;
  // Thinking with a forced tool_choice (which Anthropic's API refuses) works here: the grammar
  // of the call applies from the end of the thinking block (server/constraint.h
  // exempt_reasoning).
  if (auto e = read_stop_sequences(body, &out)) return *e;
  if (auto m = body.find("metadata"); m != body.end() && !m->is_null() && !m->is_object())
    return invalid_request("'metadata' must be an object", "metadata");
  return out;
}

// ---------------------------------------------------------------------------------------
// Output blocks

void BlockBuilder::open(Open kind, Json block, std::vector<Op>& ops) {
  close(ops);
  open_ = kind;
  content_.push_back(block);
  ops.push_back(Op{Op::Kind::kStart, static_cast<int>(content_.size()) - 1, std::move(block)});
}

void BlockBuilder::delta(Json d, std::vector<Op>& ops) {
  Json& block = content_.back();
  const std::string type = d["type"].get<std::string>();
  if (type == "text_delta") {
    block["text"] = block["text"].get<std::string>() + d["text"].get<std::string>();
  } else if (type == "thinking_delta") {
    thinking_ += d["thinking"].get<std::string>();
    block["thinking"] = thinking_;
  } else if (type == "signature_delta") {
    block["signature"] = d["signature"];
  } else if (type == "input_json_delta") {
    tool_args_ += d["partial_json"].get<std::string>();
  }
  ops.push_back(Op{Op::Kind::kDelta, static_cast<int>(content_.size()) - 1, std::move(d)});
}

void BlockBuilder::close(std::vector<Op>& ops) {
  if (open_ == Open::kNone) return;
  if (open_ == Open::kThinking)
    delta(Json{{"type", "signature_delta"}, {"signature", thinking_signature(thinking_)}}, ops);
  if (open_ == Open::kToolUse) {
    Json input = Json::parse(tool_args_, nullptr, false);
    content_.back()["input"] = input.is_object() ? input : Json::object();
  }
  ops.push_back(Op{Op::Kind::kStop, static_cast<int>(content_.size()) - 1, Json()});
  open_ = Open::kNone;
  thinking_.clear();
  tool_args_.clear();
}

std::vector<BlockBuilder::Op> BlockBuilder::feed(const std::vector<chat::Event>& events) {
  std::vector<Op> ops;
  for (const chat::Event& e : events) {
    switch (e.kind) {
      case chat::Event::Kind::kReasoning:
        if (e.text.empty()) break;
        if (open_ != Open::kThinking)
          open(Open::kThinking, Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}},
               ops);
        delta(Json{{"type", "thinking_delta"}, {"thinking", e.text}}, ops);
        break;
      case chat::Event::Kind::kContent:
        if (e.text.empty()) break;
        if (open_ != Open::kText) open(Open::kText, Json{{"type", "text"}, {"text", ""}}, ops);
        delta(Json{{"type", "text_delta"}, {"text", e.text}}, ops);
        break;
      case chat::Event::Kind::kToolCallBegin:
        if (single_tool_ && num_tools_ > 0) {
          skipping_tool_ = true;
          break;
        }
        ++num_tools_;
        open(Open::kToolUse,
             Json{{"type", "tool_use"},
                  {"id", e.tool_id},
                  {"name", e.tool_name},
                  {"input", Json::object()}},
             ops);
        break;
      case chat::Event::Kind::kToolCallArgs:
        if (skipping_tool_ || open_ != Open::kToolUse) break;
        delta(Json{{"type", "input_json_delta"}, {"partial_json", e.text}}, ops);
        break;
      case chat::Event::Kind::kToolCallEnd:
        if (skipping_tool_) {
          skipping_tool_ = false;
          break;
        }
        close(ops);
        break;
    }
  }
  return ops;
}

std::vector<BlockBuilder::Op> BlockBuilder::finish() {
  std::vector<Op> ops;
  close(ops);
  return ops;
}

std::string thinking_signature(std::string_view thinking) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : thinking) h = (h ^ c) * 1099511628211ull;
  return fmt::format("kiln-{:016x}", h);
}

const char* stop_reason(const engine::FinishEvent& finish, bool saw_tool_use) {
  if (finish.reason == engine::FinishReason::kLength) return "max_tokens";
  if (finish.stop_index >= 0) return "stop_sequence";
  if (saw_tool_use) return "tool_use";
  return "end_turn";
}

Json usage(int32_t num_prompt, int32_t num_cached, int32_t num_output) {
  Json u = Json::object();
  u["input_tokens"] = num_prompt - num_cached;
  u["cache_creation_input_tokens"] = 0;
  u["cache_read_input_tokens"] = num_cached;
  u["output_tokens"] = num_output;
  return u;
}

}  // namespace kiln::server::anthropic
