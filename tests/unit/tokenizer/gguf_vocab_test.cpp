#include "kiln/tokenizer/gguf_vocab.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kiln/tokenizer/stream_decoder.h"
#include "vocabs.h"

namespace kiln::tokenizer {
namespace {

using testing::npm_vocab;
using testing::shared_model;

// stories260K.gguf: a real llama.cpp GGUF with a 512-token SentencePiece vocabulary (scores,
// no merges). The json beside it records llama.cpp's prompt ids and greedy output.
TEST(GgufVocab, Stories260KMatchesLlamaCpp) {
  auto file = gguf::File::open(shared_model("stories260K.gguf").string());
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto vocab = load_vocab(**file);
  ASSERT_TRUE(vocab.ok()) << vocab.error().message;
  EXPECT_EQ(vocab->model, "llama");
  EXPECT_EQ(vocab->tokens.size(), 512u);
  EXPECT_TRUE(vocab->merges.empty());
  EXPECT_EQ(vocab->scores.size(), 512u);
  auto tok = Tokenizer::create(*vocab);
  ASSERT_TRUE(tok.ok()) << tok.error().message;

  std::ifstream f(shared_model("stories260K.greedy64.nodellamacpp.json"));
  std::stringstream ss;
  ss << f.rdbuf();
  const auto golden = nlohmann::json::parse(ss.str());
  auto ids = tok->encode("Once upon a time", /*add_special=*/true, /*parse_special=*/false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, golden["prompt_ids"].get<std::vector<int32_t>>());

  const auto greedy = golden["greedy_ids"].get<std::vector<int32_t>>();
  const std::string text = golden["text"];
  EXPECT_EQ(tok->decode(greedy), text);
  StreamDecoder stream(*tok);
  std::string streamed;
  for (int32_t id : greedy) streamed += stream.push(id);
  streamed += stream.flush();
  EXPECT_EQ(streamed, text);
  // The generated text survives encode then decode.
  auto again = tok->encode(text, /*add_special=*/false, /*parse_special=*/false);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(tok->decode(*again), text);
  // Byte fallback: characters outside the 512 tokens become <0xXX> tokens and decode back.
  auto cjk = tok->encode("Lily 你好 😀", true, false);
  ASSERT_TRUE(cjk.ok());
  EXPECT_EQ(tok->decode(*cjk, /*skip_special=*/true), "Lily 你好 😀");
  int num_byte_tokens = 0;
  for (int32_t id : *cjk) num_byte_tokens += tok->token_type(id) == TokenType::kByte;
  EXPECT_EQ(num_byte_tokens, 10);  // 3 + 3 + 4 UTF-8 bytes
}

TEST(GgufVocab, WriteThenLoadRoundTrips) {
  for (const char* name : {"llama2", "qwen3"}) {
    const VocabData& v = npm_vocab(name);
    gguf::Writer w;
    write_vocab(w, v);
    auto bytes = w.to_bytes();
    ASSERT_TRUE(bytes.ok()) << bytes.error().message;
    auto file = gguf::File::parse(*bytes);
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto back = load_vocab(**file);
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(back->model, v.model) << name;
    EXPECT_EQ(back->pre, v.pre) << name;
    EXPECT_EQ(back->tokens, v.tokens) << name;
    EXPECT_EQ(back->token_type, v.token_type) << name;
    EXPECT_EQ(back->scores, v.scores) << name;
    EXPECT_EQ(back->merges, v.merges) << name;
    EXPECT_EQ(back->bos_id, v.bos_id) << name;
    EXPECT_EQ(back->eos_id, v.eos_id) << name;
    EXPECT_EQ(back->unk_id, v.unk_id) << name;
    EXPECT_EQ(back->pad_id, v.pad_id) << name;
    EXPECT_EQ(back->add_bos_token, v.add_bos_token) << name;
    EXPECT_EQ(back->add_eos_token, v.add_eos_token) << name;
    EXPECT_EQ(back->add_space_prefix, v.add_space_prefix) << name;
    EXPECT_EQ(back->chat_template, v.chat_template) << name;
  }
}

TEST(GgufVocab, MissingOrBadKeysFailNamingThem) {
  gguf::Writer w;
  w.set_string("general.architecture", "llama");
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes.ok());
  auto file = gguf::File::parse(*bytes);
  ASSERT_TRUE(file.ok());
  auto v = load_vocab(**file);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("tokenizer.ggml.model"), std::string::npos) << v.error().message;

  VocabData bad;
  bad.model = "llama";
  bad.tokens = {"<unk>", "<s>", "</s>"};
  bad.scores = {0, 0, 0};
  bad.bos_id = 1;
  gguf::Writer w2;
  write_vocab(w2, bad);
  w2.set_uint32("tokenizer.ggml.eos_token_id", 7);
  auto bytes2 = w2.to_bytes();
  ASSERT_TRUE(bytes2.ok());
  auto file2 = gguf::File::parse(*bytes2);
  ASSERT_TRUE(file2.ok());
  auto v2 = load_vocab(**file2);
  ASSERT_FALSE(v2.ok());
  EXPECT_NE(v2.error().message.find("eos_token_id = 7"), std::string::npos) << v2.error().message;
}

// A WordPiece ("bert") vocabulary in llama.cpp's phantom-space form survives the GGUF round
// trip with its cls/sep/mask ids and kiln's normalizer keys, and tokenizes from the file.
TEST(GgufVocab, BertRoundTripsAndTokenizes) {
  VocabData v;
  v.model = "bert";
  v.pre = "default";
  v.tokens = {"[PAD]",
              "[UNK]",
              "[CLS]",
              "[SEP]",
              "[MASK]",
              "\xE2\x96\x81hello",
              "\xE2\x96\x81world",
              "s",
              "\xE2\x96\x81!",
              "\xE2\x96\x81Hello"};
  v.token_type = {3, 3, 3, 3, 3, 1, 1, 1, 1, 1};
  v.unk_id = 1;
  v.cls_id = 2;
  v.sep_id = 3;
  v.mask_id = 4;
  v.bert_lowercase = false;
  v.bert_strip_accents = true;
  gguf::Writer w;
  write_vocab(w, v);
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes.ok()) << bytes.error().message;
  auto file = gguf::File::parse(*bytes);
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto back = load_vocab(**file);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->tokens, v.tokens);
  EXPECT_EQ(back->cls_id, 2);
  EXPECT_EQ(back->sep_id, 3);
  EXPECT_EQ(back->mask_id, 4);
  EXPECT_EQ(back->bert_lowercase, false);
  EXPECT_EQ(back->bert_strip_accents, true);
  auto tok = Tokenizer::create(*back);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  // Cased: "Hello" keeps its capital; "worlds" is "world" + continuation "s"; "hellox" has
  // no continuation "x", so the whole word is [UNK].
  auto ids = tok->encode("Hello worlds! hellox [MASK]", /*add_special=*/true,
                         /*parse_special=*/true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{2, 9, 6, 7, 8, 1, 4, 3}));
  EXPECT_EQ(tok->decode(*ids), "[CLS] Hello worlds! [UNK] [MASK] [SEP]");
  EXPECT_EQ(tok->decode(*ids, /*skip_special=*/true), "Hello worlds!");

  // Uncased by default: without kiln's keys the text is lowercased and accents stripped.
  v.bert_lowercase.reset();
  v.bert_strip_accents.reset();
  auto uncased = Tokenizer::create(v);
  ASSERT_TRUE(uncased.ok());
  auto ids2 = uncased->encode("HÉLLO", /*add_special=*/false, /*parse_special=*/false);
  ASSERT_TRUE(ids2.ok());
  EXPECT_EQ(*ids2, (std::vector<int32_t>{5}));

  // No [CLS] id and no bos: add_bos has nothing to add, which is an error naming it.
  v.cls_id.reset();
  auto no_cls = Tokenizer::create(v);
  ASSERT_FALSE(no_cls.ok());
  EXPECT_NE(no_cls.error().message.find("bos_token_id"), std::string::npos);
}

}  // namespace
}  // namespace kiln::tokenizer
