// What a request asks its output to be, compiled once per vocabulary and kept in an LRU.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/grammar/grammar.h"
#include "kiln/grammar/json_schema.h"
#include "kiln/grammar/matcher.h"
#include "kiln/grammar/token_index.h"
#include "kiln/util/status.h"

namespace kiln::grammar {

struct ConstraintSpec {
  enum class Kind : uint8_t {
    kJsonSchema,      // text: the schema
    kJsonObject,      // any JSON object
    kRegex,           // text: the pattern (matched in full)
    kGbnf,            // text: the grammar
    kChoice,          // choices: one of these strings exactly
    kToolCalls,       // text: the OpenAI tools array; json: the call's framing (compile_tool_calls)
    kToolCallSyntax,  // text: the OpenAI tools array; syntax: the format (compile_tool_call_syntax)
  };
  Kind kind = Kind::kJsonObject;
  std::string text;
  std::vector<std::string> choices;
  JsonSchemaOptions json;
  std::string arguments_key = "arguments";  // kToolCalls: "arguments" or "parameters" (Llama 3)
  ToolCallSyntax syntax;                    // kToolCallSyntax
  // The output matches this spec or one of these (response_format beside tool calls of a
  // tool_choice auto request: an answer of the format, or calls).
  std::vector<ConstraintSpec> either;
};

Expected<Grammar> compile_constraint(const ConstraintSpec& spec);

// One of `choices` exactly (an empty list is an error).
Expected<Grammar> compile_choice(const std::vector<std::string>& choices);

// Compiled grammars for one vocabulary, least recently used evicted past `capacity` entries or
// past `max_bytes` of what they hold (CompiledGrammar::memory_bytes, summed when an entry is
// added: each may hold up to ~130 MiB of stacks and masks, and requests choose them). Reusing
// an entry reuses its automaton and remembered masks (the expensive part of the first request);
// an evicted grammar lives on in the requests that still use it.
class GrammarCache {
 public:
  static constexpr int64_t kDefaultMaxBytes = int64_t{1} << 30;
  GrammarCache(std::shared_ptr<const TokenIndex> vocab, size_t capacity = 64,
               int64_t max_bytes = kDefaultMaxBytes);
  Expected<std::shared_ptr<CompiledGrammar>> get(const ConstraintSpec& spec);
  const std::shared_ptr<const TokenIndex>& vocab() const { return vocab_; }

 private:
  using Entry = std::pair<std::string, std::shared_ptr<CompiledGrammar>>;
  std::shared_ptr<const TokenIndex> vocab_;
  size_t capacity_;
  int64_t max_bytes_;
  std::mutex mu_;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

}  // namespace kiln::grammar
