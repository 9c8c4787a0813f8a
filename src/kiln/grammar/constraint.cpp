#include "kiln/grammar/constraint.h"

#include "kiln/grammar/gbnf.h"
#include "kiln/grammar/regex.h"

namespace kiln::grammar {

Expected<Grammar> compile_choice(const std::vector<std::string>& choices) {
  if (choices.empty()) return err("choice: the list of choices is empty");
  std::vector<Expr> alts;
  for (const std::string& c : choices) alts.push_back(literal(c));
  GrammarBuilder b;
  const int32_t root = b.rule("root");
  b.define(root, alt(std::move(alts)));
  return b.build(root);
}

namespace {

Expected<Grammar> compile_one(const ConstraintSpec& spec) {
  switch (spec.kind) {
    case ConstraintSpec::Kind::kJsonSchema:
      return compile_json_schema(spec.text, spec.json);
    case ConstraintSpec::Kind::kJsonObject:
      return json_object_grammar(spec.json);
    case ConstraintSpec::Kind::kRegex:
      return compile_regex(spec.text);
    case ConstraintSpec::Kind::kGbnf:
      return parse_gbnf(spec.text);
    case ConstraintSpec::Kind::kChoice:
      return compile_choice(spec.choices);
    case ConstraintSpec::Kind::kToolCalls:
      return compile_tool_calls(spec.text, spec.arguments_key, spec.json);
    case ConstraintSpec::Kind::kToolCallSyntax:
      return compile_tool_call_syntax(spec.text, spec.syntax);
  }
  return err("unknown constraint kind");
}

// The cache key of a spec: every field that changes the grammar.
std::string spec_key(const ConstraintSpec& spec) {
  std::string key(1, static_cast<char>('0' + static_cast<int>(spec.kind)));
  key += spec.json.compact ? 'c' : 'f';
  for (const std::string* part :
       {&spec.json.prefix, &spec.json.suffix, &spec.json.separator, &spec.arguments_key}) {
    key += std::to_string(part->size()) + ":" + *part;
  }
  if (spec.kind == ConstraintSpec::Kind::kToolCallSyntax) {
    const ToolCallSyntax& syn = spec.syntax;
    key += std::to_string(static_cast<int>(syn.body)) + ":" + std::to_string(syn.max_calls) + ":" +
           std::to_string(syn.max_whitespace) + ":";
    for (const std::string* part : {&syn.arguments_key, &syn.before_name, &syn.after_name,
                                    &syn.call_open, &syn.call_close, &syn.separator, &syn.close}) {
      key += std::to_string(part->size()) + ":" + *part;
    }
    for (const std::string& o : syn.opens) key += "|" + std::to_string(o.size()) + ":" + o;
    for (const std::string& m : syn.token_markers) key += "#" + std::to_string(m.size()) + ":" + m;
    key += '\0';
  }
  key +=
      std::to_string(spec.json.max_repeats) + ":" + std::to_string(spec.json.max_whitespace) + ":";
  key += spec.text;
  for (const std::string& c : spec.choices) {
    key += '\0';
    key += std::to_string(c.size()) + ":" + c;
  }
  for (const ConstraintSpec& e : spec.either) {
    const std::string k = spec_key(e);
    key += "\0|" + std::to_string(k.size()) + ":" + k;
  }
  return key;
}

}  // namespace

Expected<Grammar> compile_constraint(const ConstraintSpec& spec) {
  auto g = compile_one(spec);
  if (!g.ok()) return g;
  Grammar out = std::move(g).value();
  for (const ConstraintSpec& e : spec.either) {
    auto other = compile_constraint(e);
    if (!other.ok()) return other;
    out = union_of(out, other.value());
  }
  return out;
}

GrammarCache::GrammarCache(std::shared_ptr<const TokenIndex> vocab, size_t capacity,
                           int64_t max_bytes)
    : vocab_(std::move(vocab)), capacity_(capacity), max_bytes_(max_bytes) {}

Expected<std::shared_ptr<CompiledGrammar>> GrammarCache::get(const ConstraintSpec& spec) {
  const std::string key = spec_key(spec);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end() && it->second->second->exhausted()) {
      // Out of room: what it still allows depends on what earlier requests walked. A new
      // request gets a fresh automaton (the same answers as if it had run alone).
      lru_.erase(it->second);
      index_.erase(it);
    } else if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  auto g = compile_constraint(spec);
  if (!g.ok()) return std::move(g).take_error();
  auto made = CompiledGrammar::create(std::move(g).value(), vocab_);
  if (!made.ok()) return std::move(made).take_error();
  std::shared_ptr<CompiledGrammar> compiled = std::move(made).value();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it != index_.end()) return it->second->second;  // compiled twice meanwhile
  lru_.emplace_front(key, compiled);
  index_[key] = lru_.begin();
  int64_t num_bytes = 0;  // the entries' keys and grammars, newest first
  for (const Entry& e : lru_) {
    num_bytes += static_cast<int64_t>(e.first.size()) + e.second->memory_bytes();
  }
  while (lru_.size() > 1 && (lru_.size() > capacity_ || num_bytes > max_bytes_)) {
    num_bytes -=
        static_cast<int64_t>(lru_.back().first.size()) + lru_.back().second->memory_bytes();
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return compiled;
}

}  // namespace kiln::grammar
