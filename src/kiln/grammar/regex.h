// Regular expressions (a documented subset of ECMAScript/PCRE syntax) compiled to grammar
// expressions.
//
// Supported: literals (UTF-8), `.` (any code point but \n), classes [a-z], [^...], with the
// escapes \d \D \w \W \s \S inside and outside classes, \n \r \t \f \v \0 \xHH \uHHHH and
// escaped punctuation; groups ( ), (?: ), (?<name> ), (?P<name> ); alternation |;
// quantifiers * + ? {m} {m,} {m,n} (a lazy or possessive suffix ? or + is accepted and changes
// nothing: a constraint has no match preference). ^ at the start and $ at the end are anchors;
// a whole-output regex is always anchored at both ends. Rejected with an error naming the
// construct and its offset: backreferences, lookaround, \b \B, inline flags, ^ or $ elsewhere.
#pragma once

#include <string_view>

#include "kiln/grammar/grammar.h"
#include "kiln/util/status.h"

namespace kiln::grammar {

struct RegexExpr {
  Expr expr;
  bool anchored_start = false;  // the pattern began with ^
  bool anchored_end = false;    // the pattern ended with $
};

// json_string: the expression matches the body of a JSON string (between the quotes) whose
// decoded value the regex matches: '"' and '\' are written \" and \\, control characters as
// \n \t \r \b \f or \u00XX (one canonical escape each).
Expected<RegexExpr> parse_regex(std::string_view pattern, bool json_string = false);

// A grammar whose language is exactly the strings the regex matches in full.
Expected<Grammar> compile_regex(std::string_view pattern);

// One code point in `ranges`, written as a JSON string body would write it (see parse_regex).
Expr json_string_chars(std::vector<std::pair<uint32_t, uint32_t>> ranges);

}  // namespace kiln::grammar
