// Where a request's grammar applies (GenerationRequest::grammar_start): one per constrained
// sequence, fed every sampled token by the engine. Pure logic over token pieces, tested with
// scripted token streams (tests/unit/engine/constraint_gate_test.cpp).
//
// Phases of the output:
//   kUndecided  the template lets the model open a thinking block (think_open at the start of
//               the output, after whitespace) and it has not said yet whether it does
//   kThinking   inside the block: free tokens (a forced grammar masks the end tokens, so the
//               answer cannot be skipped); think_close ends it
//   kFree       a lazy grammar (tool_choice auto) waiting for its trigger: free tokens
//   kConstrained  the grammar's mask, to the end of the output
// A token whose text crosses a boundary (closes the thinking block, completes a trigger) is
// allowed only when the grammar accepts the text that follows the boundary inside that token
// (for a trigger: from the trigger's first byte on, since the grammar begins with it), so the
// constrained part of the output always matches the grammar from its first byte. The engine
// samples, calls accept(), and on false samples again without that token; probe() lets it
// build the exact mask when resampling does not find an allowed token quickly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/engine/api.h"
#include "kiln/engine/sampler.h"
#include "kiln/grammar/matcher.h"

namespace kiln::engine {

class ConstraintGate {
 public:
  enum class Phase : uint8_t { kUndecided, kThinking, kFree, kConstrained };
  // The bytes a token adds to the output (control tokens' text included).
  using PieceFn = std::function<std::string_view(int32_t)>;

  // end_tokens: the ids that end the output (masked while thinking under a forced grammar).
  ConstraintGate(std::shared_ptr<grammar::CompiledGrammar> grammar, GrammarStart start,
                 PieceFn piece, std::vector<int32_t> end_tokens);

  Phase phase() const { return state_.phase; }
  bool lazy() const { return !start_.triggers.empty(); }
  // Fills `mask` (resized to the vocabulary's mask words) with the tokens allowed next; false
  // when every token is allowed (free text), mask untouched.
  bool fill_mask(std::vector<uint64_t>* mask);
  // Computes the next mask ahead of sample() (which then uses it): the engine calls it while
  // the device runs the step whose logits sample() will get, so the mask costs no wall time.
  // Valid until the next accept().
  void prefetch_mask();
  // Advances by a sampled token; false (nothing changed) when the token is not allowed.
  bool accept(int32_t token);
  // Would accept(token) succeed? (Nothing changes.)
  bool probe(int32_t token);
  // Draws the next token and accepts it: `draw` samples from logits (the request's sampler)
  // keeping only the ids of an allowed-id mask (Sampler::sample's `allowed`; empty: all), so
  // the gate never writes a masked copy of the row; a token accept() refuses is removed and
  // drawn again (from a masked copy, with an empty mask), and after kMaxRedraws refusals the
  // logits keep exactly the tokens probe() allows. nullopt (nothing accepted): no token is
  // allowed. `logits` may hold padding ids past the vocabulary (never allowed under a mask).
  static constexpr int kMaxRedraws = 8;
  using DrawFn =
      std::function<SampleResult(std::span<const float> logits, std::span<const uint64_t> allowed)>;
  std::optional<SampleResult> sample(std::span<const float> logits, const DrawFn& draw);
  const grammar::Matcher& matcher() const { return matcher_; }
  int32_t num_vocab_tokens() const { return num_tokens_; }

 private:
  struct State {
    Phase phase = Phase::kFree;
    // kUndecided: the output so far; kThinking: its tail (for think_close across tokens);
    // kFree: the answer so far, or its tail once at-start triggers are decided.
    std::string text;
    bool at_start_decided = false;  // kFree: at-start triggers can no longer fire
    // kConstrained right after think_close: whitespace tokens (kMaxSpaceTokens) may come
    // before the grammar's first byte, as the template writes "</think>\n\n".
    int32_t num_space_tokens = -1;  // -1: not allowed
  };
  // The answer begins with `text` (after the thinking block, or at the start).
  bool begin_answer(State& s, std::string_view text);
  // Thinking text grew from old_size bytes: looks for think_close.
  bool on_thinking(State& s, size_t old_size);
  // Free text grew from old_size bytes: looks for a trigger.
  bool on_free(State& s, size_t old_size);
  bool step(State& s, int32_t token, std::string_view piece);
  bool is_end(int32_t token) const;
  bool space_allowed(const State& s) const;
  // Tokens of whitespace only (computed on first use).
  const std::vector<int32_t>& space_tokens();

  std::shared_ptr<grammar::CompiledGrammar> grammar_;
  GrammarStart start_;
  PieceFn piece_;
  std::vector<int32_t> end_tokens_;
  grammar::Matcher matcher_;
  int32_t num_tokens_ = 0;
  size_t max_trigger_bytes_ = 0;
  State state_;
  std::vector<uint64_t> mask_;        // sample(): scratch, or prefetch_mask()'s mask
  bool mask_ready_ = false;           // mask_ holds the current state's (prefetch_mask)
  bool mask_constrained_ = false;     // ... and fill_mask's answer for it
  std::vector<float> masked_logits_;  // sample(): the redraws' logits
  std::vector<int32_t> space_tokens_;
  bool space_tokens_known_ = false;
};

}  // namespace kiln::engine
