#include "kiln/tokenizer/stream_decoder.h"

#include "kiln/util/utf8.h"

namespace kiln::tokenizer {

std::string StreamDecoder::push(int32_t id) {
  std::string_view piece = tokenizer_.token_piece(id, skip_special_);
  if (piece.empty()) return {};
  if (at_start_) {
    at_start_ = false;
    // decode() strips one leading space of the whole text; the first byte is that space.
    if (tokenizer_.strips_leading_space() && piece.front() == ' ') piece.remove_prefix(1);
  }
  pending_.append(piece);
  const size_t keep = utf8::incomplete_tail_length(pending_);
  // Everything before the unfinished tail is decided: repair() of it equals what decode()
  // produces for those bytes, because the tail starts a new sequence.
  std::string out = utf8::repair(std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8::repair(pending_);
  pending_.clear();
  return out;
}

void StreamDecoder::reset() {
  pending_.clear();
  at_start_ = true;
}

}  // namespace kiln::tokenizer
