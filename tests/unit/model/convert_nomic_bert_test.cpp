// `kiln convert` of a Hugging Face NomicBertModel (tests/fixtures/hf/nomic_embed, a tiny
// random nomic-embed-text-v1.5-shaped model saved by tools/record_embedding_goldens.py) against
// its safetensors source: every tensor under llama.cpp's `nomic-bert` name (the table below,
// spelled out from gguf-py's tensor_mapping.py: fc11 is ffn_up, fc12 ffn_gate), shape and
// bytes, and llama.cpp's metadata keys; configs the forward does not compute are refused.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "kiln/gguf/gguf.h"
#include "kiln/model/arch/bert_tensors.h"
#include "kiln/model/convert/hf_to_gguf.h"
#include "kiln/model/convert/safetensors.h"
#include "kiln/model/hparams.h"

namespace kiln::model {
namespace {

namespace fs = std::filesystem;

const fs::path kFixture = fs::path(KILN_SOURCE_DIR) / "tests/fixtures/hf/nomic_embed";

// HF name -> llama.cpp GGUF name.
std::string expected_gguf_name(const std::string& hf) {
  static const std::map<std::string, std::string> kGlobal = {
      {"embeddings.word_embeddings.weight", "token_embd.weight"},
      {"embeddings.token_type_embeddings.weight", "token_types.weight"},
      {"emb_ln.weight", "token_embd_norm.weight"},
      {"emb_ln.bias", "token_embd_norm.bias"},
  };
  if (auto it = kGlobal.find(hf); it != kGlobal.end()) return it->second;
  static const std::pair<const char*, const char*> kLayer[] = {
      {"attn.Wqkv.", "attn_qkv."},      {"attn.out_proj.", "attn_output."},
      {"norm1.", "attn_output_norm."},  {"mlp.fc11.", "ffn_up."},
      {"mlp.fc12.", "ffn_gate."},       {"mlp.fc2.", "ffn_down."},
      {"norm2.", "layer_output_norm."},
  };
  const std::string prefix = "encoder.layers.";
  if (!hf.starts_with(prefix)) return "?";
  const size_t dot = hf.find('.', prefix.size());
  const std::string layer = hf.substr(prefix.size(), dot - prefix.size());
  const std::string rest = hf.substr(dot + 1);
  for (auto [h, g] : kLayer) {
    if (rest.starts_with(h)) return "blk." + layer + "." + g + rest.substr(std::strlen(h));
  }
  return "?";
}

std::unique_ptr<gguf::File> convert(const std::string& dir, const std::string& type,
                                    std::vector<uint8_t>& storage) {
  ConvertOptions o;
  o.hf_dir = dir;
  o.type = type;
  auto w = convert_hf(o);
  EXPECT_TRUE(w.ok()) << w.error().message;
  if (!w.ok()) return nullptr;
  auto bytes = w->to_bytes();
  EXPECT_TRUE(bytes.ok());
  storage = std::move(bytes).value();
  auto f = gguf::File::parse(storage);
  EXPECT_TRUE(f.ok()) << f.error().message;
  return f.ok() ? std::move(f).value() : nullptr;
}

nlohmann::json fixture_config() {
  std::ifstream in(kFixture / "config.json");
  EXPECT_TRUE(in) << "fixture missing: run tools/record_embedding_goldens.py";
  return in ? nlohmann::json::parse(in) : nlohmann::json::object();
}

TEST(ConvertNomicBert, EveryTensorMatchesTheSafetensorsSource) {
  const nlohmann::json config = fixture_config();
  std::vector<uint8_t> storage;
  auto f = convert(kFixture.string(), "f32", storage);
  ASSERT_NE(f, nullptr);
  auto st = SafetensorsFile::open((kFixture / "model.safetensors").string());
  ASSERT_TRUE(st.ok()) << st.error().message;
  size_t num_checked = 0;
  for (const auto& [hf, t] : (*st)->tensors()) {
    const std::string name = expected_gguf_name(hf);
    ASSERT_NE(name, "?") << "unexpected tensor " << hf;
    const gguf::TensorInfo* g = f->find_tensor(name);
    ASSERT_NE(g, nullptr) << name << " (from " << hf << ") is missing";
    EXPECT_EQ(g->type, quant::Type::F32) << name;
    std::vector<int64_t> ne(t.shape.rbegin(), t.shape.rend());  // ggml order
    EXPECT_EQ(g->ne, ne) << name;
    ASSERT_EQ(t.dtype, "F32");
    ASSERT_EQ(g->size_bytes, t.data.size()) << name;
    EXPECT_EQ(std::memcmp(g->data, t.data.data(), t.data.size()), 0) << name << " bytes differ";
    ++num_checked;
  }
  // 4 embedding tensors; per layer Wqkv, out_proj, fc11, fc12, fc2 and two LayerNorms.
  EXPECT_EQ(num_checked, 4u + config["n_layer"].get<size_t>() * 9u);
  EXPECT_EQ(f->tensors().size(), num_checked);  // nothing beyond the source

  auto u = [&](const char* k) -> uint64_t {
    auto v = f->get_uint(k);
    EXPECT_TRUE(v.ok()) << k;
    return v.ok() ? *v : 0;
  };
  auto arch = f->get_string("general.architecture");
  ASSERT_TRUE(arch.ok());
  EXPECT_EQ(*arch, "nomic-bert");
  EXPECT_EQ(u("nomic-bert.context_length"), 2048u);  // n_positions 8192, trained for 2048
  EXPECT_EQ(u("nomic-bert.embedding_length"), config["n_embd"].get<uint64_t>());
  EXPECT_EQ(u("nomic-bert.feed_forward_length"), config["n_inner"].get<uint64_t>());
  EXPECT_EQ(u("nomic-bert.block_count"), config["n_layer"].get<uint64_t>());
  EXPECT_EQ(u("nomic-bert.attention.head_count"), config["n_head"].get<uint64_t>());
  auto base = f->get_float("nomic-bert.rope.freq_base");
  ASSERT_TRUE(base.ok());
  EXPECT_FLOAT_EQ(static_cast<float>(*base), config["rotary_emb_base"].get<float>());
  auto eps = f->get_float("nomic-bert.attention.layer_norm_epsilon");
  ASSERT_TRUE(eps.ok());
  EXPECT_FLOAT_EQ(static_cast<float>(*eps), config["layer_norm_epsilon"].get<float>());
  auto causal = f->get_bool("nomic-bert.attention.causal");
  ASSERT_TRUE(causal.ok());
  EXPECT_FALSE(*causal);
  EXPECT_EQ(u("nomic-bert.pooling_type"), 1u);  // 1_Pooling: pooling_mode_mean_tokens
  EXPECT_EQ(u("tokenizer.ggml.token_type_count"), config["type_vocab_size"].get<uint64_t>());
  EXPECT_FALSE(f->has("tokenizer.ggml.model"));  // the fixture has no tokenizer.json

  // Read back as kiln reads it: rope over the whole head, base and epsilon from the file.
  auto hp = read_hparams(*f);
  ASSERT_TRUE(hp.ok()) << hp.error().message;
  EXPECT_EQ(hp->n_rot, hp->head_dim_k);
  EXPECT_EQ(hp->head_dim_k, config["n_embd"].get<uint32_t>() / config["n_head"].get<uint32_t>());
  EXPECT_EQ(hp->n_ctx_train, 2048u);
  EXPECT_EQ(hp->n_token_types, 2u);
  EXPECT_EQ(hp->pooling, Pooling::kMean);
}

// The manifest kiln loads against agrees with what the converter wrote; the optional biases
// llama.cpp allows (attn_output, ffn_up, ffn_down) are absent.
TEST(ConvertNomicBert, ManifestNamesAndShapesMatchTheFile) {
  const nlohmann::json c = fixture_config();
  std::vector<uint8_t> storage;
  auto f = convert(kFixture.string(), "f16", storage);
  ASSERT_NE(f, nullptr);
  NomicBertDims d{c["vocab_size"].get<uint32_t>(),      c["n_embd"].get<uint32_t>(),
                  c["n_layer"].get<uint32_t>(),         c["n_inner"].get<uint32_t>(),
                  c["type_vocab_size"].get<uint32_t>(), 3 * c["n_embd"].get<uint32_t>()};
  size_t num_required = 0;
  for (const TensorSpec& spec : nomic_bert_manifest(d)) {
    const gguf::TensorInfo* g = f->find_tensor(spec.name);
    if (!spec.required) {
      EXPECT_EQ(g, nullptr) << spec.name;
      EXPECT_TRUE(spec.name.ends_with(".bias")) << spec.name;
      continue;
    }
    ++num_required;
    ASSERT_NE(g, nullptr) << spec.name;
    EXPECT_EQ(g->ne, spec.ne) << spec.name;
    // llama.cpp's f16 choice: 1-D tensors and the token-type table stay F32.
    const bool f32 = spec.ne.size() == 1 || spec.name == "token_types.weight";
    EXPECT_EQ(g->type, f32 ? quant::Type::F32 : quant::Type::F16) << spec.name;
  }
  EXPECT_EQ(num_required, f->tensors().size());
  const gguf::TensorInfo* qkv = f->find_tensor("blk.0.attn_qkv.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->ne, (std::vector<int64_t>{d.n_embd, 3 * int64_t{d.n_embd}}));
}

// nomic-embed ships bert-base-uncased's WordPiece vocabulary (30522 tokens) with an embedding
// table padded to vocab_size 30528: the converter pads the token list to the table with unused
// "[PAD<id>]" tokens (llama.cpp's get_vocab_base). Here: 250 tokens for a table of 256.
TEST(ConvertNomicBert, WordPieceVocabularyPaddedToTheTable) {
  const nlohmann::json config = fixture_config();
  const uint32_t n_vocab = config["vocab_size"].get<uint32_t>();
  const fs::path dir =
      fs::temp_directory_path() / ("kiln_nomic_vocab_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"model.safetensors", "config.json", "modules.json"})
    fs::copy(kFixture / f, dir / f);
  fs::copy(kFixture / "1_Pooling", dir / "1_Pooling");
  nlohmann::json vocab = {{"[PAD]", 0}, {"[UNK]", 1}, {"[CLS]", 2}, {"[SEP]", 3}, {"[MASK]", 4}};
  for (int i = 5; i < 250; ++i)  // words and continuations
    vocab[(i % 2 ? "w" : "##s") + std::to_string(i)] = i;
  nlohmann::json added = nlohmann::json::array();
  for (int i = 0; i < 5; ++i)
    added.push_back(
        {{"id", i},
         {"content", nlohmann::json::array({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"})[i]},
         {"special", true}});
  const nlohmann::json tok = {
      {"added_tokens", added},
      {"normalizer", {{"type", "BertNormalizer"}, {"lowercase", true}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         nlohmann::json::array({{{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}}})}}},
      {"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"vocab", vocab}}},
  };
  std::ofstream(dir / "tokenizer.json") << tok.dump();
  std::vector<uint8_t> storage;
  auto f = convert(dir.string(), "f32", storage);
  fs::remove_all(dir);
  ASSERT_NE(f, nullptr);
  auto model = f->get_string("tokenizer.ggml.model");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(*model, "bert");
  const gguf::Value* tokens = f->find("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens != nullptr && tokens->as_array() != nullptr);
  const auto& items = tokens->as_array()->items;
  ASSERT_EQ(items.size(), n_vocab);  // = token_embd's rows
  auto hp = read_hparams(*f);
  ASSERT_TRUE(hp.ok()) << hp.error().message;
  EXPECT_EQ(hp->n_vocab, n_vocab);
  const gguf::Value* types = f->find("tokenizer.ggml.token_type");
  ASSERT_TRUE(types != nullptr && types->as_array() != nullptr);
  ASSERT_EQ(types->as_array()->items.size(), n_vocab);
  for (uint32_t i = 250; i < n_vocab; ++i) {
    ASSERT_NE(items[i].as_string(), nullptr);
    EXPECT_EQ(*items[i].as_string(), "[PAD" + std::to_string(i) + "]");
    EXPECT_EQ(types->as_array()->items[i].as_int(), 5);  // UNUSED
  }
}

// A config kiln's forward would compute wrongly is refused with the reason, and so is the
// MoE variant.
TEST(ConvertNomicBert, RefusesWhatTheForwardDoesNotCompute) {
  const fs::path dir =
      fs::temp_directory_path() / ("kiln_nomic_convert_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy(kFixture / "model.safetensors", dir / "model.safetensors");
  const nlohmann::json config = fixture_config();
  const std::tuple<const char*, nlohmann::json, const char*> cases[] = {
      {"activation_function", "gelu", "activation_function"},
      {"rotary_emb_fraction", 0.5, "rotary_emb_fraction"},
      {"rotary_emb_interleaved", true, "rotary_emb_interleaved"},
      {"rotary_scaling_factor", 2.0, "rotary_scaling_factor"},
      {"rotary_emb_scale_base", 512, "rotary_emb_scale_base"},
      {"qkv_proj_bias", true, "qkv_proj_bias"},
      {"mlp_fc1_bias", true, "mlp_fc1_bias"},
      {"mlp_fc2_bias", true, "mlp_fc2_bias"},
      {"prenorm", true, "prenorm"},
      {"causal", true, "causal"},
      {"moe_every_n_layers", 2, "nomic-bert-moe"},
      {"n_positions", 2048, "n_positions"},
  };
  for (const auto& [key, value, word] : cases) {
    nlohmann::json c = config;
    c[key] = value;
    std::ofstream(dir / "config.json") << c.dump();
    ConvertOptions o;
    o.hf_dir = dir.string();
    auto w = convert_hf(o);
    ASSERT_FALSE(w.ok()) << key;
    EXPECT_NE(w.error().message.find(word), std::string::npos) << w.error().message;
  }
  // The HF defaults of a key left out are those of NomicBertConfig: biases on.
  nlohmann::json c = config;
  c.erase("qkv_proj_bias");
  std::ofstream(dir / "config.json") << c.dump();
  ConvertOptions o;
  o.hf_dir = dir.string();
  auto w = convert_hf(o);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.error().message.find("qkv_proj_bias"), std::string::npos) << w.error().message;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::model
