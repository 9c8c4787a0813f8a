#include "kiln/util/utf8.h"

namespace kiln::utf8 {
namespace {

// Valid range of the second byte after a lead byte (RFC 3629 section 4, the table of
// well-formed byte sequences); later continuation bytes are always 0x80..0xBF.
struct Range {
  uint8_t lo, hi;
};
Range second_byte_range(uint8_t lead) {
  switch (lead) {
    case 0xE0:
      return {0xA0, 0xBF};
    case 0xED:
      return {0x80, 0x9F};
    case 0xF0:
      return {0x90, 0xBF};
    case 0xF4:
      return {0x80, 0x8F};
    default:
      return {0x80, 0xBF};
  }
}

bool is_continuation(uint8_t b) {
  return (b & 0xC0) == 0x80;
}

}  // namespace

int sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF5) return 4;
  return 0;
}

Decoded decode(std::string_view s, size_t pos) {
  Decoded d;
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
  const size_t avail = s.size() - pos;
  const uint8_t lead = p[0];
  const int len = sequence_length(lead);
  if (len == 1) {
    d.cp = lead;
    d.num_bytes = 1;
    return d;
  }
  if (len == 0) {
    d.maximal_subpart = 1;
    return d;
  }
  // Count how many bytes after the lead continue a well-formed sequence.
  int good = 1;
  const Range r = second_byte_range(lead);
  if (avail > 1 && p[1] >= r.lo && p[1] <= r.hi) {
    good = 2;
    while (good < len && static_cast<size_t>(good) < avail && is_continuation(p[good])) ++good;
  }
  if (good < len) {
    d.maximal_subpart = good;
    return d;
  }
  char32_t cp = lead & (0x7F >> len);
  for (int i = 1; i < len; ++i) cp = (cp << 6) | (p[i] & 0x3F);
  d.cp = cp;
  d.num_bytes = len;
  return d;
}

void append(std::string& out, char32_t cp) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = kReplacement;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t find_invalid(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (pos + 8 <= s.size()) {
      uint64_t w = 0;
      for (int i = 0; i < 8; ++i) w |= static_cast<uint64_t>(static_cast<uint8_t>(s[pos + i]));
      if (w & 0x80) break;
      pos += 8;
    }
    if (pos >= s.size()) break;
    const Decoded d = decode(s, pos);
    if (d.num_bytes == 0) return pos;
    pos += d.num_bytes;
  }
  return kNpos;
}

size_t incomplete_tail_length(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<uint8_t>(s[n - back]);
    if (is_continuation(b)) continue;
    const int len = sequence_length(b);
    if (len <= static_cast<int>(back)) return 0;  // ASCII, invalid lead, or complete
    const Decoded d = decode(s, n - back);
    // A proper prefix: the whole tail is the maximal subpart of an unfinished sequence.
    return d.num_bytes == 0 && d.maximal_subpart == static_cast<int>(back) ? back : 0;
  }
  return 0;
}

std::string repair(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const Decoded d = decode(s, pos);
    if (d.num_bytes > 0) {
      out.append(s.substr(pos, d.num_bytes));
      pos += d.num_bytes;
    } else {
      append(out, kReplacement);
      pos += d.maximal_subpart;
    }
  }
  return out;
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += !is_continuation(static_cast<uint8_t>(c));
  return n;
}

}  // namespace kiln::utf8
