#include "kiln/server/responses_convert.h"

#include <fmt/format.h>

#include "kiln/server/request_controls.h"
#include "kiln/server/router.h"
#include "kiln/util/base64.h"

namespace kiln::server::responses {

namespace {

bool is_string_field(const Json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string();
}

std::string str(const Json& j, const char* key) {
  return is_string_field(j, key) ? j[key].get<std::string>() : std::string();
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

void append_line(std::string& out, std::string_view text) {
  if (text.empty()) return;
  if (!out.empty()) out += "\n";
  out += text;
}

constexpr const char kLocalShellName[] = "local_shell";

// Item types of hosted tools (their calls and results): the engine runs none of them, so
// they are left out of the prompt with a warning rather than refused.
bool is_hosted_item(std::string_view type) {
  return ends_with(type, "_call") || ends_with(type, "_call_output") ||
         type.substr(0, 4) == "mcp_" || type == "additional_tools" || type == "tool_search_output";
}

// A message's content (a string or parts) as text. Images and files are refused with the
// part named: this server serves text-only models.
std::variant<std::string, ApiError> content_text(const Json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    return invalid_request(where + " must be a string or an array of content parts", where);
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const Json& part = content[k];
    const std::string pw = fmt::format("{}[{}]", where, k);
    if (!is_string_field(part, "type"))
      return invalid_request(pw + " must be an object with a 'type'", pw);
    const std::string type = part["type"].get<std::string>();
    if (type == "input_text" || type == "output_text" || type == "text" || type == "summary_text" ||
        type == "reasoning_text") {
      if (!is_string_field(part, "text"))
        return invalid_request(pw + ".text must be a string", pw + ".text");
      append_line(text, part["text"].get<std::string>());
    } else if (type == "refusal") {
      append_line(text, str(part, "refusal"));
    } else if (type == "input_image" || type == "input_file" || type == "input_audio" ||
               type == "input_video") {
      return not_supported(fmt::format("{}: content parts of type '{}' are not supported (this "
                                       "server serves a text-only model)",
                                       pw, type),
                           pw);
    } else {
      return invalid_request(fmt::format("{}: unknown content part type '{}'", pw, type), pw);
    }
  }
  return text;
}

// Arguments as templates expect them: an object when the string holds one.
Json arguments_object(const Json& arguments) {
  if (arguments.is_object()) return arguments;
  if (arguments.is_string()) {
    Json parsed = Json::parse(arguments.get<std::string>(), nullptr, false);
    if (!parsed.is_discarded() && parsed.is_object()) return parsed;
    return arguments;
  }
  return Json::object();
}

// Gathers items into chat messages. Consecutive assistant-side items (reasoning, a message,
// tool calls) form one assistant message, as the chat templates expect.
class Converter {
 public:
  explicit Converter(std::vector<std::string>* warnings) : warnings_(warnings) {}

  std::optional<ApiError> items(const Json& items, const std::string& where) {
    for (size_t i = 0; i < items.size(); ++i)
      if (auto e = item(items[i], fmt::format("{}[{}]", where, i))) return e;
    return std::nullopt;
  }
  void system(std::string text) {
    flush();
    messages_.push_back(Json{{"role", "system"}, {"content", std::move(text)}});
  }
  Json finish() {
    flush();
    // Templates want one system message at the top: instructions and leading
    // system/developer messages become one.
    Json out = Json::array();
    std::string system;
    size_t i = 0;
    for (; i < messages_.size() && messages_[i]["role"] == "system"; ++i)
      if (!messages_[i]["content"].get<std::string>().empty())
        append_line(system, messages_[i]["content"].get<std::string>());
    if (i > 0) out.push_back(Json{{"role", "system"}, {"content", system}});
    for (; i < messages_.size(); ++i) out.push_back(std::move(messages_[i]));
    return out;
  }

 private:
  void flush() {
    if (pending_.is_null()) return;
    if (pending_["tool_calls"].empty()) pending_.erase("tool_calls");
    if (pending_["reasoning_content"].get<std::string>().empty())
      pending_.erase("reasoning_content");
    messages_.push_back(std::move(pending_));
    pending_ = nullptr;
  }
  // The assistant message being gathered. Reasoning opens a turn: after content or tool calls
  // it starts a new message; content after tool calls does too.
  Json& assistant(bool for_reasoning, bool for_content) {
    if (!pending_.is_null()) {
      const bool has_text = !pending_["content"].get<std::string>().empty();
      const bool has_calls = !pending_["tool_calls"].empty();
      if ((for_reasoning && (has_text || has_calls)) || (for_content && has_calls)) flush();
    }
    if (pending_.is_null())
      pending_ = Json{{"role", "assistant"},
                      {"content", ""},
                      {"reasoning_content", ""},
                      {"tool_calls", Json::array()}};
    return pending_;
  }
  void add_call(const Json& id, const std::string& name, Json arguments) {
    assistant(false, false)["tool_calls"].push_back(
        Json{{"id", id},
             {"type", "function"},
             {"function", {{"name", name}, {"arguments", std::move(arguments)}}}});
  }
  void add_result(const Json& call_id, std::string text) {
    flush();
    messages_.push_back(
        Json{{"role", "tool"}, {"tool_call_id", call_id}, {"content", std::move(text)}});
  }
  std::optional<ApiError> message(const Json& it, const std::string& where);
  std::optional<ApiError> compaction(const Json& it, const std::string& where);
  std::optional<ApiError> item(const Json& it, const std::string& where);

  std::vector<std::string>* warnings_;
  Json messages_ = Json::array();
  Json pending_;  // null when no assistant message is being gathered
};

std::optional<ApiError> Converter::message(const Json& it, const std::string& where) {
  const std::string role = str(it, "role");
  if (role != "user" && role != "assistant" && role != "system" && role != "developer")
    return invalid_request(where + ".role must be one of user, assistant, system, developer",
                           where + ".role");
  if (!it.contains("content"))
    return invalid_request(where + ".content is required", where + ".content");
  auto text = content_text(it["content"], where + ".content");
  if (auto* e = std::get_if<ApiError>(&text)) return *e;
  std::string& t = std::get<std::string>(text);
  if (role == "assistant") {
    Json& a = assistant(false, true);
    std::string content = a["content"].get<std::string>();
    append_line(content, t);
    a["content"] = content;
    return std::nullopt;
  }
  flush();
  messages_.push_back(Json{{"role", role == "developer" ? "system" : role}, {"content", t}});
  return std::nullopt;
}

// A compaction item of this server becomes its summary, as a user message. One of another
// server (encrypted with its key) is left out with a warning: the conversation goes on
// without it, as it would with any item this server cannot read.
std::optional<ApiError> Converter::compaction(const Json& it, const std::string& where) {
  if (!is_string_field(it, "encrypted_content"))
    return invalid_request(where + ".encrypted_content must be a string",
                           where + ".encrypted_content");
  bool is_kiln = false;
  auto summary = decode_compaction(it["encrypted_content"].get<std::string>(), &is_kiln);
  if (!summary && is_kiln)
    return invalid_request(where + ".encrypted_content is corrupt (not as this server wrote it)",
                           where + ".encrypted_content");
  if (!summary) {
    warnings_->push_back(
        fmt::format("{}: a compaction item this server did not write (encrypted with another "
                    "server's key); left out of the prompt",
                    where));
    return std::nullopt;
  }
  flush();
  messages_.push_back(
      Json{{"role", "user"}, {"content", std::string(kCompactionSummaryHeading) + *summary}});
  return std::nullopt;
}

std::optional<ApiError> Converter::item(const Json& it, const std::string& where) {
  if (!it.is_object()) return invalid_request(where + " must be an object", where);
  // An item without a type but with a role is a message (EasyInputMessage).
  const std::string type = it.contains("type") ? str(it, "type") : "message";
  if (it.contains("type") && !it["type"].is_string())
    return invalid_request(where + ".type must be a string", where + ".type");
  if (type == "message") return message(it, where);
  if (type == "reasoning") {
    std::string text;
    for (const char* key : {"content", "summary"}) {
      if (!it.contains(key) || !it[key].is_array() || !text.empty()) continue;
      for (const Json& part : it[key]) append_line(text, str(part, "text"));
    }
    if (text.empty()) return std::nullopt;  // encrypted reasoning only: nothing to show
    Json& a = assistant(true, false);
    std::string reasoning = a["reasoning_content"].get<std::string>();
    append_line(reasoning, text);
    a["reasoning_content"] = reasoning;
    return std::nullopt;
  }
  const bool is_call =
      type == "function_call" || type == "custom_tool_call" || type == "local_shell_call";
  const bool is_output = type == "function_call_output" || type == "custom_tool_call_output" ||
                         type == "local_shell_call_output";
  if (is_call || is_output) {
    // local_shell_call_output names its call by `id` in OpenAI's schema; call_id is accepted.
    const char* id_key =
        type == "local_shell_call_output" && !it.contains("call_id") ? "id" : "call_id";
    if (!is_string_field(it, id_key))
      return invalid_request(fmt::format("{}.{} must be a string", where, id_key),
                             where + "." + id_key);
    const Json& call_id = it[id_key];
    if (type == "function_call" || type == "custom_tool_call") {
      if (!is_string_field(it, "name"))
        return invalid_request(where + ".name must be a string", where + ".name");
      const std::string name = it["name"].get<std::string>();
      if (type == "function_call") {
        add_call(call_id, name,
                 arguments_object(it.contains("arguments") ? it["arguments"] : Json("")));
      } else {
        if (!is_string_field(it, "input"))
          return invalid_request(where + ".input must be a string", where + ".input");
        add_call(call_id, name, Json{{"input", it["input"]}});
      }
    } else if (type == "local_shell_call") {
      const Json action =
          it.contains("action") && it["action"].is_object() ? it["action"] : Json::object();
      Json args = Json::object();
      args["command"] = action.contains("command") ? action["command"] : Json::array();
      if (is_string_field(action, "working_directory"))
        args["workdir"] = action["working_directory"];
      if (action.contains("timeout_ms") && action["timeout_ms"].is_number_integer())
        args["timeout_ms"] = action["timeout_ms"];
      add_call(call_id, std::string(kLocalShellName), std::move(args));
    } else {
      if (!it.contains("output"))
        return invalid_request(where + ".output is required", where + ".output");
      add_result(call_id, tool_output_text(it["output"]));
    }
    return std::nullopt;
  }
  if (type == "compaction") return compaction(it, where);
  if (type == "item_reference")
    return not_supported(where +
                             ": item_reference is not supported; send the item itself, or "
                             "continue with previous_response_id",
                         where);
  // Items of hosted tools, and kinds newer than this server: left out, never refused (a 400
  // here is what breaks agents whose history holds them).
  warnings_->push_back(fmt::format(
      "{}: '{}' items {}; left out of the prompt", where, type,
      is_hosted_item(type) ? "belong to a tool this server does not run" : "are not known here"));
  return std::nullopt;
}

std::variant<Json, ApiError> read_input(const Json& body) {
  auto it = body.find("input");
  if (it == body.end() || it->is_null())
    return invalid_request("'input' is required: a string or an array of items", "input");
  if (it->is_string())
    return Json::array({Json{{"type", "message"}, {"role", "user"}, {"content", *it}}});
  if (!it->is_array())
    return invalid_request("'input' must be a string or an array of items", "input");
  return *it;
}

struct Tools {
  Json offered = Json::array();  // chat-style function tools, in the client's order
  std::map<std::string, ToolKind> kinds;
};

std::optional<ApiError> read_tools(const Json& body, Tools* out, std::vector<std::string>* warn) {
  auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_array()) return invalid_request("'tools' must be an array", "tools");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& t = (*it)[i];
    const std::string where = fmt::format("tools[{}]", i);
    if (!is_string_field(t, "type"))
      return invalid_request(where + " must be an object with a 'type'", where + ".type");
    const std::string type = t["type"].get<std::string>();
    if (type == "function" || type == "custom") {
      if (!is_string_field(t, "name"))
        return invalid_request(where + ".name must be a string", where + ".name");
      const std::string name = t["name"].get<std::string>();
      if (type == "custom") {
        out->offered.push_back(custom_tool_function(t));
        out->kinds[name] = ToolKind::kCustom;
        continue;
      }
      Json params = t.contains("parameters") ? t["parameters"] : Json(nullptr);
      if (!params.is_null() && !params.is_object())
        return invalid_request(where + ".parameters must be an object", where + ".parameters");
      if (params.is_null()) params = Json{{"type", "object"}, {"properties", Json::object()}};
      Json fn{{"name", name}};
      if (is_string_field(t, "description")) fn["description"] = t["description"];
      fn["parameters"] = std::move(params);
      out->offered.push_back(Json{{"type", "function"}, {"function", std::move(fn)}});
      out->kinds[name] = ToolKind::kFunction;
    } else if (type == "local_shell") {
      out->offered.push_back(local_shell_function());
      out->kinds[std::string(kLocalShellName)] = ToolKind::kLocalShell;
    } else {
      warn->push_back(fmt::format(
          "{}: '{}' is a hosted tool this server cannot run; left out of the prompt", where, type));
    }
  }
  return std::nullopt;
}

// The tools of `offered` whose names are in `names`.
Json only_named(const Json& offered, const std::vector<std::string>& names) {
  Json out = Json::array();
  for (const Json& t : offered)
    for (const std::string& n : names)
      if (t["function"]["name"] == n) {
        out.push_back(t);
        break;
      }
  return out;
}

// The name a tool_choice object or allowed_tools entry designates; "" for hosted types.
std::string chosen_name(const Json& choice) {
  const std::string type = str(choice, "type");
  if (type == "function" || type == "custom") return str(choice, "name");
  if (type == "local_shell") return std::string(kLocalShellName);
  return "";
}

std::optional<ApiError> read_tool_choice(const Json& body, Tools& tools, ResponsesRequest* out) {
  std::string mode = "auto";
  const Json tc = body.contains("tool_choice") ? body["tool_choice"] : Json(nullptr);
  if (tc.is_string()) {
    mode = tc.get<std::string>();
    if (mode != "none" && mode != "auto" && mode != "required")
      return invalid_request("'tool_choice' must be none, auto, required or an object",
                             "tool_choice");
  } else if (tc.is_object()) {
    const std::string type = str(tc, "type");
    if (type == "allowed_tools") {
      const std::string m = tc.contains("mode") ? str(tc, "mode") : "auto";
      if (m != "auto" && m != "required")
        return invalid_request("'tool_choice.mode' must be auto or required", "tool_choice.mode");
      if (!tc.contains("tools") || !tc["tools"].is_array())
        return invalid_request("'tool_choice.tools' must be an array", "tool_choice.tools");
      std::vector<std::string> names;
      for (const Json& t : tc["tools"])
        if (std::string n = chosen_name(t); !n.empty()) names.push_back(std::move(n));
      tools.offered = only_named(tools.offered, names);
      mode = m;
    } else if (type == "function" || type == "custom" || type == "local_shell") {
      const std::string name = chosen_name(tc);
      if (name.empty())
        return invalid_request("'tool_choice.name' must be a string", "tool_choice.name");
      Json named = only_named(tools.offered, {name});
      if (named.empty())
        return invalid_request(
            fmt::format("'tool_choice' names '{}', which is not in 'tools'", name), "tool_choice");
      tools.offered = std::move(named);  // only the named tool is offered to the model
      mode = "required";
    } else if (!type.empty()) {
      out->warnings.push_back(fmt::format(
          "tool_choice: '{}' is a hosted tool this server cannot run; the model chooses", type));
    } else {
      return invalid_request("'tool_choice' must be an object with a 'type'", "tool_choice");
    }
  } else if (!tc.is_null()) {
    return invalid_request("'tool_choice' must be a string or an object", "tool_choice");
  }
  if (mode == "required" && tools.offered.empty()) {
    if (body.contains("tools") && body["tools"].is_array() && !body["tools"].empty()) {
      out->warnings.push_back(
          "tool_choice: required, but every tool offered is hosted; the model chooses");
      mode = "auto";
    } else {
      return invalid_request("'tool_choice' required needs 'tools'", "tool_choice");
    }
  }
  if (mode != "none" && !tools.offered.empty()) {
    out->turn.tools = tools.offered;
    out->turn.parse_tools = true;
    out->turn.force_tool_call = mode == "required";
  }
  out->tool_kinds = std::move(tools.kinds);
  return std::nullopt;
}

std::optional<ApiError> read_options(const Json& body, ResponsesRequest* out) {
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean())
      return invalid_request("'parallel_tool_calls' must be a boolean", "parallel_tool_calls");
    out->parallel_tool_calls = it->get<bool>();
  }
  if (auto it = body.find("reasoning"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return invalid_request("'reasoning' must be an object", "reasoning");
    auto effort = read_reasoning_effort(it->contains("effort") ? (*it)["effort"] : Json(nullptr),
                                        "reasoning.effort");
    if (auto* e = std::get_if<ApiError>(&effort)) return *e;
    out->reasoning_effort = std::get<std::optional<std::string>>(effort);
    if (out->reasoning_effort) {
      out->turn.chat_template_kwargs["reasoning_effort"] = *out->reasoning_effort;
      // Templates with a thinking switch (Qwen3's enable_thinking) think unless told not to.
      if (*out->reasoning_effort == "none")
        out->turn.chat_template_kwargs["enable_thinking"] = false;
    }
  }
  if (auto it = body.find("metadata"); it != body.end() && !it->is_null() && !it->is_object())
    return invalid_request("'metadata' must be an object", "metadata");
  for (const char* key : {"store", "stream", "background"})
    if (auto it = body.find(key); it != body.end() && !it->is_null() && !it->is_boolean())
      return invalid_request(fmt::format("'{}' must be a boolean", key), key);
  if (body.contains("background") && body["background"] == true)
    return not_supported("'background' responses are not supported; stream instead", "background");
  if (auto it = body.find("text"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return invalid_request("'text' must be an object", "text");
    if (auto f = it->find("format"); f != it->end() && !f->is_null()) {
      const std::string type = str(*f, "type");
      if (type != "text" && type != "json_object" && type != "json_schema")
        return invalid_request("'text.format.type' must be text, json_object or json_schema",
                               "text.format.type");
      if (type == "json_schema" && (!f->contains("schema") || !(*f)["schema"].is_object()))
        return invalid_request("'text.format.schema' must be an object (a JSON Schema)",
                               "text.format.schema");
    }
  }
  return std::nullopt;
}

}  // namespace

Json custom_tool_function(const Json& tool) {
  std::string description = str(tool, "description");
  // A grammar or regex format is shown to the model (it is not enforced yet).
  if (tool.contains("format") && tool["format"].is_object()) {
    const Json& f = tool["format"];
    if (str(f, "type") == "grammar" && is_string_field(f, "definition"))
      append_line(description, fmt::format("\nThe input must follow this {} grammar:\n{}",
                                           str(f, "syntax").empty() ? "" : str(f, "syntax"),
                                           f["definition"].get<std::string>()));
  }
  append_line(description, "Pass the raw input text in the 'input' field.");
  Json params{{"type", "object"},
              {"properties",
               {{"input", {{"type", "string"}, {"description", "The raw input of the tool"}}}}},
              {"required", {"input"}}};
  return Json{
      {"type", "function"},
      {"function",
       {{"name", tool["name"]}, {"description", description}, {"parameters", std::move(params)}}}};
}

Json local_shell_function() {
  Json params{
      {"type", "object"},
      {"properties",
       {{"command",
         {{"type", "array"},
          {"items", {{"type", "string"}}},
          {"description", "The command and its arguments, e.g. [\"bash\", \"-lc\", \"ls\"]"}}},
        {"workdir", {{"type", "string"}, {"description", "The working directory"}}},
        {"timeout_ms", {{"type", "integer"}, {"description", "Timeout in milliseconds"}}}}},
      {"required", {"command"}}};
  return Json{{"type", "function"},
              {"function",
               {{"name", kLocalShellName},
                {"description", "Run a shell command on the user's machine and read its output."},
                {"parameters", std::move(params)}}}};
}

std::string tool_output_text(const Json& output) {
  if (output.is_string()) return output.get<std::string>();
  if (!output.is_array()) return output.is_null() ? "" : output.dump();
  std::string out;
  for (const Json& part : output) {
    const std::string type = str(part, "type");
    if (is_string_field(part, "text")) {
      append_line(out, part["text"].get<std::string>());
    } else if (type == "input_image") {
      append_line(out, "[image omitted: this model reads text only]");
    } else if (type == "input_file") {
      const std::string name = str(part, "filename");
      append_line(out, fmt::format("[file {}omitted: this model reads text only]",
                                   name.empty() ? "" : name + " "));
    } else if (!type.empty()) {
      append_line(out, "[" + type + " omitted]");
    }
  }
  return out;
}

std::variant<ResponsesRequest, ApiError> parse_request(const Json& body, const Json& history) {
  ResponsesRequest out;
  auto input = read_input(body);
  if (auto* e = std::get_if<ApiError>(&input)) return *e;
  out.input_items = std::get<Json>(std::move(input));

  Converter conv(&out.warnings);
  // Instructions are this request's own: those of a previous response are not carried over.
  if (auto it = body.find("instructions"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      conv.system(it->get<std::string>());
    } else if (it->is_array()) {
      if (auto e = conv.items(*it, "instructions")) return *e;
    } else {
      return invalid_request("'instructions' must be a string", "instructions");
    }
  }
  if (history.is_array())
    if (auto e = conv.items(history, "previous_response")) return *e;
  if (auto e = conv.items(out.input_items, "input")) return *e;
  out.turn.messages = conv.finish();

  Tools tools;
  if (auto e = read_tools(body, &tools, &out.warnings)) return *e;
  if (auto e = read_tool_choice(body, tools, &out)) return *e;
  if (auto e = read_options(body, &out)) return *e;
  return out;
}

// ---------------------------------------------------------------------------------------
// Compaction

const char* const kCompactionPrompt =
    "Context compaction: the conversation above is about to be replaced by a summary that "
    "you write now, for whoever continues the work (you, with no memory of the above). Write "
    "a concise, complete hand-off: the goal and the user's requests and constraints, what "
    "was done and decided (with file names, commands, identifiers and results that matter), "
    "what failed and why, the current state, and the next steps. Write only the summary.";

const char* const kCompactionSummaryHeading =
    "A summary of the earlier conversation, written when its context was compacted:\n\n";

namespace {
constexpr std::string_view kCompactionPrefix = "kiln-compaction-v1:";
}  // namespace

std::string encode_compaction(std::string_view summary) {
  return std::string(kCompactionPrefix) + base64::encode(summary);
}

std::optional<std::string> decode_compaction(std::string_view encrypted_content, bool* is_kiln) {
  *is_kiln = encrypted_content.substr(0, kCompactionPrefix.size()) == kCompactionPrefix;
  if (!*is_kiln) return std::nullopt;
  return base64::decode(encrypted_content.substr(kCompactionPrefix.size()));
}

Json compacted_output(const Json& conversation, std::string_view summary) {
  Json out = Json::array();
  for (const Json& item : conversation) {
    if (!item.is_object()) continue;
    const std::string type = item.contains("type") ? str(item, "type") : "message";
    if (type != "message" || str(item, "role") != "user" || !item.contains("content")) continue;
    Json content = item["content"];
    if (content.is_string())
      content = Json::array({Json{{"type", "input_text"}, {"text", content}}});
    out.push_back(Json{{"id", is_string_field(item, "id") ? item["id"] : Json(random_id("msg_"))},
                       {"type", "message"},
                       {"status", "completed"},
                       {"role", "user"},
                       {"content", std::move(content)}});
  }
  out.push_back(Json{{"id", random_id("cmp_")},
                     {"type", "compaction"},
                     {"encrypted_content", encode_compaction(summary)}});
  return out;
}

Json usage(int32_t num_prompt, int32_t num_cached, int32_t num_output, int32_t num_reasoning) {
  Json u = Json::object();
  u["input_tokens"] = num_prompt;
  u["input_tokens_details"] = Json{{"cached_tokens", num_cached}};
  u["output_tokens"] = num_output;
  u["output_tokens_details"] = Json{{"reasoning_tokens", num_reasoning}};
  u["total_tokens"] = num_prompt + num_output;
  return u;
}

// ---------------------------------------------------------------------------------------
// Reasoning tokens

void ReasoningCounter::feed(std::string_view token_text) {
  if (done_) return;
  const size_t close_len = config_.think_close.size();
  const size_t from = text_.size() > close_len ? text_.size() - close_len : 0;
  text_ += token_text;
  ++num_undecided_;
  if (!config_.reasoning) {
    done_ = true;
    return;
  }
  if (!config_.reasoning_open_at_start) {
    // The block must open the output (after whitespace): undecided while the text is
    // whitespace or a prefix of think_open; content first means no reasoning at all.
    const size_t first = text_.find_first_not_of(" \t\r\n");
    if (first == std::string::npos) return;
    const std::string_view rest = std::string_view(text_).substr(first);
    const std::string_view open = config_.think_open;
    if (rest.size() < open.size()) {
      if (open.substr(0, rest.size()) != rest) done_ = true;
      return;
    }
    if (rest.substr(0, open.size()) != open) {
      done_ = true;
      return;
    }
  }
  num_reasoning_ += num_undecided_;
  num_undecided_ = 0;
  if (text_.find(config_.think_close, from) != std::string::npos) done_ = true;
}

// ---------------------------------------------------------------------------------------
// Output items

void OutputBuilder::open(Open kind, Json item, std::vector<Json>& events) {
  close("completed", events);
  open_ = kind;
  output_.push_back(item);
  events.push_back(
      Json{{"type", "response.output_item.added"}, {"output_index", index()}, {"item", item}});
  if (kind == Open::kMessage || kind == Open::kReasoning) {
    Json part = kind == Open::kMessage ? Json{{"type", "output_text"},
                                              {"text", ""},
                                              {"annotations", Json::array()},
                                              {"logprobs", Json::array()}}
                                       : Json{{"type", "reasoning_text"}, {"text", ""}};
    output_.back()["content"].push_back(part);
    events.push_back(Json{{"type", "response.content_part.added"},
                          {"item_id", item["id"]},
                          {"output_index", index()},
                          {"content_index", 0},
                          {"part", std::move(part)}});
  }
}

void OutputBuilder::append_text(const std::string& text, std::vector<Json>& events) {
  text_ += text;
  Json& item = output_.back();
  item["content"][0]["text"] = text_;
  Json e{{"type",
          open_ == Open::kMessage ? "response.output_text.delta" : "response.reasoning_text.delta"},
         {"item_id", item["id"]},
         {"output_index", index()},
         {"content_index", 0},
         {"delta", text}};
  if (open_ == Open::kMessage) e["logprobs"] = Json::array();
  events.push_back(std::move(e));
}

void OutputBuilder::close_tool_call(std::vector<Json>& events) {
  Json& item = output_.back();
  const Json id = item["id"];
  switch (tool_kind_) {
    case ToolKind::kFunction:
      item["arguments"] = tool_args_;
      item["status"] = "completed";
      events.push_back(Json{{"type", "response.function_call_arguments.done"},
                            {"item_id", id},
                            {"output_index", index()},
                            {"name", item["name"]},
                            {"arguments", tool_args_}});
      break;
    case ToolKind::kCustom: {
      // The model called {"input": "<text>"}; a lone string field of another name or, failing
      // that, the arguments themselves are the input.
      const Json args = Json::parse(tool_args_, nullptr, false);
      std::string input = tool_args_;
      if (args.is_object() && is_string_field(args, "input")) {
        input = args["input"].get<std::string>();
      } else if (args.is_object() && args.size() == 1 && args.begin()->is_string()) {
        input = args.begin()->get<std::string>();
      }
      item["input"] = input;
      events.push_back(Json{{"type", "response.custom_tool_call_input.delta"},
                            {"item_id", id},
                            {"output_index", index()},
                            {"delta", input}});
      events.push_back(Json{{"type", "response.custom_tool_call_input.done"},
                            {"item_id", id},
                            {"output_index", index()},
                            {"input", input}});
      break;
    }
    case ToolKind::kLocalShell: {
      const Json args = Json::parse(tool_args_, nullptr, false);
      Json command = Json::array();
      Json workdir = nullptr;
      Json timeout = nullptr;
      if (args.is_object()) {
        const Json c = args.contains("command") ? args["command"] : Json(nullptr);
        if (c.is_array()) {
          for (const Json& a : c)
            command.push_back(a.is_string() ? a.get<std::string>() : a.dump());
        } else if (c.is_string()) {
          command = Json::array({"bash", "-lc", c});  // one string: a shell command line
        }
        if (is_string_field(args, "workdir")) workdir = args["workdir"];
        if (is_string_field(args, "working_directory")) workdir = args["working_directory"];
        if (args.contains("timeout_ms") && args["timeout_ms"].is_number_integer())
          timeout = args["timeout_ms"];
      }
      item["action"] = Json{{"type", "exec"},        {"command", std::move(command)},
                            {"env", Json::object()}, {"timeout_ms", timeout},
                            {"user", nullptr},       {"working_directory", workdir}};
      item["status"] = "completed";
      break;
    }
  }
  events.push_back(
      Json{{"type", "response.output_item.done"}, {"output_index", index()}, {"item", item}});
}

void OutputBuilder::close(const char* status, std::vector<Json>& events) {
  if (open_ == Open::kNone) return;
  if (open_ == Open::kToolCall) {
    close_tool_call(events);
  } else {
    Json& item = output_.back();
    const Json id = item["id"];
    const bool message = open_ == Open::kMessage;
    Json done{{"type", message ? "response.output_text.done" : "response.reasoning_text.done"},
              {"item_id", id},
              {"output_index", index()},
              {"content_index", 0},
              {"text", text_}};
    if (message) done["logprobs"] = Json::array();
    events.push_back(std::move(done));
    events.push_back(Json{{"type", "response.content_part.done"},
                          {"item_id", id},
                          {"output_index", index()},
                          {"content_index", 0},
                          {"part", item["content"][0]}});
    if (message) item["status"] = status;
    events.push_back(
        Json{{"type", "response.output_item.done"}, {"output_index", index()}, {"item", item}});
  }
  open_ = Open::kNone;
  text_.clear();
  tool_args_.clear();
}

std::vector<Json> OutputBuilder::feed(const std::vector<chat::Event>& events) {
  std::vector<Json> out;
  for (const chat::Event& e : events) {
    switch (e.kind) {
      case chat::Event::Kind::kReasoning:
        if (e.text.empty()) break;
        if (open_ != Open::kReasoning)
          open(Open::kReasoning,
               Json{{"type", "reasoning"},
                    {"id", random_id("rs_")},
                    {"summary", Json::array()},
                    {"content", Json::array()}},
               out);
        append_text(e.text, out);
        break;
      case chat::Event::Kind::kContent:
        if (e.text.empty()) break;
        if (open_ != Open::kMessage)
          open(Open::kMessage,
               Json{{"type", "message"},
                    {"id", random_id("msg_")},
                    {"status", "in_progress"},
                    {"role", "assistant"},
                    {"content", Json::array()}},
               out);
        append_text(e.text, out);
        break;
      case chat::Event::Kind::kToolCallBegin: {
        if (single_tool_ && num_tools_ > 0) {
          skipping_tool_ = true;
          break;
        }
        ++num_tools_;
        auto kind = tool_kinds_.find(e.tool_name);
        tool_kind_ = kind == tool_kinds_.end() ? ToolKind::kFunction : kind->second;
        Json item;
        switch (tool_kind_) {
          case ToolKind::kFunction:
            item = Json{{"type", "function_call"}, {"id", random_id("fc_")},
                        {"call_id", e.tool_id},    {"name", e.tool_name},
                        {"arguments", ""},         {"status", "in_progress"}};
            break;
          case ToolKind::kCustom:
            item = Json{{"type", "custom_tool_call"},
                        {"id", random_id("ctc_")},
                        {"call_id", e.tool_id},
                        {"name", e.tool_name},
                        {"input", ""}};
            break;
          case ToolKind::kLocalShell:
            item = Json{{"type", "local_shell_call"},
                        {"id", random_id("lsh_")},
                        {"call_id", e.tool_id},
                        {"status", "in_progress"},
                        {"action",
                         {{"type", "exec"}, {"command", Json::array()}, {"env", Json::object()}}}};
            break;
        }
        open(Open::kToolCall, std::move(item), out);
        break;
      }
      case chat::Event::Kind::kToolCallArgs:
        if (skipping_tool_ || open_ != Open::kToolCall) break;
        tool_args_ += e.text;
        if (tool_kind_ == ToolKind::kFunction) {
          output_.back()["arguments"] = tool_args_;
          out.push_back(Json{{"type", "response.function_call_arguments.delta"},
                             {"item_id", output_.back()["id"]},
                             {"output_index", index()},
                             {"delta", e.text}});
        }
        break;
      case chat::Event::Kind::kToolCallEnd:
        if (skipping_tool_) {
          skipping_tool_ = false;
          break;
        }
        close("completed", out);
        break;
    }
  }
  return out;
}

std::vector<Json> OutputBuilder::finish(bool incomplete) {
  std::vector<Json> out;
  close(incomplete ? "incomplete" : "completed", out);
  return out;
}

// ---------------------------------------------------------------------------------------
// The response object

Echo read_echo(const Json& body) {
  Echo e;
  auto get = [&](const char* key) { return body.contains(key) ? body[key] : Json(nullptr); };
  const Json instructions = get("instructions");
  if (instructions.is_string() || instructions.is_array()) e.instructions = instructions;
  if (get("tools").is_array()) e.tools = get("tools");
  if (!get("tool_choice").is_null()) e.tool_choice = get("tool_choice");
  if (get("parallel_tool_calls").is_boolean())
    e.parallel_tool_calls = get("parallel_tool_calls").get<bool>();
  if (get("text").is_object()) {
    e.text = get("text");
    if (!e.text.contains("format") || e.text["format"].is_null())
      e.text["format"] = Json{{"type", "text"}};
  }
  if (get("reasoning").is_object()) {
    const Json r = get("reasoning");
    e.reasoning["effort"] = r.contains("effort") ? r["effort"] : Json(nullptr);
    e.reasoning["summary"] = r.contains("summary") ? r["summary"] : Json(nullptr);
  }
  if (get("metadata").is_object()) e.metadata = get("metadata");
  if (get("store").is_boolean()) e.store = get("store").get<bool>();
  if (get("previous_response_id").is_string()) e.previous_response_id = get("previous_response_id");
  if (get("max_output_tokens").is_number_integer()) e.max_output_tokens = get("max_output_tokens");
  if (get("user").is_string()) e.user = get("user");
  if (get("prompt_cache_key").is_string()) e.prompt_cache_key = get("prompt_cache_key");
  if (get("safety_identifier").is_string()) e.safety_identifier = get("safety_identifier");
  return e;
}

Json response_object(const ResponseState& s, const Echo& echo) {
  Json r = Json::object();
  r["id"] = s.id;
  r["object"] = "response";
  r["created_at"] = s.created_at;
  r["completed_at"] = s.completed_at ? Json(*s.completed_at) : Json(nullptr);
  r["status"] = s.status;
  r["incomplete_details"] = s.incomplete_details;
  r["model"] = s.model;
  r["previous_response_id"] = echo.previous_response_id;
  r["instructions"] = echo.instructions;
  r["output"] = s.output;
  r["error"] = s.error;
  r["tools"] = echo.tools;
  r["tool_choice"] = echo.tool_choice;
  r["truncation"] = "disabled";
  r["parallel_tool_calls"] = echo.parallel_tool_calls;
  r["text"] = echo.text;
  r["top_p"] = echo.top_p;
  r["presence_penalty"] = echo.presence_penalty;
  r["frequency_penalty"] = echo.frequency_penalty;
  r["top_logprobs"] = 0;
  r["temperature"] = echo.temperature;
  r["reasoning"] = echo.reasoning;
  r["user"] = echo.user;
  r["usage"] = s.usage;
  r["max_output_tokens"] = echo.max_output_tokens;
  r["max_tool_calls"] = nullptr;
  r["store"] = echo.store;
  r["background"] = false;
  r["service_tier"] = "default";
  r["metadata"] = echo.metadata;
  r["safety_identifier"] = echo.safety_identifier;
  r["prompt_cache_key"] = echo.prompt_cache_key;
  if (!s.warnings.empty()) r["warnings"] = s.warnings;
  return r;
}

}  // namespace kiln::server::responses
