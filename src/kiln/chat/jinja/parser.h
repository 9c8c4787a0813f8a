// Jinja parser: tokens to statements (the grammar of Jinja2's parser.py, the subset chat
// templates use). Unknown tags fail naming the tag and line.
#pragma once

#include <vector>

#include "kiln/chat/jinja/ast.h"
#include "kiln/chat/jinja/lexer.h"
#include "kiln/util/status.h"

namespace kiln::chat::jinja {

Expected<Body> parse(const std::vector<Token>& tokens);

}  // namespace kiln::chat::jinja
