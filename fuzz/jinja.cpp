// libFuzzer target for the Jinja interpreter: arbitrary bytes as a chat template (what a GGUF
// file's tokenizer.chat_template carries) rendered over a conversation with tools. Parsing and
// rendering must answer (text or an error naming the line) within the work bounds; anything
// ASan or UBSan sees traps.
//   make fuzz-jinja FUZZ_SECONDS=60
// Input: the template runs to the first NUL byte; after it, a JSON array of messages replaces
// the default conversation when it parses.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kiln/chat/jinja/jinja.h"

namespace {

using namespace kiln::chat;
using Json = nlohmann::ordered_json;

const Json& default_messages() {
  static const Json m = Json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"}]},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 3}"},
    {"role": "assistant", "content": "3 C.", "reasoning_content": "Read the tool."}
  ])");
  return m;
}

const Json& tools() {
  static const Json t = Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Current weather.", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string source(input.substr(0, nul));
  Json messages = default_messages();
  if (nul != std::string_view::npos) {
    Json parsed = Json::parse(input.substr(nul + 1), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_array()) messages = std::move(parsed);
  }
  auto tmpl = jinja::Template::parse(source);
  if (!tmpl.ok()) return 0;
  jinja::RenderContext ctx;
  ctx.max_steps = 200'000;  // a fuzzer's input must be quick; the bound itself is what is tested
  ctx.max_output_bytes = 1u << 20;
  ctx.vars = {{"messages", jinja::Value::from_json(messages)},
              {"tools", jinja::Value::from_json(tools())},
              {"add_generation_prompt", jinja::Value::from_json(true)},
              {"bos_token", jinja::Value::from_json("<s>")},
              {"eos_token", jinja::Value::from_json("</s>")}};
  (void)tmpl->render(ctx);
  return 0;
}
