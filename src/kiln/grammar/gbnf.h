// GBNF, llama.cpp's grammar text format (its grammars/README.md), parsed into a grammar.
//
//   root  ::= "{" ws pair ("," ws pair)* "}"   # a comment
//   pair  ::= [a-z]+ ":" ws ( "true" | "false" )
//   ws    ::= [ \t\n]*
//
// Supported: rules `name ::= alternatives` (names of letters, digits, '-' and '_'), the start
// rule `root`, literals "..." and character classes [...] / [^...] over code points (escapes
// \n \r \t \\ \" \' \[ \] \- \xHH \uHHHH \UHHHHHHHH), `.` (any code point), groups ( ),
// postfix * + ? {m} {m,} {m,n}, and # comments. As in llama.cpp, a rule's alternatives may
// continue on the next line after `::=` or `|`, and anywhere inside parentheses; otherwise a
// newline ends the rule. Errors name the line and column (1-based).
#pragma once

#include <string_view>

#include "kiln/grammar/grammar.h"
#include "kiln/util/status.h"

namespace kiln::grammar {

Expected<Grammar> parse_gbnf(std::string_view text);

}  // namespace kiln::grammar
