#include "kiln/tokenizer/byte_level.h"

#include <array>

#include "kiln/util/utf8.h"

namespace kiln::tokenizer {
namespace {

bool maps_to_itself(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<char32_t, 256> to_unicode{};
  std::array<int16_t, 512> to_byte{};  // every alphabet code point is below U+0144
  Tables() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) to_unicode[b] = maps_to_itself(b) ? b : next++;
    for (int b = 0; b < 256; ++b) to_byte[to_unicode[b]] = static_cast<int16_t>(b);
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_to_unicode(uint8_t b) {
  return tables().to_unicode[b];
}

int unicode_to_byte(char32_t cp) {
  return cp < tables().to_byte.size() ? tables().to_byte[cp] : -1;
}

std::optional<std::string> byte_level_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const utf8::Decoded d = utf8::decode(text, pos);
    if (d.num_bytes == 0) return std::nullopt;
    const int b = unicode_to_byte(d.cp);
    if (b < 0) return std::nullopt;
    out.push_back(static_cast<char>(b));
    pos += static_cast<size_t>(d.num_bytes);
  }
  return out;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8::append(out, byte_to_unicode(static_cast<uint8_t>(c)));
  return out;
}

}  // namespace kiln::tokenizer
