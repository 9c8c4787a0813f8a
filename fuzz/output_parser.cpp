// libFuzzer target for the output parsers: arbitrary bytes as a model's output (sampled text
// is arbitrary: a model may write half a tag, broken JSON, stray control-token text), parsed
// in every tool-call format with and without reasoning. Checks the parser's first invariant
// (output_parser.h): the output fed in pieces (sizes drawn from the input) accumulates to
// exactly parse_all() of the whole text; a difference traps, as does anything ASan or UBSan
// sees.
//   make fuzz-output-parser FUZZ_SECONDS=60
// Input: byte 0 picks the format and the reasoning flags, byte 1 seeds the piece sizes, the
// rest is the output text.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/chat/output_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln::chat;
  if (size < 2) return 0;
  static constexpr ToolFormat kFormats[] = {ToolFormat::kNone, ToolFormat::kHermes,
                                            ToolFormat::kLlama3, ToolFormat::kMistral,
                                            ToolFormat::kDeepSeek};
  ParserConfig config;
  config.format = kFormats[data[0] % 5];
  config.reasoning = (data[0] / 5) % 2 == 1;
  config.reasoning_open_at_start = config.reasoning && (data[0] / 10) % 2 == 1;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);

  const ParsedMessage whole = parse_all(config, text);
  OutputParser parser(config);
  ParsedMessage streamed;
  uint32_t rng = data[1] * 2654435761u + 1;
  for (size_t i = 0; i < text.size();) {
    rng = rng * 1664525u + 1013904223u;
    const size_t len = 1 + (rng >> 24) % 13;  // 1-13 bytes: splits tags and UTF-8 sequences
    accumulate(streamed, parser.feed(text.substr(i, len)));
    i += len;
  }
  accumulate(streamed, parser.finish());
  if (!(streamed == whole)) __builtin_trap();
  return 0;
}
