// kiln-tiny's tokenizer (imported by kiln convert from the tokenizer.json that
// tools/tiny/train_tokenizer.py trained with Hugging Face tokenizers 0.23) gives the ids HF
// gave on the GPU machine (tests/fixtures/kiln_tiny/tokenizer_ids.json), and decodes back.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "kiln/gguf/gguf.h"
#include "kiln/tokenizer/gguf_vocab.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::tokenizer {
namespace {

TEST(KilnTinyTokenizer, IdsEqualHuggingFaceTokenizers) {
  const std::string repo = KILN_SOURCE_DIR;
  auto file = gguf::File::open(repo + "/models/kiln-tiny.gguf");
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto vocab = load_vocab(**file);
  ASSERT_TRUE(vocab.ok()) << vocab.error().message;
  EXPECT_EQ(vocab->pre, "qwen2");
  auto tok = Tokenizer::create(std::move(*vocab));
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ(tok->num_tokens(), 8192);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->find_token("<|im_end|>"), tok->eos_id());

  std::ifstream f(repo + "/tests/fixtures/kiln_tiny/tokenizer_ids.json");
  const nlohmann::json want = nlohmann::json::parse(f, nullptr, false);
  ASSERT_TRUE(want.is_object() && want.size() >= 20);
  for (const auto& [text, ids] : want.items()) {
    // HF's encode: no post-processor here, and added tokens always matched.
    auto got = tok->encode(text, /*add_special=*/true, /*parse_special=*/true);
    ASSERT_TRUE(got.ok()) << got.error().message;
    EXPECT_EQ(*got, ids.get<std::vector<int32_t>>()) << "text '" << text << "'";
  }
  // Byte-level BPE round-trips text that is already NFC.
  const std::string s = "It's John's book; caf\xc3\xa9 \xf0\x9f\x98\x80 12345\n";
  auto ids = tok->encode(s, true, true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(tok->decode(*ids), s);
}

}  // namespace
}  // namespace kiln::tokenizer
