#include "kiln/model/hparams.h"

#include <gtest/gtest.h>

#include <span>
#include <type_traits>
#include <variant>

#include "kiln/gguf/gguf.h"
#include "kiln/gguf/writer.h"
#include "kiln/model/arch/arch.h"
#include "kiln/model/model.h"

namespace kiln::model {
namespace {

HParams small_hparams(std::string arch) {
  HParams hp;
  hp.arch = std::move(arch);
  hp.n_vocab = 64;
  hp.n_ctx_train = 128;
  hp.n_embd = 32;
  hp.n_layer = 2;
  hp.n_head = 4;
  hp.n_head_kv = 2;
  hp.n_ff = 48;
  hp.head_dim_k = hp.head_dim_v = 8;
  hp.n_rot = 8;
  hp.rms_eps = 1e-6f;
  hp.rope_freq_base = 1e6f;
  hp.n_token_types = 2;  // bert's token type table
  if (hp.arch == "qwen3moe" || hp.arch == "qwen35moe" || hp.arch == "qwen3next") {
    hp.n_expert = 4;
    hp.n_expert_used = 2;
    hp.n_ff_expert = 16;
  }
  if (hp.arch == "qwen35" || hp.arch == "qwen35moe" || hp.arch == "qwen3next") {
    // Layer 0 Gated DeltaNet, layer 1 full attention.
    hp.full_attn_interval = 2;
    hp.linear_n_k_heads = 1;
    hp.linear_n_v_heads = 2;
    hp.linear_head_k_dim = hp.linear_head_v_dim = 8;
    hp.linear_conv_kernel = 4;
    if (hp.n_expert > 0) hp.n_ff_shared = 16;
  }
  return hp;
}

// Writes hparams and zero tensors for every required manifest entry (F32).
std::vector<uint8_t> file_for(const HParams& hp, const ArchDef& arch, std::string_view skip = "",
                              std::string_view reshape = "") {
  gguf::Writer w;
  write_hparams(w, hp);
  for (const TensorSpec& spec : tensor_manifest(arch, hp)) {
    if (!spec.required || spec.name == skip) continue;
    std::vector<int64_t> ne = spec.ne;
    if (spec.name == reshape) ne[0] += 1;
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    std::vector<uint8_t> data(static_cast<size_t>(n) * 4);
    EXPECT_TRUE(w.add_tensor(spec.name, quant::Type::F32, ne, data).ok());
  }
  auto bytes = w.to_bytes();
  EXPECT_TRUE(bytes.ok());
  return *bytes;
}

TEST(HParams, RoundTripThroughGguf) {
  for (std::string_view name : arch_names()) {
    HParams hp = small_hparams(std::string(name));
    const ArchDef* arch = find_arch(name);
    ASSERT_NE(arch, nullptr);
    std::vector<uint8_t> bytes = file_for(hp, *arch);
    auto file = gguf::File::parse(bytes);
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto got = read_hparams(**file);
    ASSERT_TRUE(got.ok()) << got.error().message;
    EXPECT_EQ(got->arch, name);
    EXPECT_EQ(got->n_vocab, 64u);
    EXPECT_EQ(got->n_embd, 32u);
    EXPECT_EQ(got->n_layer, 2u);
    EXPECT_EQ(got->n_head_kv, 2u);
    EXPECT_EQ(got->head_dim_k, 8u);
    EXPECT_FLOAT_EQ(got->rms_eps, 1e-6f);
    EXPECT_FLOAT_EQ(got->rope_freq_base, 1e6f);
    EXPECT_TRUE(got->tied_embeddings);  // output.weight is optional, so not written
    EXPECT_EQ(got->n_expert, hp.n_expert);
    Status st = check_manifest(**file, *arch, *got);
    EXPECT_TRUE(st.ok()) << name << ": " << st.error().message;
  }
}

TEST(HParams, ManifestErrorsNameTheTensor) {
  const HParams hp = small_hparams("qwen3");
  const ArchDef& arch = *find_arch("qwen3");
  {
    std::vector<uint8_t> bytes = file_for(hp, arch, "blk.1.attn_k_norm.weight");
    auto file = gguf::File::parse(bytes);
    ASSERT_TRUE(file.ok());
    Status st = check_manifest(**file, arch, *read_hparams(**file));
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().message.find("missing tensor 'blk.1.attn_k_norm.weight'"),
              std::string::npos)
        << st.error().message;
  }
  {
    std::vector<uint8_t> bytes = file_for(hp, arch, "", "blk.0.ffn_up.weight");
    auto file = gguf::File::parse(bytes);
    ASSERT_TRUE(file.ok());
    Status st = check_manifest(**file, arch, *read_hparams(**file));
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().message.find("'blk.0.ffn_up.weight' has shape [33, 48]"),
              std::string::npos)
        << st.error().message;
  }
  {
    // A llama file checked against qwen3's manifest lacks q/k norms.
    std::vector<uint8_t> bytes = file_for(small_hparams("llama"), *find_arch("llama"));
    auto file = gguf::File::parse(bytes);
    ASSERT_TRUE(file.ok());
    Status st = check_manifest(**file, arch, hp);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().message.find("attn_q_norm"), std::string::npos);
  }
}

TEST(HParams, RejectsBadValues) {
  auto read = [](auto mutate) {
    gguf::Writer w;
    HParams hp = small_hparams("llama");
    write_hparams(w, hp);
    mutate(w);
    auto bytes = w.to_bytes();
    auto file = gguf::File::parse(*bytes);
    EXPECT_TRUE(file.ok());
    return read_hparams(**file);
  };
  auto unknown = read([](gguf::Writer& w) { w.set_string("general.architecture", "gpt-j"); });
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("unsupported architecture 'gpt-j'"), std::string::npos);
  auto gqa = read([](gguf::Writer& w) { w.set_uint32("llama.attention.head_count_kv", 3); });
  ASSERT_FALSE(gqa.ok());
  EXPECT_NE(gqa.error().message.find("multiple of head_count_kv"), std::string::npos);
  auto type = read([](gguf::Writer& w) { w.set_string("llama.block_count", "two"); });
  ASSERT_FALSE(type.ok());
  EXPECT_NE(type.error().message.find("llama.block_count"), std::string::npos);
  auto zero = read([](gguf::Writer& w) { w.set_uint32("llama.embedding_length", 0); });
  ASSERT_FALSE(zero.ok());
}

// Every tensor of every architecture's manifest goes into a field of its kind, each field of a
// layer at most once; and the loader puts each tensor of a file into that field: a file whose
// every element of tensor i is i + 1 loads with each field holding its tensor's value.
TEST(Manifest, EveryTensorIsBoundToOneFieldOfItsKind) {
  for (std::string_view name : arch_names()) {
    SCOPED_TRACE(name);
    HParams hp = small_hparams(std::string(name));
    const ArchDef* arch = find_arch(name);
    ASSERT_NE(arch, nullptr);
    const std::vector<TensorSpec> specs = tensor_manifest(*arch, hp);
    std::vector<std::pair<int32_t, WeightField>> seen;  // (layer, field) of the specs so far
    gguf::Writer w;
    write_hparams(w, hp);
    for (size_t i = 0; i < specs.size(); ++i) {
      const TensorSpec& spec = specs[i];
      SCOPED_TRACE(spec.name);
      ASSERT_FALSE(std::holds_alternative<std::monostate>(spec.field));
      const bool is_weight = std::holds_alternative<backend::Weight LayerWeights::*>(spec.field) ||
                             std::holds_alternative<backend::Weight ModelWeights::*>(spec.field);
      EXPECT_EQ(is_weight, spec.kind == TensorKind::kWeight);
      const bool layer_field =
          std::holds_alternative<backend::Weight LayerWeights::*>(spec.field) ||
          std::holds_alternative<const float * LayerWeights::*>(spec.field);
      EXPECT_EQ(layer_field, spec.layer >= 0);
      EXPECT_LT(spec.layer, static_cast<int32_t>(hp.n_layer));
      for (const auto& [layer, field] : seen)
        EXPECT_FALSE(layer == spec.layer && field == spec.field) << "bound twice";
      seen.emplace_back(spec.layer, spec.field);
      int64_t n = 1;
      for (int64_t d : spec.ne) n *= d;
      std::vector<float> data(static_cast<size_t>(n), static_cast<float>(i + 1));
      ASSERT_TRUE(w.add_tensor(spec.name, quant::Type::F32, spec.ne,
                               std::span(reinterpret_cast<const uint8_t*>(data.data()),
                                         data.size() * sizeof(float)))
                      .ok());
    }
    auto bytes = w.to_bytes();
    ASSERT_TRUE(bytes.ok());
    auto file = gguf::File::parse(*bytes);
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto model = Model::from_file(std::move(*file));
    ASSERT_TRUE(model.ok()) << model.error().message;
    const Model& m = **model;
    ASSERT_EQ(m.layer_descs().size(), hp.n_layer);
    for (size_t i = 0; i < specs.size(); ++i) {
      const TensorSpec& spec = specs[i];
      SCOPED_TRACE(spec.name);
      const float want = static_cast<float>(i + 1);
      const LayerWeights* l =
          spec.layer >= 0 ? &m.layers()[static_cast<size_t>(spec.layer)] : nullptr;
      std::visit(
          [&](auto field) {
            using F = decltype(field);
            if constexpr (std::is_same_v<F, backend::Weight LayerWeights::*>) {
              const backend::Weight& wt = l->*field;
              ASSERT_FALSE(wt.empty());
              EXPECT_EQ(wt.n_in, spec.ne[0]);
              EXPECT_EQ(reinterpret_cast<const float*>(wt.data)[0], want);
            } else if constexpr (std::is_same_v<F, backend::Weight ModelWeights::*>) {
              const backend::Weight& wt = m.weights().*field;
              ASSERT_FALSE(wt.empty());
              EXPECT_EQ(reinterpret_cast<const float*>(wt.data)[0], want);
            } else if constexpr (std::is_same_v<F, const float * LayerWeights::*>) {
              ASSERT_NE(l->*field, nullptr);
              EXPECT_EQ((l->*field)[0], want);
            } else if constexpr (std::is_same_v<F, const float * ModelWeights::*>) {
              ASSERT_NE(m.weights().*field, nullptr);
              EXPECT_EQ((m.weights().*field)[0], want);
            }
          },
          spec.field);
    }
  }
}

}  // namespace
}  // namespace kiln::model
