// The WebSocket protocol (RFC 6455) as pure functions and one incremental parser, for the
// transport (http_server.cpp) and its tests: the opening handshake (section 4.2), frames
// (section 5) and the closing handshake's status codes (section 7.4). Only the server side:
// frames from a client must be masked (5.3), frames to it are not. No extension is
// negotiated, so the RSV bits must be zero.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/server/http_server.h"

namespace kiln::server::websocket {

// RFC 6455 1.3: the GUID the accept key hashes with the client's key.
inline constexpr std::string_view kGuid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

enum class Opcode : uint8_t {
  kContinuation = 0x0,
  kText = 0x1,
  kBinary = 0x2,
  kClose = 0x8,
  kPing = 0x9,
  kPong = 0xA,
};

// Status codes of a close frame (7.4.1) that this server sends or expects.
enum CloseCode : uint16_t {
  kCloseNormal = 1000,
  kCloseGoingAway = 1001,  // the server shuts down, or the connection was idle too long
  kCloseProtocolError = 1002,
  kCloseUnsupportedData = 1003,
  kCloseNoStatus = 1005,        // received without a code; never sent
  kCloseInvalidPayload = 1007,  // a text message or close reason that is not UTF-8
  kClosePolicyViolation = 1008,
  kCloseMessageTooBig = 1009,
  kCloseInternalError = 1011,
};

// Sec-WebSocket-Accept for a Sec-WebSocket-Key: base64(SHA-1(key + kGuid)).
std::string accept_key(std::string_view client_key);

// Whether a request asks for the WebSocket protocol (Upgrade: websocket).
bool is_upgrade_request(const HttpRequest& req);

// Why a request that asks for the WebSocket protocol cannot have it (4.2.1: GET, HTTP/1.1
// headers Connection: Upgrade, Sec-WebSocket-Version: 13, a Sec-WebSocket-Key of 16 bytes in
// base64), or nullopt when it can.
std::optional<std::string> upgrade_error(const HttpRequest& req);

// One frame. `mask`: the masking key of a client frame (servers send unmasked frames).
std::string encode_frame(Opcode opcode, std::string_view payload, bool fin = true,
                         std::optional<uint32_t> mask = std::nullopt);
// The payload of a close frame: the code (big-endian) and a UTF-8 reason, cut to fit the
// 125 bytes of a control frame at a character boundary.
std::string close_payload(uint16_t code, std::string_view reason);

// What the parser hands out: a whole data message (fragments joined), or a control frame.
struct Message {
  enum class Kind { kText, kBinary, kPing, kPong, kClose };
  Kind kind = Kind::kText;
  std::string payload;                   // the message, or a ping/pong's application data
  uint16_t close_code = kCloseNoStatus;  // kClose: the peer's status code
  std::string close_reason;              // kClose: its reason
};

// A violation of the protocol: the close code to answer with, and why (for the log and
// the close frame's reason).
struct Failure {
  uint16_t close_code = kCloseProtocolError;
  std::string reason;
};

// Parses the frames a client sends, fed in pieces of any size. Checks every rule of section
// 5 a server must enforce: masking, RSV bits, known opcodes, control frames unfragmented and
// at most 125 bytes, minimal length encodings, fragments in order; a message longer than
// max_message_bytes is refused before its payload is buffered (1009); a text message (and a
// close reason) must be UTF-8 (1007). After a failure it hands out nothing more.
class FrameReader {
 public:
  explicit FrameReader(size_t max_message_bytes) : max_message_bytes_(max_message_bytes) {}

  void feed(std::string_view bytes);
  // The next message or control frame; nullopt when more bytes are needed or after a failure.
  std::optional<Message> next();
  const std::optional<Failure>& failure() const { return failure_; }
  // Bytes fed and not yet consumed (a frame still arriving).
  size_t num_buffered_bytes() const { return buffer_.size() - pos_; }

 private:
  std::optional<Message> fail(uint16_t code, std::string reason);

  size_t max_message_bytes_;
  std::string buffer_;
  size_t pos_ = 0;                    // the start of the next frame in buffer_
  std::optional<Opcode> fragmented_;  // the opcode of the message being reassembled
  std::string fragments_;             // its payload so far
  std::optional<Failure> failure_;
};

}  // namespace kiln::server::websocket
