#include "kiln/util/base64.h"

#include <array>
#include <cstdint>

namespace kiln::base64 {

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// The 6-bit value of each byte, -1 outside the alphabet.
constexpr std::array<int8_t, 256> kValues = [] {
  std::array<int8_t, 256> v{};
  for (auto& x : v) x = -1;
  for (int i = 0; i < 64; ++i) v[static_cast<uint8_t>(kAlphabet[i])] = static_cast<int8_t>(i);
  return v;
}();

}  // namespace

std::string encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t n = uint32_t{static_cast<uint8_t>(bytes[i])} << 16 |
                       uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8 |
                       uint32_t{static_cast<uint8_t>(bytes[i + 2])};
    out += kAlphabet[n >> 18 & 63];
    out += kAlphabet[n >> 12 & 63];
    out += kAlphabet[n >> 6 & 63];
    out += kAlphabet[n & 63];
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t n = uint32_t{static_cast<uint8_t>(bytes[i])} << 16;
    if (rest == 2) n |= uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8;
    out += kAlphabet[n >> 18 & 63];
    out += kAlphabet[n >> 12 & 63];
    out += rest == 2 ? kAlphabet[n >> 6 & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> decode(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int num_pad = 0;
    if (last) num_pad = (text[i + 3] == '=') + (text[i + 2] == '=' && text[i + 3] == '=');
    uint32_t n = 0;
    for (int k = 0; k < 4; ++k) {
      if (k >= 4 - num_pad) {
        n <<= 6;
        continue;
      }
      const int8_t v = kValues[static_cast<uint8_t>(text[i + k])];
      if (v < 0) return std::nullopt;  // outside the alphabet, or '=' in the middle
      n = n << 6 | static_cast<uint32_t>(v);
    }
    // The bits below the last encoded byte must be zero (one canonical text per input).
    if ((num_pad == 1 && (n & 0xFF) != 0) || (num_pad == 2 && (n & 0xFFFF) != 0))
      return std::nullopt;
    out += static_cast<char>(n >> 16 & 0xFF);
    if (num_pad < 2) out += static_cast<char>(n >> 8 & 0xFF);
    if (num_pad < 1) out += static_cast<char>(n & 0xFF);
  }
  return out;
}

}  // namespace kiln::base64
