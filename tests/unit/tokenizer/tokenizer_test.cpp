#include "kiln/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

#include "kiln/tokenizer/bpe.h"
#include "kiln/tokenizer/byte_level.h"
#include "kiln/tokenizer/hf_import.h"
#include "kiln/tokenizer/pretokenizer.h"
#include "kiln/tokenizer/stream_decoder.h"
#include "kiln/util/utf8.h"
#include "vocabs.h"

namespace kiln::tokenizer {
namespace {

using testing::npm_tokenizer;
using testing::npm_vocab;

std::vector<int32_t> enc(const Tokenizer& t, std::string_view s, bool add_special = false,
                         bool parse_special = true) {
  auto r = t.encode(s, add_special, parse_special);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? *r : std::vector<int32_t>{};
}

bool contains(const std::vector<int32_t>& v, int32_t id) {
  return std::find(v.begin(), v.end(), id) != v.end();
}

// ---- byte-level alphabet ----

TEST(ByteLevel, Gpt2Alphabet) {
  EXPECT_EQ(byte_to_unicode(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(byte_to_unicode('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(byte_to_unicode(0), 0x100u);
  EXPECT_EQ(byte_to_unicode('!'), static_cast<char32_t>('!'));
  EXPECT_EQ(byte_to_unicode(0xAD), 0x143u);  // the last remapped byte
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(unicode_to_byte(byte_to_unicode(static_cast<uint8_t>(b))), b);
  }
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(byte_level_decode(byte_level_encode(all)), all);
  EXPECT_EQ(byte_level_decode("\xC4\xA0the"), " the");
  EXPECT_EQ(byte_level_decode("\xE4\xBD\xA0"), std::nullopt);  // 你 is not in the alphabet
}

// ---- BPE merge loop ----

TEST(Bpe, LowestPriorityFirstThenLeftmost) {
  // Symbols a b a b with pairs (a,b)->X at priority 1 and (b,a)->Y at priority 0:
  // (b,a) in the middle merges first, leaving a Y b (no further pairs).
  detail::PairTable pairs;
  pairs.add(0, 1, {1.0f, 10});
  pairs.add(1, 0, {0.0f, 11});
  std::vector<detail::Symbol> syms(4);
  const int32_t ids[] = {0, 1, 0, 1};
  for (int i = 0; i < 4; ++i) syms[i] = {ids[i], static_cast<uint32_t>(i), 1, -1, -1};
  detail::merge_symbols(pairs, syms);
  std::vector<int32_t> out;
  for (int32_t k = 0; k >= 0; k = syms[k].next) out.push_back(syms[k].id);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 11, 1}));

  // Equal priorities: the leftmost pair wins, then the new pair (X, a) at priority 2.
  detail::PairTable ties;
  ties.add(0, 0, {1.0f, 5});
  ties.add(5, 0, {2.0f, 6});
  std::vector<detail::Symbol> aaa(3);
  for (int i = 0; i < 3; ++i) aaa[i] = {0, static_cast<uint32_t>(i), 1, -1, -1};
  detail::merge_symbols(ties, aaa);
  EXPECT_EQ(aaa[0].id, 6);
  EXPECT_EQ(aaa[0].next, -1);
  EXPECT_EQ(aaa[0].len, 3u);
}

// ---- pre-tokenizers ----

TEST(PreTokenizer, TranslatesOnigurumaToPcre2) {
  EXPECT_EQ(*oniguruma_to_pcre2("(?i:'s|'t)"), "(?:'[sS]|'[tT])");
  EXPECT_EQ(
      *oniguruma_to_pcre2(R"(\s+$)"),
      R"([\x{9}-\x{d}\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]+(?=\n|\z))");
  EXPECT_EQ(*oniguruma_to_pcre2(R"([^\r\n\p{L}])"), R"([^\r\n\p{L}])");
  EXPECT_FALSE(oniguruma_to_pcre2(R"(\w+)").ok());
  EXPECT_FALSE(oniguruma_to_pcre2("(ab").ok());
  EXPECT_FALSE(oniguruma_to_pcre2("[ab").ok());
}

TEST(PreTokenizer, EveryKnownSpecCompiles) {
  for (const PreTokenizerSpec& spec : known_pre_tokenizers()) {
    auto p = PreTokenizer::create(spec);
    EXPECT_TRUE(p.ok()) << spec.names.front() << ": " << (p.ok() ? "" : p.error().message);
    if (!p.ok()) continue;
    // Splitting never loses or reorders bytes.
    const std::string text = "Hello  world's 12345 \n\n\t  你好 😀 x";
    std::vector<std::string_view> pieces;
    ASSERT_TRUE(p->split(text, pieces).ok());
    std::string joined;
    for (auto s : pieces) joined += s;
    EXPECT_EQ(joined, text) << spec.names.front();
  }
  EXPECT_EQ(find_pre_tokenizer("no-such-pre"), nullptr);
  EXPECT_EQ(find_pre_tokenizer("llama3"), find_pre_tokenizer("llama-bpe"));
}

TEST(PreTokenizer, Llama3SplitsDigitsInThrees) {
  auto p = PreTokenizer::create(*find_pre_tokenizer("llama-bpe"));
  ASSERT_TRUE(p.ok());
  std::vector<std::string_view> pieces;
  ASSERT_TRUE(p->split("I'M 1234567  ok\n\n", pieces).ok());
  EXPECT_EQ(pieces,
            (std::vector<std::string_view>{"I", "'M", " ", "123", "456", "7", " ", " ok", "\n\n"}));
}

TEST(PreTokenizer, LongRunsDoNotExhaustTheMatcher) {
  auto p = PreTokenizer::create(*find_pre_tokenizer("qwen2"));
  ASSERT_TRUE(p.ok());
  const std::string text = std::string(200000, ' ') + "x" + std::string(100000, 'a');
  std::vector<std::string_view> pieces;
  ASSERT_TRUE(p->split(text, pieces).ok());
  // All spaces but the last, then the last space with the letters.
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].size(), 199999u);
  EXPECT_EQ(pieces[1].size(), 100002u);
}

// ---- Tokenizer::create validation ----

VocabData tiny_spm() {
  VocabData v;
  v.model = "llama";
  v.tokens = {"<unk>",
              "<s>",
              "</s>",
              "\xE2\x96\x81",
              "a",
              "b",
              "\xE2\x96\x81"
              "a",
              "ab"};
  v.token_type = {2, 3, 3, 1, 1, 1, 1, 1};
  v.scores = {0, 0, 0, -1, -2, -3, -4, -5};
  v.bos_id = 1;
  v.eos_id = 2;
  return v;
}

TEST(Tokenizer, CreateRejectsBadVocabularies) {
  auto expect_error = [](VocabData v, std::string_view needle) {
    auto t = Tokenizer::create(std::move(v));
    ASSERT_FALSE(t.ok()) << needle;
    EXPECT_NE(t.error().message.find(needle), std::string::npos) << t.error().message;
  };
  VocabData v = tiny_spm();
  v.model = "t5";  // Unigram: not a model kiln tokenizes
  expect_error(v, "'t5'");
  v = tiny_spm();
  v.model = "gpt2";
  v.pre = "made-up-pre";
  v.merges = {"a b"};
  expect_error(v, "unknown pre-tokenizer 'made-up-pre'");
  v = tiny_spm();
  v.bos_id = 99;
  expect_error(v, "bos_token_id = 99");
  v = tiny_spm();
  v.token_type.pop_back();
  expect_error(v, "token_type has 7 entries for 8 tokens");
  v = tiny_spm();
  v.bos_id.reset();
  expect_error(v, "no bos_token_id");
  v = tiny_spm();
  v.tokens.clear();
  expect_error(v, "no tokens");
  v = tiny_spm();
  v.model = "gpt2";
  v.pre = "gpt-2";
  expect_error(v, "no tokenizer.ggml.merges");
}

TEST(Tokenizer, ScoreBasedSentencePiece) {
  auto t = Tokenizer::create(tiny_spm());
  ASSERT_TRUE(t.ok()) << t.error().message;
  // "ab a" -> "▁ab▁a": "▁a" (score -4) beats "ab" (-5): ▁a b ▁a; no unk bytes exist, so
  // "b" stays; 'c' has no token and no byte tokens: unknown.
  EXPECT_EQ(enc(*t, "ab a", true), (std::vector<int32_t>{1, 6, 5, 6}));
  EXPECT_EQ(enc(*t, "c"), (std::vector<int32_t>{3, 0}));
  EXPECT_EQ(t->decode(enc(*t, "ab a", true), true), "ab a");
}

TEST(Tokenizer, RejectsInvalidUtf8WithOffset) {
  const Tokenizer& t = npm_tokenizer("llama3");
  auto r = t.encode("ok\xC3(", false, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("offset 2"), std::string::npos) << r.error().message;
}

// ---- special tokens ----

TEST(Tokenizer, ParseSpecialControlsControlTokensOnly) {
  const Tokenizer& llama3 = npm_tokenizer("llama3");
  const int32_t eot = *llama3.find_token("<|eot_id|>");
  EXPECT_EQ(enc(llama3, "<|eot_id|>", false, true), (std::vector<int32_t>{eot}));
  const auto plain = enc(llama3, "<|eot_id|>", false, false);
  EXPECT_FALSE(contains(plain, eot));
  EXPECT_EQ(llama3.decode(plain), "<|eot_id|>");

  // Qwen's <think> is a user-defined (non-special) added token: always matched, never
  // skipped by skip_special; <|im_start|> is a control token.
  const Tokenizer& qwen = npm_tokenizer("qwen3");
  const int32_t think = *qwen.find_token("<think>");
  const int32_t im_start = *qwen.find_token("<|im_start|>");
  EXPECT_EQ(qwen.token_type(think), TokenType::kUserDefined);
  EXPECT_EQ(qwen.token_type(im_start), TokenType::kControl);
  const auto ids = enc(qwen, "<|im_start|><think>x", false, false);
  EXPECT_TRUE(contains(ids, think));
  EXPECT_FALSE(contains(ids, im_start));
  const auto ids2 = enc(qwen, "<|im_start|><think>x", false, true);
  EXPECT_EQ(ids2.front(), im_start);
  EXPECT_EQ(qwen.decode(ids2, /*skip_special=*/true), "<think>x");
}

TEST(Tokenizer, BosEosFollowTheVocabulary) {
  const Tokenizer& llama2 = npm_tokenizer("llama2");
  EXPECT_TRUE(llama2.add_bos());
  EXPECT_EQ(enc(llama2, "", true), (std::vector<int32_t>{1}));
  EXPECT_EQ(enc(llama2, "", false), (std::vector<int32_t>{}));
  VocabData v = npm_vocab("llama2");
  v.add_eos_token = true;
  auto t = Tokenizer::create(v);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(enc(*t, "hi", true).back(), 2);
  // The lenml Llama-3 tokenizer.json has no TemplateProcessing: HF adds no BOS.
  EXPECT_FALSE(npm_tokenizer("llama3").add_bos());
}

// A llama.cpp GGUF of a SentencePiece model has scores but no merges. The scores the
// importer derives from the merge ranks must give the same ids as the merges do.
TEST(Tokenizer, SentencePieceScoresReproduceMerges) {
  VocabData v = npm_vocab("llama2");
  v.merges.clear();
  auto by_score = Tokenizer::create(v);
  ASSERT_TRUE(by_score.ok()) << by_score.error().message;
  const Tokenizer& by_rank = npm_tokenizer("llama2");
  for (const char* text :
       {"Hello world", "  leading spaces and trailing  ", "The quick brown fox jumps.",
        "antidisestablishmentarianism 1234567", "日本語のテキスト 😀", "a\n\n\tb  c"}) {
    EXPECT_EQ(enc(*by_score, text, true), enc(by_rank, text, true)) << text;
  }
}

// ---- streaming ----

TEST(StreamDecoder, HoldsBackSplitCharacters) {
  const Tokenizer& llama2 = npm_tokenizer("llama2");
  // U+1D54F 𝕏 has no token: byte fallback gives 4 <0xXX> tokens after "▁".
  const auto ids = enc(llama2, "\xF0\x9D\x95\x8F", false);
  ASSERT_EQ(ids.size(), 5u);
  StreamDecoder s(llama2);
  std::vector<std::string> deltas;
  for (int32_t id : ids) deltas.push_back(s.push(id));
  deltas.push_back(s.flush());
  std::string joined;
  for (const auto& d : deltas) {
    EXPECT_TRUE(utf8::is_valid(d));
    EXPECT_EQ(d.find("\xEF\xBF\xBD"), std::string::npos);
    joined += d;
  }
  EXPECT_EQ(joined, "\xF0\x9D\x95\x8F");
  // "▁" (the stripped leading space), then three held-back bytes, the character, flush.
  EXPECT_EQ(deltas, (std::vector<std::string>{"", "", "", "", "\xF0\x9D\x95\x8F", ""}));
}

TEST(StreamDecoder, FlushTurnsUnfinishedBytesIntoReplacement) {
  const Tokenizer& llama2 = npm_tokenizer("llama2");
  const int32_t e4 = *llama2.find_token("<0xE4>");
  const int32_t bd = *llama2.find_token("<0xBD>");
  const int32_t a = *llama2.find_token("a");
  StreamDecoder s(llama2);
  EXPECT_EQ(s.push(e4), "");
  EXPECT_EQ(s.push(bd), "");
  EXPECT_EQ(s.num_pending_bytes(), 2u);
  EXPECT_EQ(s.flush(), "\xEF\xBF\xBD");
  // An unfinished sequence followed by text: U+FFFD as soon as it is certain, like decode.
  s.reset();
  EXPECT_EQ(s.push(e4), "");
  EXPECT_EQ(s.push(a),
            "\xEF\xBF\xBD"
            "a");
  const std::vector<int32_t> ids = {e4, a};
  EXPECT_EQ(llama2.decode(ids),
            "\xEF\xBF\xBD"
            "a");
}

// ---- Hugging Face import ----

std::string tiny_tokenizer_json(const std::string& pre_tokenizer) {
  return R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3},
             "merges": [["a", "b"]], "ignore_merges": false},
           "added_tokens": [{"id": 4, "content": "<|end|>", "special": true},
                            {"id": 5, "content": "<tool>", "special": false}],
           "normalizer": null, "pre_tokenizer": )" +
         pre_tokenizer + R"(, "post_processor": null, "decoder": {"type": "ByteLevel"}})";
}

TEST(HfImport, ConvertsLikeTheConverter) {
  const std::string pre = R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})";
  auto v = import_hf_tokenizer_json(
      tiny_tokenizer_json(pre),
      R"({"eos_token": {"content": "<|end|>"}, "chat_template": "{{ x }}"})", 8);
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->model, "gpt2");
  EXPECT_EQ(v->pre, "gpt-2");
  ASSERT_EQ(v->tokens.size(), 8u);  // padded to config.json's vocab_size
  EXPECT_EQ(v->tokens[6], "[PAD6]");
  EXPECT_EQ(v->token_type[6], static_cast<int32_t>(TokenType::kUnused));
  EXPECT_EQ(v->token_type[4], static_cast<int32_t>(TokenType::kControl));
  EXPECT_EQ(v->token_type[5], static_cast<int32_t>(TokenType::kUserDefined));
  EXPECT_EQ(v->merges, (std::vector<std::string>{"a b"}));
  EXPECT_EQ(v->eos_id, 4);
  EXPECT_EQ(v->add_bos_token, false);
  EXPECT_EQ(v->chat_template, "{{ x }}");
}

TEST(HfImport, UnknownPreTokenizerIsNamed) {
  const std::string pre =
      R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\p{N}{1,7}"},
          "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "use_regex": false}]})";
  auto v = import_hf_tokenizer_json(tiny_tokenizer_json(pre), "{}");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("\\p{N}{1,7}"), std::string::npos) << v.error().message;
  auto bad = import_hf_tokenizer_json("{\"model\": 3}", "{}");
  ASSERT_FALSE(bad.ok());
  auto not_json = import_hf_tokenizer_json("{", "{}");
  ASSERT_FALSE(not_json.ok());
}

TEST(HfImport, RealVocabularies) {
  const VocabData& l3 = npm_vocab("llama3");
  EXPECT_EQ(l3.model, "gpt2");
  EXPECT_EQ(l3.pre, "llama-bpe");
  EXPECT_EQ(l3.tokens.size(), 128256u);
  EXPECT_EQ(l3.tokens[128009], "<|eot_id|>");
  EXPECT_EQ(l3.token_type[128009], static_cast<int32_t>(TokenType::kControl));
  EXPECT_EQ(l3.bos_id, 128000);
  const VocabData& q = npm_vocab("qwen3");
  EXPECT_EQ(q.pre, "qwen2");
  EXPECT_EQ(q.eos_id, 151645);  // <|im_end|>
  EXPECT_FALSE(q.bos_id.has_value());
  EXPECT_FALSE(q.chat_template.empty());
  const VocabData& l2 = npm_vocab("llama2");
  EXPECT_EQ(l2.model, "llama");
  EXPECT_EQ(l2.add_space_prefix, true);
  EXPECT_EQ(l2.token_type[0], static_cast<int32_t>(TokenType::kUnknown));
  EXPECT_EQ(l2.token_type[1], static_cast<int32_t>(TokenType::kControl));
  EXPECT_EQ(l2.token_type[3], static_cast<int32_t>(TokenType::kByte));  // <0x00>
  EXPECT_EQ(l2.scores.size(), l2.tokens.size());
}

}  // namespace
}  // namespace kiln::tokenizer

namespace kiln::tokenizer {
namespace {

// Random valid UTF-8 over all planes: byte-level and byte-fallback vocabularies must
// round-trip every string exactly; random bytes are either rejected at the first invalid
// offset or round-trip.
TEST(Tokenizer, RandomTextRoundTripsAndBadBytesAreRejected) {
  std::mt19937 rng(42);
  auto random_text = [&] {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) {
      char32_t cp = 0;
      switch (rng() % 4) {
        case 0:
          cp = 0x20 + rng() % 0x5F;
          break;
        case 1:
          cp = rng() % 0x800;
          break;
        case 2:
          cp = rng() % 0x10000;
          break;
        default:
          cp = rng() % 0x110000;
          break;
      }
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
      utf8::append(s, cp);
    }
    return s;
  };
  for (const char* name : {"llama3", "llama2"}) {
    const Tokenizer& t = npm_tokenizer(name);
    for (int i = 0; i < 300; ++i) {
      const std::string s = random_text();
      EXPECT_EQ(t.decode(enc(t, s, true), /*skip_special=*/true), s) << name << " case " << i;
    }
    for (int i = 0; i < 300; ++i) {
      std::string bytes(1 + rng() % 16, '\0');
      for (char& c : bytes) c = static_cast<char>(rng());
      auto r = t.encode(bytes, false, true);
      const size_t bad = utf8::find_invalid(bytes);
      if (bad == utf8::kNpos) {
        ASSERT_TRUE(r.ok());
        EXPECT_EQ(t.decode(*r), bytes);
      } else {
        ASSERT_FALSE(r.ok());
        EXPECT_NE(r.error().message.find("offset " + std::to_string(bad)), std::string::npos)
            << r.error().message;
      }
    }
  }
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  const Tokenizer& t = npm_tokenizer("qwen3");
  const std::string text = "Concurrent tokenizers share one word cache. 并发 😀 12345\n";
  const auto expected = enc(t, text);
  std::vector<std::thread> threads;
  std::atomic<int> num_mismatches{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 200; ++i) {
        auto ids = t.encode(text + std::to_string(k * 1000 + i), false, true);
        auto base = t.encode(text, false, true);
        if (!ids.ok() || !base.ok() || *base != expected) ++num_mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(num_mismatches.load(), 0);
}

}  // namespace
}  // namespace kiln::tokenizer
