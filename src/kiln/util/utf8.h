// UTF-8 helpers (RFC 3629): validation, one-code-point decode/encode, the length of an
// unfinished sequence at the end of a buffer, and lossy repair. Strict: overlong forms,
// surrogates (U+D800..U+DFFF) and values above U+10FFFF are invalid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::utf8 {

inline constexpr char32_t kReplacement = 0xFFFD;
inline constexpr size_t kNpos = std::string_view::npos;

// Number of bytes of the sequence a lead byte starts (1..4), or 0 when `lead` cannot start
// a sequence (a continuation byte, or 0xC0, 0xC1, 0xF5..0xFF).
int sequence_length(uint8_t lead);

struct Decoded {
  char32_t cp = 0;
  // Bytes consumed: 1..4 when valid. When invalid, 0, and `maximal_subpart` says how many
  // bytes form the longest valid prefix starting there (>= 1; what one U+FFFD replaces).
  int num_bytes = 0;
  int maximal_subpart = 0;
};

// Decodes the code point starting at s[pos] (pos < s.size()).
Decoded decode(std::string_view s, size_t pos);

// Appends the UTF-8 form of cp (cp must be a scalar value; others append U+FFFD).
void append(std::string& out, char32_t cp);

// Offset of the first byte that is not part of a valid sequence, or kNpos when s is valid.
size_t find_invalid(std::string_view s);
inline bool is_valid(std::string_view s) {
  return find_invalid(s) == kNpos;
}

// How many bytes at the end of s are a proper prefix of a valid sequence that more bytes
// could complete (0..3). A stream holds these back until the rest arrives.
size_t incomplete_tail_length(std::string_view s);

// s with every invalid sequence replaced by U+FFFD, one per maximal subpart (the WHATWG
// decoder's rule, also Python's errors="replace" and Rust's from_utf8_lossy).
std::string repair(std::string_view s);

// Number of code points in valid UTF-8 s.
size_t count_code_points(std::string_view s);

}  // namespace kiln::utf8
