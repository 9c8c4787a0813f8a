// Jinja lexer: template text to tokens, with the whitespace rules of Jinja2 as Hugging Face
// configures it (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False).
#pragma once

#include <string>
#include <vector>

#include "kiln/util/status.h"

namespace kiln::chat::jinja {

enum class Tok {
  Text,        // raw template text (value)
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,  // value is the decoded string
  Int,
  Float,
  Op,  // value is the operator text
  Eof,
};

struct Token {
  Tok type;
  std::string value;
  int line;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

Expected<std::vector<Token>> lex(const std::string& source, const LexOptions& opts = {});

}  // namespace kiln::chat::jinja
