// Stop conditions of a sequence: end-of-generation token ids (EOS, EOT, <|im_end|>...) and stop
// strings matched over the generated text across token boundaries.
//
// StopMatcher semantics (OpenAI's `stop`): the text is emitted up to, not including, the first
// stop string; nothing after it. "First" is the stop string that completes first in the byte
// stream (earliest end), and among those ending at the same byte the longest (earliest start).
// This makes the result independent of how the text is split into chunks: a streaming
// generator stops as soon as any stop string is complete. Text that could still become the
// start of a stop string is held back until it is decided, and the emitted text never ends in
// the middle of a UTF-8 code point (an incomplete sequence is held until it completes).
// Matching is a KMP automaton per stop string: O(bytes * stops) whatever the strings are.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/util/status.h"

namespace kiln::engine {

// The set of token ids that end generation. Small and sorted: a lookup per generated token.
class StopTokens {
 public:
  StopTokens() = default;
  explicit StopTokens(std::vector<int32_t> ids);
  bool contains(int32_t id) const;
  void add(int32_t id);
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  std::vector<int32_t> ids_;  // sorted, unique
};

// Limits of a request's stop strings (OpenAI allows 4; vLLM and llama.cpp more).
inline constexpr size_t kMaxStopStrings = 64;
inline constexpr size_t kMaxStopStringBytes = 1024;

// Rejects empty stop strings, more than kMaxStopStrings, and longer than kMaxStopStringBytes.
Status validate_stops(const std::vector<std::string>& stops);

class StopMatcher {
 public:
  struct Result {
    std::string text;         // safe to emit now
    bool stopped = false;     // a stop string matched; text ends right before it
    int32_t stop_index = -1;  // which one (index into the constructor's list) when stopped
  };

  // stops should pass validate_stops(); empty strings are ignored (they would match everywhere).
  explicit StopMatcher(std::vector<std::string> stops);
  static Expected<StopMatcher> create(std::vector<std::string> stops);

  // Appends newly generated text (bytes, any split). After a stop, further feeds return
  // nothing and report stopped again.
  Result feed(std::string_view new_text);
  // End of generation without a stop: the held-back text (may end in an incomplete UTF-8
  // sequence if the generator produced one). Empty after a stop.
  std::string flush();

  bool stopped() const { return stopped_; }
  const std::vector<std::string>& stops() const { return stops_; }
  // Bytes currently held back (never more than the longest stop string - 1 plus 3 bytes of an
  // incomplete code point).
  size_t num_held_bytes() const { return held_.size(); }

 private:
  struct Pattern {
    size_t index;                // into stops_
    std::vector<uint32_t> fail;  // KMP prefix function of the stop string
    uint32_t state;              // bytes of the stop string matched by the text's suffix
  };
  std::vector<std::string> stops_;
  std::vector<Pattern> patterns_;  // one per non-empty stop string
  std::string held_;               // fed but not yet emitted
  bool stopped_ = false;
  int32_t stop_index_ = -1;
};

// Length of the longest prefix of text[0, n) that does not end inside an incomplete UTF-8
// sequence (a lead byte whose continuation bytes have not all arrived). Invalid bytes count as
// complete (emitted as they are).
size_t utf8_complete_prefix(std::string_view text);

}  // namespace kiln::engine
