// libFuzzer target for the WebSocket frame reader (server/websocket.h): arbitrary bytes as a
// client's byte stream, fed in pieces of a size the first input byte picks, against a size
// limit the second byte picks. Whatever the bytes, the reader must not crash or over-read
// (ASan/UBSan), and what it hands out must keep the protocol's promises: a text message is
// UTF-8, a control frame's payload is at most 125 bytes, a data message is within the limit,
// nothing comes after a failure, and a data message encoded again as a client frame parses
// back to itself.
//   make fuzz-websocket FUZZ_SECONDS=60
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/server/websocket.h"
#include "kiln/util/utf8.h"

namespace ws = kiln::server::websocket;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t piece = 1 + data[0] % 64;
  const size_t max_bytes = 1 + size_t{data[1]} * 64;
  const std::string_view input(reinterpret_cast<const char*>(data + 2), size - 2);
  ws::FrameReader reader(max_bytes);
  bool failed = false;
  for (size_t i = 0; i < input.size(); i += piece) {
    reader.feed(input.substr(i, piece));
    while (auto m = reader.next()) {
      if (failed) __builtin_trap();  // nothing after a failure
      using Kind = ws::Message::Kind;
      if (m->kind == Kind::kPing || m->kind == Kind::kPong || m->kind == Kind::kClose) {
        if (m->payload.size() > 125) __builtin_trap();
        continue;
      }
      if (m->payload.size() > max_bytes) __builtin_trap();
      if (m->kind == Kind::kText && !kiln::utf8::is_valid(m->payload)) __builtin_trap();
      const ws::Opcode op = m->kind == Kind::kText ? ws::Opcode::kText : ws::Opcode::kBinary;
      ws::FrameReader again(max_bytes);
      again.feed(ws::encode_frame(op, m->payload, true, 0x5A5A5A5Au));
      auto back = again.next();
      if (!back || back->kind != m->kind || back->payload != m->payload) __builtin_trap();
    }
    failed = failed || reader.failure().has_value();
  }
  return 0;
}
