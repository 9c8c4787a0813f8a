// `kiln convert` of a Hugging Face BertModel (tests/fixtures/hf/bert_embed, a tiny random
// BertModel saved by sentence-transformers) against its safetensors source: every tensor
// under llama.cpp's `bert` name (the table below, spelled out from gguf-py's
// tensor_mapping.py), shape and bytes, and llama.cpp's metadata keys.
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

namespace kiln::model {
namespace {

namespace fs = std::filesystem;

const fs::path kFixture = fs::path(KILN_SOURCE_DIR) / "tests/fixtures/hf/bert_embed";

// HF name -> llama.cpp GGUF name ("" for tensors the converter drops).
std::string expected_gguf_name(const std::string& hf) {
  static const std::map<std::string, std::string> kGlobal = {
      {"embeddings.word_embeddings.weight", "token_embd.weight"},
      {"embeddings.token_type_embeddings.weight", "token_types.weight"},
      {"embeddings.position_embeddings.weight", "position_embd.weight"},
      {"embeddings.LayerNorm.weight", "token_embd_norm.weight"},
      {"embeddings.LayerNorm.bias", "token_embd_norm.bias"},
      {"pooler.dense.weight", ""},
      {"pooler.dense.bias", ""},
  };
  if (auto it = kGlobal.find(hf); it != kGlobal.end()) return it->second;
  static const std::pair<const char*, const char*> kLayer[] = {
      {"attention.self.query.", "attn_q."},
      {"attention.self.key.", "attn_k."},
      {"attention.self.value.", "attn_v."},
      {"attention.output.dense.", "attn_output."},
      {"attention.output.LayerNorm.", "attn_output_norm."},
      {"intermediate.dense.", "ffn_up."},
      {"output.dense.", "ffn_down."},
      {"output.LayerNorm.", "layer_output_norm."},
  };
  const std::string prefix = "encoder.layer.";
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

TEST(ConvertBert, EveryTensorMatchesTheSafetensorsSource) {
  std::vector<uint8_t> storage;
  auto f = convert(kFixture.string(), "f32", storage);
  ASSERT_NE(f, nullptr);
  auto st = SafetensorsFile::open((kFixture / "model.safetensors").string());
  ASSERT_TRUE(st.ok()) << st.error().message;
  size_t num_checked = 0;
  for (const auto& [hf, t] : (*st)->tensors()) {
    const std::string name = expected_gguf_name(hf);
    ASSERT_NE(name, "?") << "unexpected tensor " << hf;
    if (name.empty()) {
      EXPECT_EQ(f->find_tensor(hf), nullptr);
      continue;
    }
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
  EXPECT_EQ(num_checked, 5u + 2u * 16u);
  EXPECT_EQ(f->tensors().size(), num_checked);  // nothing beyond the source

  auto u = [&](const char* k) -> uint64_t {
    auto v = f->get_uint(k);
    EXPECT_TRUE(v.ok()) << k;
    return v.ok() ? *v : 0;
  };
  auto arch = f->get_string("general.architecture");
  ASSERT_TRUE(arch.ok());
  EXPECT_EQ(*arch, "bert");
  EXPECT_EQ(u("bert.context_length"), 512u);
  EXPECT_EQ(u("bert.embedding_length"), 64u);
  EXPECT_EQ(u("bert.feed_forward_length"), 128u);
  EXPECT_EQ(u("bert.block_count"), 2u);
  EXPECT_EQ(u("bert.attention.head_count"), 4u);
  auto eps = f->get_float("bert.attention.layer_norm_epsilon");
  ASSERT_TRUE(eps.ok());
  EXPECT_FLOAT_EQ(static_cast<float>(*eps), 1e-12f);
  auto causal = f->get_bool("bert.attention.causal");
  ASSERT_TRUE(causal.ok());
  EXPECT_FALSE(*causal);
  EXPECT_EQ(u("bert.pooling_type"), 2u);  // 1_Pooling: pooling_mode_cls_token
  EXPECT_EQ(u("tokenizer.ggml.token_type_count"), 2u);
  EXPECT_FALSE(f->has("tokenizer.ggml.model"));  // the fixture has no tokenizer.json
}

// The manifest for the lead's registry agrees with what the converter wrote.
TEST(ConvertBert, ManifestNamesAndShapesMatchTheFile) {
  std::vector<uint8_t> storage;
  auto f = convert(kFixture.string(), "f16", storage);
  ASSERT_NE(f, nullptr);
  BertDims d{256, 64, 2, 128, 512, 2};
  const auto manifest = bert_manifest(d);
  ASSERT_EQ(manifest.size(), f->tensors().size());
  for (const TensorSpec& spec : manifest) {
    const gguf::TensorInfo* g = f->find_tensor(spec.name);
    ASSERT_NE(g, nullptr) << spec.name;
    EXPECT_EQ(g->ne, spec.ne) << spec.name;
    // llama.cpp's f16 choice: 1-D tensors and the token-type / position tables stay F32.
    const bool f32 = spec.ne.size() == 1 || spec.name == "token_types.weight" ||
                     spec.name == "position_embd.weight";
    EXPECT_EQ(g->type, f32 ? quant::Type::F32 : quant::Type::F16) << spec.name;
  }
}

// A config kiln's forward would compute wrongly is refused with the reason.
TEST(ConvertBert, RefusesWhatTheForwardDoesNotCompute) {
  const fs::path dir =
      fs::temp_directory_path() / ("kiln_bert_convert_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy(kFixture / "model.safetensors", dir / "model.safetensors");
  std::ifstream in(kFixture / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  for (auto [key, value, word] :
       {std::tuple{"hidden_act", "relu", "hidden_act"},
        std::tuple{"position_embedding_type", "relative_key", "position_embedding_type"}}) {
    nlohmann::json c = config;
    c[key] = value;
    std::ofstream(dir / "config.json") << c.dump();
    ConvertOptions o;
    o.hf_dir = dir.string();
    auto w = convert_hf(o);
    ASSERT_FALSE(w.ok()) << key;
    EXPECT_NE(w.error().message.find(word), std::string::npos) << w.error().message;
  }
  nlohmann::json c = config;
  c["hidden_size"] = 65;  // shapes no longer match the checkpoint, nor divide by the heads
  std::ofstream(dir / "config.json") << c.dump();
  ConvertOptions o;
  o.hf_dir = dir.string();
  EXPECT_FALSE(convert_hf(o).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::model
