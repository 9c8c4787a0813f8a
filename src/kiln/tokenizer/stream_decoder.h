// Streaming detokenizer: fed one token id at a time, returns only complete UTF-8. Bytes of
// a character split across tokens (byte-fallback <0xXX> pieces, multi-token emoji or CJK)
// are held back until the character is complete, so a stream never shows a U+FFFD or half
// a character where the full decode has a real character. Invariant:
//   concat(push(id) for id in ids) + flush() == tokenizer.decode(ids, skip_special)
// Bytes that can never become valid are emitted as U+FFFD as soon as that is certain,
// exactly where decode puts them.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/tokenizer/tokenizer.h"

namespace kiln::tokenizer {

class StreamDecoder {
 public:
  explicit StreamDecoder(Tokenizer tokenizer, bool skip_special = false)
      : tokenizer_(std::move(tokenizer)), skip_special_(skip_special) {}

  // The text that token `id` completes (possibly empty).
  std::string push(int32_t id);
  // Ends the stream: what is held back, with an unfinished sequence as U+FFFD.
  std::string flush();
  // Starts a new stream with the same tokenizer.
  void reset();

  // Bytes held back waiting for the rest of a character (0..3).
  size_t num_pending_bytes() const { return pending_.size(); }

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  bool at_start_ = true;  // nothing emitted yet: SentencePiece drops one leading space
  std::string pending_;
};

}  // namespace kiln::tokenizer
