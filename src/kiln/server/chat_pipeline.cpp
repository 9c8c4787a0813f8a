#include "kiln/server/chat_pipeline.h"

#include <fmt/format.h>

#include "kiln/engine/sampler.h"
#include "kiln/server/constraint.h"

namespace kiln::server {

std::variant<PreparedChat, ApiError> prepare_chat(ServerContext& ctx, ChatTurn turn) {
  // Control tokens come only from the template's markup (server/chat_prompt.h).
  chat::ChatOptions opts;
  opts.tools = std::move(turn.tools);
  opts.chat_template_kwargs = std::move(turn.chat_template_kwargs);
  auto rendered = chat_prompt(ctx.tokenizer, ctx.chat_template, std::move(turn.messages),
                              std::move(opts), ctx.options.parse_special_in_content);
  if (!rendered.ok())
    return invalid_request(
        "The chat template could not render these messages: " + rendered.error().message,
        "messages");
  PreparedChat out;
  out.prompt = std::move(rendered).value();
  out.parser_config = ctx.parser_config;
  if (!turn.parse_tools) out.parser_config.format = chat::ToolFormat::kNone;
  chat::adjust_for_prompt(out.parser_config, out.prompt.text);
  out.parser_config.id_seed = ctx.num_requests.fetch_add(1) * 1000003u + random_seed() % 1000003u;
  return out;
}

std::vector<engine::GenerationRequest> fan_out(const PreparedChat& chat,
                                               const engine::GenerationRequest& base,
                                               const std::string& request_id, int32_t n) {
  std::vector<engine::GenerationRequest> requests;
  for (int32_t i = 0; i < n; ++i) {
    engine::GenerationRequest r = base;
    r.request_id = n == 1 ? request_id : fmt::format("{}-{}", request_id, i);
    r.prompt_tokens = chat.prompt.tokens;
    r.sampling.seed = engine::choice_seed(base.sampling.seed, i);
    // Tool-call and reasoning markers can be control tokens ([TOOL_CALLS], DeepSeek's
    // tool-call tokens): the parser must see them, so keep special tokens in the text.
    // End-of-generation tokens never reach the text either way.
    if (chat.parser_config.format != chat::ToolFormat::kNone || chat.parser_config.reasoning)
      r.skip_special = false;
    exempt_reasoning(chat.parser_config, chat.prompt.text, &r);
    requests.push_back(std::move(r));
  }
  return requests;
}

}  // namespace kiln::server
