// SHA-1 (FIPS 180-4 section 6.1). Used only where a protocol fixes it: the WebSocket
// handshake (RFC 6455 section 4.2.2) hashes the client's key with a GUID. Not for security.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace kiln {

using Sha1Digest = std::array<uint8_t, 20>;

Sha1Digest sha1(std::string_view bytes);

}  // namespace kiln
