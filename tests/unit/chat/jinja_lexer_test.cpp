// Lexer: token kinds, values and line numbers; whitespace rules are covered end to end in
// jinja_eval_test.cpp (ws_* cases) and by the oracle.
#include "kiln/chat/jinja/lexer.h"

#include <gtest/gtest.h>

namespace {

using kiln::chat::jinja::lex;
using kiln::chat::jinja::Tok;

TEST(JinjaLexer, TokensAndLines) {
  auto toks = lex("a\n{{ x.y|f(1, 2.5) }}\n{% if 'q\\n' ~ \"r\" %}b{% endif %}");
  ASSERT_TRUE(toks.ok()) << toks.error().message;
  struct Want {
    Tok type;
    const char* value;
    int line;
  };
  const Want want[] = {
      {Tok::Text, "a\n", 1},    {Tok::VarBegin, "", 2},  {Tok::Name, "x", 2},
      {Tok::Op, ".", 2},        {Tok::Name, "y", 2},     {Tok::Op, "|", 2},
      {Tok::Name, "f", 2},      {Tok::Op, "(", 2},       {Tok::Int, "1", 2},
      {Tok::Op, ",", 2},        {Tok::Float, "2.5", 2},  {Tok::Op, ")", 2},
      {Tok::VarEnd, "", 2},     {Tok::Text, "\n", 2},    {Tok::BlockBegin, "", 3},
      {Tok::Name, "if", 3},     {Tok::String, "q\n", 3}, {Tok::Op, "~", 3},
      {Tok::String, "r", 3},    {Tok::BlockEnd, "", 3},  {Tok::Text, "b", 3},
      {Tok::BlockBegin, "", 3}, {Tok::Name, "endif", 3}, {Tok::BlockEnd, "", 3},
      {Tok::Eof, "", 3},
  };
  ASSERT_EQ(toks->size(), std::size(want));
  for (size_t i = 0; i < toks->size(); ++i) {
    EXPECT_EQ((*toks)[i].type, want[i].type) << i;
    EXPECT_EQ((*toks)[i].value, want[i].value) << i;
    EXPECT_EQ((*toks)[i].line, want[i].line) << i;
  }
}

TEST(JinjaLexer, OperatorsAndEscapes) {
  auto toks = lex("{{ a // b ** c != d <= e >= f == g - '\\u00e9\\x41' }}");
  ASSERT_TRUE(toks.ok());
  std::string ops;
  for (const auto& t : *toks) {
    if (t.type == Tok::Op) ops += t.value + " ";
    if (t.type == Tok::String) {
      EXPECT_EQ(t.value,
                "\xc3\xa9"
                "A");
    }
  }
  EXPECT_EQ(ops, "// ** != <= >= == - ");
}

TEST(JinjaLexer, WhitespaceControlTrimsText) {
  auto toks = lex("a  \n  {%- if x -%}  \n b {%+ endif %}\n");
  ASSERT_TRUE(toks.ok());
  std::vector<std::string> texts;
  for (const auto& t : *toks) {
    if (t.type == Tok::Text) texts.push_back(t.value);
  }
  // "-" strips all whitespace on its side; "+" keeps the indentation lstrip would remove.
  ASSERT_EQ(texts.size(), 2u);
  EXPECT_EQ(texts[0], "a");
  EXPECT_EQ(texts[1], "b ");
}

TEST(JinjaLexer, DictBracesInsideVariableTag) {
  auto toks = lex("{{ {'a': {'b': 1}} }}");
  ASSERT_TRUE(toks.ok()) << toks.error().message;
  EXPECT_EQ(toks->back().type, Tok::Eof);
  EXPECT_EQ((*toks)[toks->size() - 2].type, Tok::VarEnd);
}

TEST(JinjaLexer, Errors) {
  EXPECT_FALSE(lex("{{ 'open }}").ok());
  EXPECT_FALSE(lex("{{ a ) }}").ok());
  EXPECT_FALSE(lex("{{ a @ b }}").ok());
  EXPECT_FALSE(lex("{% raw %}never closed").ok());
  auto bad = lex("\n\n{{ '\\xZZ' }}");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("line 3"), std::string::npos) << bad.error().message;
}

}  // namespace
