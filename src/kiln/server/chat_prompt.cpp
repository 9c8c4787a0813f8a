#include "kiln/server/chat_prompt.h"

#include "kiln/chat/content_guard.h"

namespace kiln::server {

Expected<ChatPrompt> chat_prompt(const tokenizer::Tokenizer& tok, const std::string& chat_template,
                                 nlohmann::ordered_json messages, chat::ChatOptions opts,
                                 bool parse_special_in_content) {
  if (auto id = tok.bos_id()) opts.bos_token = std::string(tok.token_text(*id));
  if (auto id = tok.eos_id()) opts.eos_token = std::string(tok.token_text(*id));
  chat::ContentGuard guard([&tok](std::string_view text) {
    std::vector<chat::ContentGuard::Range> out;
    for (const tokenizer::TextRange& r : tok.find_control_texts(text))
      out.emplace_back(r.begin, r.end);
    return out;
  });
  if (!parse_special_in_content) {
    guard.protect(messages);
    guard.protect(opts.tools);
  }
  KILN_TRY(std::string rendered, chat::render_chat(chat_template, messages, opts));
  chat::ContentGuard::Restored restored = guard.restore(rendered);
  std::vector<tokenizer::TextRange> literal;
  literal.reserve(restored.literal.size());
  for (const auto& [begin, end] : restored.literal) literal.push_back({begin, end});
  ChatPrompt p;
  KILN_TRY(p.tokens,
           tok.encode(restored.text, /*add_special=*/false, /*parse_special=*/true, literal));
  // Templates normally write the BOS text themselves; add the id when one was left out.
  if (tok.add_bos() && tok.bos_id() && (p.tokens.empty() || p.tokens.front() != *tok.bos_id()))
    p.tokens.insert(p.tokens.begin(), *tok.bos_id());
  p.text = std::move(restored.text);
  return p;
}

}  // namespace kiln::server
