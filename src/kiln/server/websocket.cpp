#include "kiln/server/websocket.h"

#include <cctype>

#include "kiln/util/base64.h"
#include "kiln/util/sha1.h"
#include "kiln/util/utf8.h"

namespace kiln::server::websocket {

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Whether a comma-separated header value holds `token` (case-insensitive): "keep-alive,
// Upgrade" holds "upgrade".
bool has_token(std::optional<std::string_view> value, std::string_view token) {
  if (!value) return false;
  std::string_view rest = *value;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    if (iequals(trim(rest.substr(0, comma)), token)) return true;
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return false;
}

bool is_control(Opcode op) {
  return static_cast<uint8_t>(op) >= 0x8;
}

// 7.4: the codes a peer may send in a close frame (1012-1014 were registered by IANA later).
bool is_valid_close_code(uint16_t code) {
  return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
         (code >= 3000 && code <= 4999);
}

}  // namespace

std::string accept_key(std::string_view client_key) {
  std::string keyed(client_key);
  keyed += kGuid;
  const Sha1Digest digest = sha1(keyed);
  return base64::encode(
      std::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
}

bool is_upgrade_request(const HttpRequest& req) {
  return has_token(req.header("upgrade"), "websocket");
}

std::optional<std::string> upgrade_error(const HttpRequest& req) {
  if (req.method != "GET") return "a WebSocket handshake is a GET request";
  if (!has_token(req.header("connection"), "upgrade"))
    return "a WebSocket handshake needs 'Connection: Upgrade'";
  auto version = req.header("sec-websocket-version");
  if (!version || trim(*version) != "13")
    return "unsupported Sec-WebSocket-Version: this server speaks version 13 (RFC 6455)";
  auto key = req.header("sec-websocket-key");
  auto decoded = key ? base64::decode(trim(*key)) : std::nullopt;
  if (!decoded || decoded->size() != 16)
    return "a WebSocket handshake needs a Sec-WebSocket-Key of 16 bytes in base64";
  return std::nullopt;
}

std::string encode_frame(Opcode opcode, std::string_view payload, bool fin,
                         std::optional<uint32_t> mask) {
  std::string out;
  out.reserve(payload.size() + 14);
  out += static_cast<char>((fin ? 0x80 : 0x00) | static_cast<uint8_t>(opcode));
  const uint8_t mask_bit = mask ? 0x80 : 0x00;
  const uint64_t n = payload.size();
  if (n <= 125) {
    out += static_cast<char>(mask_bit | n);
  } else if (n <= 0xFFFF) {
    out += static_cast<char>(mask_bit | 126);
    out += static_cast<char>(n >> 8);
    out += static_cast<char>(n & 0xFF);
  } else {
    out += static_cast<char>(mask_bit | 127);
    for (int i = 7; i >= 0; --i) out += static_cast<char>(n >> (8 * i) & 0xFF);
  }
  if (!mask) {
    out += payload;
    return out;
  }
  uint8_t key[4];
  for (int i = 0; i < 4; ++i) key[i] = static_cast<uint8_t>(*mask >> (24 - 8 * i));
  out.append(reinterpret_cast<const char*>(key), 4);
  for (size_t i = 0; i < payload.size(); ++i)
    out += static_cast<char>(static_cast<uint8_t>(payload[i]) ^ key[i % 4]);
  return out;
}

std::string close_payload(uint16_t code, std::string_view reason) {
  std::string out;
  out += static_cast<char>(code >> 8);
  out += static_cast<char>(code & 0xFF);
  // A control frame holds 125 bytes: cut the reason at a character boundary.
  size_t n = std::min<size_t>(reason.size(), 123);
  while (n > 0 && n < reason.size() && (static_cast<uint8_t>(reason[n]) & 0xC0) == 0x80) --n;
  out += reason.substr(0, n);
  return out;
}

void FrameReader::feed(std::string_view bytes) {
  if (failure_) return;
  // Drop what was consumed once it is most of the buffer (amortized O(1) per byte).
  if (pos_ > 0 && pos_ >= buffer_.size() / 2) {
    buffer_.erase(0, pos_);
    pos_ = 0;
  }
  buffer_ += bytes;
}

std::optional<Message> FrameReader::fail(uint16_t code, std::string reason) {
  failure_ = Failure{code, std::move(reason)};
  buffer_.clear();
  pos_ = 0;
  fragments_.clear();
  return std::nullopt;
}

std::optional<Message> FrameReader::next() {
  for (;;) {
    if (failure_) return std::nullopt;
    const std::string_view data = std::string_view(buffer_).substr(pos_);
    if (data.size() < 2) return std::nullopt;
    const uint8_t b0 = static_cast<uint8_t>(data[0]);
    const uint8_t b1 = static_cast<uint8_t>(data[1]);
    const bool fin = b0 & 0x80;
    if (b0 & 0x70) return fail(kCloseProtocolError, "RSV bits set without a negotiated extension");
    const uint8_t op_bits = b0 & 0x0F;
    if (!(op_bits <= 0x2 || (op_bits >= 0x8 && op_bits <= 0xA)))
      return fail(kCloseProtocolError, "unknown opcode");
    const Opcode op = static_cast<Opcode>(op_bits);
    if (!(b1 & 0x80)) return fail(kCloseProtocolError, "a client frame must be masked");
    // The payload length: 7 bits, or 126 + 16 bits, or 127 + 64 bits (5.2), minimal.
    uint64_t length = b1 & 0x7F;
    size_t header = 2;
    if (length == 126) {
      if (data.size() < 4) return std::nullopt;
      length = uint64_t{static_cast<uint8_t>(data[2])} << 8 | static_cast<uint8_t>(data[3]);
      header = 4;
      if (length < 126) return fail(kCloseProtocolError, "a length not minimally encoded");
    } else if (length == 127) {
      if (data.size() < 10) return std::nullopt;
      length = 0;
      for (int i = 0; i < 8; ++i) length = length << 8 | static_cast<uint8_t>(data[2 + i]);
      header = 10;
      if (length >> 63) return fail(kCloseProtocolError, "a 64-bit length with its top bit set");
      if (length <= 0xFFFF) return fail(kCloseProtocolError, "a length not minimally encoded");
    }
    if (is_control(op)) {
      if (!fin) return fail(kCloseProtocolError, "a fragmented control frame");
      if (length > 125) return fail(kCloseProtocolError, "a control frame longer than 125 bytes");
    } else if (op == Opcode::kContinuation) {
      if (!fragmented_) return fail(kCloseProtocolError, "a continuation frame with no message");
    } else if (fragmented_) {
      return fail(kCloseProtocolError, "a new message inside a fragmented one");
    }
    // Refuse an oversized message from its header, before buffering its payload.
    if (!is_control(op) && length > max_message_bytes_ - fragments_.size())
      return fail(kCloseMessageTooBig, "the message exceeds the size limit");
    if (data.size() < header + 4 + length) return std::nullopt;
    uint8_t key[4];
    for (int i = 0; i < 4; ++i) key[i] = static_cast<uint8_t>(data[header + i]);
    std::string payload(data.substr(header + 4, length));
    for (size_t i = 0; i < payload.size(); ++i)
      payload[i] = static_cast<char>(static_cast<uint8_t>(payload[i]) ^ key[i % 4]);
    pos_ += header + 4 + length;

    if (is_control(op)) {
      Message m;
      if (op == Opcode::kPing) {
        m.kind = Message::Kind::kPing;
      } else if (op == Opcode::kPong) {
        m.kind = Message::Kind::kPong;
      } else {
        m.kind = Message::Kind::kClose;
        if (payload.size() == 1) return fail(kCloseProtocolError, "a close frame of one byte");
        if (payload.size() >= 2) {
          m.close_code = static_cast<uint16_t>(static_cast<uint8_t>(payload[0]) << 8 |
                                               static_cast<uint8_t>(payload[1]));
          if (!is_valid_close_code(m.close_code))
            return fail(kCloseProtocolError, "an invalid close code");
          m.close_reason = payload.substr(2);
          if (!utf8::is_valid(m.close_reason))
            return fail(kCloseInvalidPayload, "a close reason that is not UTF-8");
        }
        return m;
      }
      m.payload = std::move(payload);
      return m;
    }
    if (op != Opcode::kContinuation) fragmented_ = op;
    fragments_ += payload;
    if (!fin) continue;
    Message m;
    m.kind = *fragmented_ == Opcode::kText ? Message::Kind::kText : Message::Kind::kBinary;
    m.payload = std::move(fragments_);
    fragments_.clear();
    fragmented_.reset();
    if (m.kind == Message::Kind::kText && !utf8::is_valid(m.payload))
      return fail(kCloseInvalidPayload, "a text message that is not UTF-8");
    return m;
  }
}

}  // namespace kiln::server::websocket
