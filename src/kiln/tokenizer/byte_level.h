// GPT-2's byte alphabet (openai/gpt-2 encoder.py bytes_to_unicode): every byte maps to a
// printable code point, so byte-level BPE vocabularies store any byte string as text.
// Printable Latin-1 bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) map to themselves; the other
// 68 bytes map, in byte order, to U+0100, U+0101, ... (so ' ' is 'Ġ' U+0120).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kiln::tokenizer {

char32_t byte_to_unicode(uint8_t b);
// The byte a code point stands for, or -1 when it is not in the alphabet.
int unicode_to_byte(char32_t cp);
// Token text ("Ġthe") -> raw bytes (" the"); nullopt when a character is outside the
// alphabet or the text is not valid UTF-8.
std::optional<std::string> byte_level_decode(std::string_view text);
// Raw bytes -> token text.
std::string byte_level_encode(std::string_view bytes);

}  // namespace kiln::tokenizer
