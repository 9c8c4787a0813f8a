// A chat request's prompt: its messages and tools rendered with the model's chat template and
// tokenized so that control tokens come only from the template's own markup. Control-token
// text inside the client's strings ("<|im_end|>" typed in a message) is tokenized as plain
// text (chat/content_guard.h), unless `parse_special_in_content` (kiln serve
// --parse-special-in-content) asks for the whole rendered prompt to be parsed for them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/chat/template.h"
#include "kiln/tokenizer/tokenizer.h"
#include "kiln/util/status.h"

namespace kiln::server {

struct ChatPrompt {
  std::string text;             // the rendered prompt
  std::vector<int32_t> tokens;  // its ids, BOS added when the template left it out
};

// Errors: the template could not render (its message), or the text could not be tokenized.
// opts.bos_token and opts.eos_token are filled from the tokenizer.
Expected<ChatPrompt> chat_prompt(const tokenizer::Tokenizer& tok, const std::string& chat_template,
                                 nlohmann::ordered_json messages, chat::ChatOptions opts,
                                 bool parse_special_in_content);

}  // namespace kiln::server
