#include "kiln/engine/constraint_gate.h"

#include <algorithm>
#include <limits>

namespace kiln::engine {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

size_t first_non_space(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (!is_space(s[i])) return i;
  }
  return std::string_view::npos;
}

// Whitespace the undecided phase lets through before the thinking block's open tag.
constexpr size_t kMaxLeadingSpaceBytes = 16;
// Whitespace tokens allowed between think_close and the grammar's first byte.
constexpr int32_t kMaxSpaceTokens = 2;

bool all_space(std::string_view s) {
  return !s.empty() && first_non_space(s) == std::string_view::npos;
}

// Whitespace a grammar's JSON allows (JsonSchemaOptions: ' ', '\t', '\n').
bool is_json_grammar_space(char c) {
  return c == ' ' || c == '\t' || c == '\n';
}

enum class TriggerMatch : uint8_t { kNo, kPartial, kFull };

// Does `s` begin with trigger `t` (kPartial: s ends inside a possible match)?
TriggerMatch match_trigger(const GrammarStart::Trigger& t, std::string_view s) {
  size_t i = 0;
  for (size_t j = 0; j < t.text.size(); ++j) {
    if (j == t.space_at) {
      int32_t n = 0;
      while (i < s.size() && is_json_grammar_space(s[i]) && n < t.max_space) {
        ++i;
        ++n;
      }
    }
    if (i == s.size()) return TriggerMatch::kPartial;
    if (s[i] != t.text[j]) return TriggerMatch::kNo;
    ++i;
  }
  return TriggerMatch::kFull;
}

}  // namespace

ConstraintGate::ConstraintGate(std::shared_ptr<grammar::CompiledGrammar> grammar,
                               GrammarStart start, PieceFn piece, std::vector<int32_t> end_tokens)
    : grammar_(std::move(grammar)),
      start_(std::move(start)),
      piece_(std::move(piece)),
      end_tokens_(std::move(end_tokens)),
      matcher_(grammar_),
      num_tokens_(grammar_->vocab().num_tokens()) {
  for (int32_t e : grammar_->vocab().end_tokens()) end_tokens_.push_back(e);
  std::sort(end_tokens_.begin(), end_tokens_.end());
  end_tokens_.erase(std::unique(end_tokens_.begin(), end_tokens_.end()), end_tokens_.end());
  std::erase_if(start_.triggers, [](const GrammarStart::Trigger& t) { return t.text.empty(); });
  for (const GrammarStart::Trigger& t : start_.triggers) {
    max_trigger_bytes_ = std::max(max_trigger_bytes_, t.text.size());
  }
  // Whitespace inside a trigger is for at-start triggers (matched at one place).
  for (GrammarStart::Trigger& t : start_.triggers) {
    if (!t.at_start) t.space_at = std::string::npos;
  }
  const Phase answer = lazy() ? Phase::kFree : Phase::kConstrained;
  state_.phase = answer;
  if (start_.reasoning && !start_.think_close.empty()) {
    if (start_.reasoning_open_at_start) {
      state_.phase = Phase::kThinking;
    } else if (!start_.think_open.empty()) {
      state_.phase = Phase::kUndecided;
    }
  }
}

bool ConstraintGate::is_end(int32_t token) const {
  return std::binary_search(end_tokens_.begin(), end_tokens_.end(), token);
}

bool ConstraintGate::space_allowed(const State& s) const {
  return s.num_space_tokens >= 0 && s.num_space_tokens < kMaxSpaceTokens &&
         matcher_.num_accepted() == 0;
}

const std::vector<int32_t>& ConstraintGate::space_tokens() {
  if (!space_tokens_known_) {
    for (int32_t id = 0; id < num_tokens_; ++id) {
      if (!is_end(id) && all_space(piece_(id))) space_tokens_.push_back(id);
    }
    space_tokens_known_ = true;
  }
  return space_tokens_;
}

bool ConstraintGate::fill_mask(std::vector<uint64_t>* mask) {
  const size_t words = static_cast<size_t>(matcher_.mask_words());
  switch (state_.phase) {
    case Phase::kConstrained:
      mask->resize(words);
      matcher_.fill_mask(*mask);
      if (space_allowed(state_)) {
        for (int32_t id : space_tokens()) (*mask)[id / 64] |= uint64_t{1} << (id % 64);
      }
      return true;
    case Phase::kFree:
      return false;
    case Phase::kThinking: {
      if (lazy()) return false;
      // Anything but the end: the answer the grammar constrains must still come.
      mask->assign(words, ~uint64_t{0});
      if (num_tokens_ % 64 != 0) mask->back() = (uint64_t{1} << (num_tokens_ % 64)) - 1;
      for (int32_t e : end_tokens_) {
        if (e >= 0 && e < num_tokens_) (*mask)[e / 64] &= ~(uint64_t{1} << (e % 64));
      }
      return true;
    }
    case Phase::kUndecided: {
      if (lazy()) return false;  // free either way until a trigger
      // The grammar's first tokens (while nothing but whitespace was written), or tokens that
      // go on with the open tag.
      mask->resize(words);
      const bool blank = first_non_space(state_.text) == std::string_view::npos;
      if (blank) {
        matcher_.fill_mask(*mask);
      } else {
        std::fill(mask->begin(), mask->end(), 0);
      }
      for (int32_t id = 0; id < num_tokens_; ++id) {
        if (is_end(id)) continue;
        const std::string_view piece = piece_(id);
        if (piece.empty()) continue;
        std::string u = state_.text;
        u += piece;
        const size_t f = first_non_space(u);
        bool ok;
        if (f == std::string::npos) {
          ok = u.size() <= kMaxLeadingSpaceBytes;
        } else {
          const std::string_view rest = std::string_view(u).substr(f);
          const std::string_view open = start_.think_open;
          ok = rest.size() <= open.size() ? open.substr(0, rest.size()) == rest
                                          : rest.substr(0, open.size()) == open;
        }
        if (ok) (*mask)[id / 64] |= uint64_t{1} << (id % 64);
      }
      return true;
    }
  }
  return false;
}

bool ConstraintGate::begin_answer(State& s, std::string_view text) {
  s.text.clear();
  s.at_start_decided = false;
  if (!lazy()) {
    s.phase = Phase::kConstrained;
    // Whitespace before the answer is not the grammar's (the output parser drops it).
    const size_t f = first_non_space(text);
    if (f == std::string_view::npos) {
      s.num_space_tokens = 0;
      return true;
    }
    return matcher_.accept_bytes(text.substr(f));
  }
  s.phase = Phase::kFree;
  s.text = text;
  return on_free(s, 0);
}

bool ConstraintGate::on_thinking(State& s, size_t old_size) {
  const std::string& close = start_.think_close;
  const size_t from = old_size >= close.size() ? old_size - close.size() + 1 : 0;
  const size_t p = s.text.find(close, from);
  if (p == std::string::npos) {
    if (s.text.size() >= close.size()) s.text.erase(0, s.text.size() - (close.size() - 1));
    return true;
  }
  const std::string after = s.text.substr(p + close.size());
  return begin_answer(s, after);
}

bool ConstraintGate::on_free(State& s, size_t old_size) {
  size_t fire = std::string::npos;
  if (!s.at_start_decided) {
    const size_t f = first_non_space(s.text);
    if (f != std::string::npos) {
      bool pending = false;
      for (const GrammarStart::Trigger& t : start_.triggers) {
        if (!t.at_start) continue;
        switch (match_trigger(t, std::string_view(s.text).substr(f))) {
          case TriggerMatch::kFull:
            fire = std::min(fire, f);
            break;
          case TriggerMatch::kPartial:
            pending = true;
            break;
          case TriggerMatch::kNo:
            break;
        }
      }
      if (!pending) s.at_start_decided = true;
    }
  }
  for (const GrammarStart::Trigger& t : start_.triggers) {
    if (t.at_start) continue;
    const size_t from = old_size >= t.text.size() ? old_size - t.text.size() + 1 : 0;
    fire = std::min(fire, s.text.find(t.text, from));
  }
  if (fire == std::string::npos) {
    // Keep what a trigger could still complete.
    if (s.at_start_decided && s.text.size() >= max_trigger_bytes_) {
      s.text.erase(0, s.text.size() - (max_trigger_bytes_ > 0 ? max_trigger_bytes_ - 1 : 0));
    }
    return true;
  }
  // The grammar begins with the trigger: it reads the output from the trigger's first byte.
  s.phase = Phase::kConstrained;
  const std::string tail = s.text.substr(fire);
  s.text.clear();
  return matcher_.accept_bytes(tail);
}

bool ConstraintGate::step(State& s, int32_t token, std::string_view piece) {
  switch (s.phase) {
    case Phase::kConstrained:
      if (space_allowed(s) && all_space(piece) && !is_end(token)) {
        ++s.num_space_tokens;
        return true;
      }
      return matcher_.accept_token(token);
    case Phase::kFree: {
      if (is_end(token)) return true;
      const size_t old = s.text.size();
      s.text += piece;
      return on_free(s, old);
    }
    case Phase::kThinking: {
      if (is_end(token)) return lazy();
      const size_t old = s.text.size();
      s.text += piece;
      return on_thinking(s, old);
    }
    case Phase::kUndecided: {
      if (is_end(token)) return lazy();
      s.text += piece;
      const size_t f = first_non_space(s.text);
      if (f == std::string::npos) return s.text.size() <= kMaxLeadingSpaceBytes;
      const std::string_view rest = std::string_view(s.text).substr(f);
      const std::string_view open = start_.think_open;
      if (rest.size() < open.size() && open.substr(0, rest.size()) == rest) return true;
      if (rest.substr(0, open.size()) == open) {
        s.phase = Phase::kThinking;
        s.text = std::string(rest.substr(open.size()));
        return on_thinking(s, 0);
      }
      const std::string answer = std::move(s.text);
      return begin_answer(s, answer);
    }
  }
  return false;
}

bool ConstraintGate::accept(int32_t token) {
  State next = state_;
  const int32_t before = matcher_.num_accepted();
  if (!step(next, token, piece_(token))) {
    matcher_.rollback(matcher_.num_accepted() - before);
    return false;
  }
  state_ = std::move(next);
  mask_ready_ = false;
  return true;
}

void ConstraintGate::prefetch_mask() {
  mask_constrained_ = fill_mask(&mask_);
  mask_ready_ = true;
}

std::optional<SampleResult> ConstraintGate::sample(std::span<const float> logits,
                                                   const DrawFn& draw) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  SampleResult r;
  const bool constrained = mask_ready_ ? mask_constrained_ : fill_mask(&mask_);
  mask_ready_ = false;
  if (constrained) {
    // The sampler applies the mask as it copies the logits: no masked copy here (one of the
    // whole vocabulary per row and step was most of the gate's cost).
    if (!grammar::any_allowed(mask_, logits.size())) return std::nullopt;
    r = draw(logits, mask_);
    if (accept(r.token)) return r;
    // Refused (rare: a token crossing a boundary): the redraws work on a masked copy.
    grammar::mask_logits(logits, mask_, &masked_logits_);
  } else {
    // Free text: the logits as they are, copied only when a token is refused.
    r = draw(logits, {});
    if (accept(r.token)) return r;
    masked_logits_.assign(logits.begin(), logits.end());
  }
  for (int num_refused = 1;; ++num_refused) {
    masked_logits_[r.token] = kNegInf;
    if (num_refused == kMaxRedraws) {
      for (size_t id = 0; id < masked_logits_.size(); ++id) {
        if (masked_logits_[id] != kNegInf && !probe(static_cast<int32_t>(id)))
          masked_logits_[id] = kNegInf;
      }
    }
    if (std::all_of(masked_logits_.begin(), masked_logits_.end(),
                    [&](float x) { return x == kNegInf; }))
      return std::nullopt;
    r = draw(masked_logits_, {});
    if (accept(r.token)) return r;
  }
}

bool ConstraintGate::probe(int32_t token) {
  State next = state_;
  const int32_t before = matcher_.num_accepted();
  const bool ok = step(next, token, piece_(token));
  matcher_.rollback(matcher_.num_accepted() - before);
  return ok;
}

}  // namespace kiln::engine
