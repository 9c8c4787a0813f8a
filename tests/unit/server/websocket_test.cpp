// The WebSocket codec (server/websocket.h) against RFC 6455: the handshake's accept key,
// frame lengths at the 125/126 and 65535/65536 boundaries, masking, fragmentation with
// control frames between fragments, every malformed frame answered with its close code,
// bytes fed in any split, and random bytes never crashing the parser.
#include "kiln/server/websocket.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace kiln::server::websocket {
namespace {

using Kind = Message::Kind;

std::string bytes(std::initializer_list<int> list) {
  std::string out;
  for (int b : list) out += static_cast<char>(b);
  return out;
}

// Everything a reader hands out for `input` fed at once, and its failure code (0: none).
struct Parsed {
  std::vector<Message> messages;
  uint16_t failure = 0;
};
Parsed parse(const std::string& input, size_t max_bytes = 1 << 20, size_t piece = 0) {
  FrameReader reader(max_bytes);
  Parsed out;
  auto drain = [&] {
    while (auto m = reader.next()) out.messages.push_back(std::move(*m));
  };
  if (piece == 0) {
    reader.feed(input);
    drain();
  } else {
    for (size_t i = 0; i < input.size(); i += piece) {
      reader.feed(std::string_view(input).substr(i, piece));
      drain();
    }
  }
  if (reader.failure()) out.failure = reader.failure()->close_code;
  return out;
}

constexpr uint32_t kMask = 0x37FA213D;  // RFC 6455 5.7's example masking key

TEST(WebSocket, AcceptKeyOfTheRfcExample) {
  EXPECT_EQ(accept_key("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
}

TEST(WebSocket, RfcExampleFrames) {
  // 5.7: a single-frame masked text message "Hello".
  const std::string masked =
      bytes({0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58});
  EXPECT_EQ(encode_frame(Opcode::kText, "Hello", true, kMask), masked);
  Parsed p = parse(masked);
  ASSERT_EQ(p.messages.size(), 1u);
  EXPECT_EQ(p.messages[0].kind, Kind::kText);
  EXPECT_EQ(p.messages[0].payload, "Hello");
  EXPECT_EQ(p.failure, 0);
  // 5.7: the unmasked form is what a server sends; from a client it is a protocol error.
  const std::string unmasked = bytes({0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f});
  EXPECT_EQ(encode_frame(Opcode::kText, "Hello"), unmasked);
  EXPECT_EQ(parse(unmasked).failure, kCloseProtocolError);
  EXPECT_TRUE(parse(unmasked).messages.empty());
}

TEST(WebSocket, LengthEncodingsAtTheirBoundaries) {
  // 7 bits up to 125, 126 + 16 bits up to 65535, 127 + 64 bits beyond (5.2).
  const std::pair<size_t, size_t> cases[] = {{0, 2},   {1, 2},     {125, 2},    {126, 4},
                                             {127, 4}, {65535, 4}, {65536, 10}, {70000, 10}};
  for (const auto& [n, header] : cases) {
    std::string payload(n, '\0');
    for (size_t i = 0; i < n; ++i) payload[i] = static_cast<char>('a' + i % 26);
    const std::string server = encode_frame(Opcode::kBinary, payload);
    ASSERT_EQ(server.size(), header + n) << n;
    const uint8_t len7 = static_cast<uint8_t>(server[1]);
    EXPECT_EQ(len7, n <= 125 ? n : n <= 65535 ? 126 : 127) << n;
    if (header == 4) {
      EXPECT_EQ((static_cast<uint8_t>(server[2]) << 8) | static_cast<uint8_t>(server[3]), n);
    }
    if (header == 10) {
      uint64_t v = 0;
      for (int i = 0; i < 8; ++i) v = v << 8 | static_cast<uint8_t>(server[2 + i]);
      EXPECT_EQ(v, n);
    }
    // The client form (masked) of the same message parses back to it, whole or byte by byte.
    const std::string client = encode_frame(Opcode::kBinary, payload, true, kMask + n);
    EXPECT_EQ(client.size(), header + 4 + n);
    for (size_t piece : {size_t{0}, size_t{1}, size_t{7}}) {
      if (piece == 1 && n > 1000) continue;
      Parsed p = parse(client, 1 << 20, piece);
      ASSERT_EQ(p.messages.size(), 1u) << n << " piece " << piece;
      EXPECT_EQ(p.messages[0].kind, Kind::kBinary);
      EXPECT_EQ(p.messages[0].payload, payload) << n;
    }
  }
}

TEST(WebSocket, FragmentsJoinAndControlFramesComeBetween) {
  // "Hel" + ping + "lo" + "!" : the ping is handed out first, then the whole message.
  std::string in =
      encode_frame(Opcode::kText, "Hel", false, 1) + encode_frame(Opcode::kPing, "p1", true, 2) +
      encode_frame(Opcode::kContinuation, "lo", false, 3) +
      encode_frame(Opcode::kContinuation, "!", true, 4) + encode_frame(Opcode::kPong, "", true, 5);
  for (size_t piece : {size_t{0}, size_t{1}, size_t{3}}) {
    Parsed p = parse(in, 1 << 20, piece);
    ASSERT_EQ(p.messages.size(), 3u) << piece;
    EXPECT_EQ(p.messages[0].kind, Kind::kPing);
    EXPECT_EQ(p.messages[0].payload, "p1");
    EXPECT_EQ(p.messages[1].kind, Kind::kText);
    EXPECT_EQ(p.messages[1].payload, "Hello!");
    EXPECT_EQ(p.messages[2].kind, Kind::kPong);
    EXPECT_EQ(p.failure, 0);
  }
  // A UTF-8 character split across fragments is valid once joined.
  const std::string e_acute = "\xC3\xA9";
  Parsed split = parse(encode_frame(Opcode::kText, e_acute.substr(0, 1), false, 9) +
                       encode_frame(Opcode::kContinuation, e_acute.substr(1), true, 9));
  ASSERT_EQ(split.messages.size(), 1u);
  EXPECT_EQ(split.messages[0].payload, e_acute);
}

TEST(WebSocket, CloseFrames) {
  Parsed p = parse(encode_frame(Opcode::kClose, close_payload(1000, "bye"), true, 7));
  ASSERT_EQ(p.messages.size(), 1u);
  EXPECT_EQ(p.messages[0].kind, Kind::kClose);
  EXPECT_EQ(p.messages[0].close_code, 1000);
  EXPECT_EQ(p.messages[0].close_reason, "bye");
  Parsed empty = parse(encode_frame(Opcode::kClose, "", true, 7));
  ASSERT_EQ(empty.messages.size(), 1u);
  EXPECT_EQ(empty.messages[0].close_code, kCloseNoStatus);
  // A reason is cut to the 125 bytes of a control frame, at a character boundary.
  std::string long_reason;
  for (int i = 0; i < 100; ++i) long_reason += "\xC3\xA9";  // 200 bytes of 2-byte characters
  const std::string cut = close_payload(1011, long_reason);
  EXPECT_LE(cut.size(), 125u);
  EXPECT_EQ((cut.size() - 2) % 2, 0u);
  Parsed back = parse(encode_frame(Opcode::kClose, cut, true, 7));
  ASSERT_EQ(back.messages.size(), 1u);
  EXPECT_EQ(back.messages[0].close_code, 1011);
}

TEST(WebSocket, MalformedFramesFailWithTheirCloseCode) {
  const std::string m = bytes({0, 0, 0, 0});  // a zero masking key: the payload as is
  struct Case {
    const char* what;
    std::string input;
    uint16_t code;
  };
  const std::vector<Case> cases = {
      {"RSV1 set", bytes({0xC1, 0x80}) + m, kCloseProtocolError},
      {"RSV3 set", bytes({0x91, 0x80}) + m, kCloseProtocolError},
      {"opcode 3", bytes({0x83, 0x80}) + m, kCloseProtocolError},
      {"opcode 0xB", bytes({0x8B, 0x80}) + m, kCloseProtocolError},
      {"unmasked", bytes({0x81, 0x00}), kCloseProtocolError},
      {"ping of 126 bytes", encode_frame(Opcode::kPing, std::string(126, 'x'), true, 1),
       kCloseProtocolError},
      {"fragmented ping", encode_frame(Opcode::kPing, "x", false, 1), kCloseProtocolError},
      {"continuation first", encode_frame(Opcode::kContinuation, "x", true, 1),
       kCloseProtocolError},
      {"text inside a fragmented text",
       encode_frame(Opcode::kText, "a", false, 1) + encode_frame(Opcode::kText, "b", true, 1),
       kCloseProtocolError},
      {"16-bit length for 100 bytes", bytes({0x81, 0xFE, 0x00, 100}) + m + std::string(100, 'x'),
       kCloseProtocolError},
      {"64-bit length for 1000 bytes",
       bytes({0x82, 0xFF, 0, 0, 0, 0, 0, 0, 0x03, 0xE8}) + m + std::string(1000, 'x'),
       kCloseProtocolError},
      {"64-bit length with the top bit", bytes({0x82, 0xFF, 0x80, 0, 0, 0, 0, 0x01, 0, 0}) + m,
       kCloseProtocolError},
      {"close of one byte", bytes({0x88, 0x81}) + m + bytes({0x03}), kCloseProtocolError},
      {"close code 1005", encode_frame(Opcode::kClose, close_payload(1005, ""), true, 1),
       kCloseProtocolError},
      {"close code 999", encode_frame(Opcode::kClose, close_payload(999, ""), true, 1),
       kCloseProtocolError},
      {"close code 2000", encode_frame(Opcode::kClose, close_payload(2000, ""), true, 1),
       kCloseProtocolError},
      {"close reason not UTF-8", encode_frame(Opcode::kClose, bytes({0x03, 0xE8, 0xFF}), true, 1),
       kCloseInvalidPayload},
      {"text not UTF-8", encode_frame(Opcode::kText, "ok\xC0\xAF", true, 1), kCloseInvalidPayload},
      {"text ending inside a character", encode_frame(Opcode::kText, "\xE2\x82", true, 1),
       kCloseInvalidPayload},
  };
  for (const Case& c : cases) {
    for (size_t piece : {size_t{0}, size_t{1}}) {
      Parsed p = parse(c.input, 1 << 20, piece);
      EXPECT_EQ(p.failure, c.code) << c.what << " piece " << piece;
      EXPECT_TRUE(p.messages.empty()) << c.what;
    }
  }
}

TEST(WebSocket, OversizedMessagesFailBeforeTheirPayloadArrives) {
  // The header alone of a 64 KiB frame against a 1 KiB limit: 1009 at once.
  const std::string frame = encode_frame(Opcode::kText, std::string(65536, 'x'), true, 1);
  Parsed header_only = parse(frame.substr(0, 14), 1024);
  EXPECT_EQ(header_only.failure, kCloseMessageTooBig);
  // Exactly at the limit is fine; one byte over, across fragments, is not.
  EXPECT_EQ(parse(encode_frame(Opcode::kText, std::string(1024, 'x'), true, 1), 1024).failure, 0);
  const std::string two = encode_frame(Opcode::kText, std::string(600, 'x'), false, 1) +
                          encode_frame(Opcode::kContinuation, std::string(425, 'x'), true, 1);
  EXPECT_EQ(parse(two, 1024).failure, kCloseMessageTooBig);
  // A length near 2^63 is refused, not buffered or overflowed.
  const std::string huge =
      bytes({0x82, 0xFF, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0});
  EXPECT_EQ(parse(huge, 1 << 20).failure, kCloseMessageTooBig);
}

TEST(WebSocket, NothingAfterAFailure) {
  FrameReader reader(1 << 20);
  reader.feed(bytes({0x81, 0x00}));  // unmasked
  EXPECT_FALSE(reader.next().has_value());
  ASSERT_TRUE(reader.failure().has_value());
  reader.feed(encode_frame(Opcode::kText, "late", true, 1));
  EXPECT_FALSE(reader.next().has_value());
  EXPECT_EQ(reader.num_buffered_bytes(), 0u);
}

TEST(WebSocket, RandomBytesNeverCrash) {
  std::mt19937 rng(1234);
  for (int round = 0; round < 3000; ++round) {
    std::string input(rng() % 64, '\0');
    for (char& c : input) c = static_cast<char>(rng() & 0xFF);
    // Half the rounds start with a valid masked frame header so deeper paths are reached.
    if (round % 2 == 0 && !input.empty()) input[0] = static_cast<char>(0x80 | (rng() % 3));
    if (round % 2 == 0 && input.size() > 1) input[1] = static_cast<char>(0x80 | (rng() % 128));
    Parsed p = parse(input, 256, 1 + rng() % 5);
    for (const Message& m : p.messages)
      if (m.kind == Kind::kPing || m.kind == Kind::kPong) {
        EXPECT_LE(m.payload.size(), 125u);
      }
  }
}

TEST(WebSocket, UpgradeRequests) {
  HttpRequest req;
  req.method = "GET";
  req.headers = {{"upgrade", "WebSocket"},
                 {"connection", "keep-alive, Upgrade"},
                 {"sec-websocket-version", "13"},
                 {"sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="}};
  EXPECT_TRUE(is_upgrade_request(req));
  EXPECT_EQ(upgrade_error(req), std::nullopt);
  HttpRequest v8 = req;
  v8.headers[2].second = "8";
  EXPECT_NE(upgrade_error(v8), std::nullopt);
  HttpRequest short_key = req;
  short_key.headers[3].second = "c2hvcnQ=";  // "short": not 16 bytes
  EXPECT_NE(upgrade_error(short_key), std::nullopt);
  HttpRequest no_connection = req;
  no_connection.headers[1].second = "keep-alive";
  EXPECT_NE(upgrade_error(no_connection), std::nullopt);
  HttpRequest post = req;
  post.method = "POST";
  EXPECT_NE(upgrade_error(post), std::nullopt);
  HttpRequest plain;
  plain.method = "GET";
  EXPECT_FALSE(is_upgrade_request(plain));
}

}  // namespace
}  // namespace kiln::server::websocket
