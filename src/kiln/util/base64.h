// Base64 (RFC 4648 section 4, the standard alphabet with '=' padding): the WebSocket
// handshake's Sec-WebSocket-Accept, and opaque tokens the server hands to clients.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kiln::base64 {

std::string encode(std::string_view bytes);

// The bytes, or nullopt when `text` is not canonical padded base64 (a length that is not a
// multiple of 4, a character outside the alphabet, padding anywhere but the end, or
// non-zero bits in the padding).
std::optional<std::string> decode(std::string_view text);

}  // namespace kiln::base64
