// Rope scaling: the frequencies kiln derives from a Hugging Face config (through the GGUF keys
// the converter writes and the loader reads) against transformers' own numbers
// (tests/fixtures/hf/rope_probes.json, recorded by tools/record_goldens.py --rope-probes from
// each config's rotary embedding module); the GGUF rope-scaling keys; and mistral3 as data.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "forward_util.h"
#include "kiln/model/convert/hf_to_gguf.h"
#include "kiln/model/forward.h"
#include "kiln/model/hparams.h"
#include "kiln/model/model.h"
#include "kiln/model/rope.h"

namespace kiln::model {
namespace {

const std::string kFixtures = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/";

nlohmann::json load_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f) << path;
  return nlohmann::json::parse(f);
}

// hp -> GGUF keys -> hp, as a converted file would be read.
HParams round_trip(const HParams& hp) {
  gguf::Writer w;
  write_hparams(w, hp);
  auto bytes = w.to_bytes();
  EXPECT_TRUE(bytes.ok());
  auto file = gguf::File::parse(*bytes);
  EXPECT_TRUE(file.ok()) << file.error().message;
  auto back = read_hparams(**file);
  EXPECT_TRUE(back.ok()) << back.error().message;
  return back.ok() ? *back : HParams{};
}

void expect_freqs_near(const std::vector<double>& got, const nlohmann::json& want,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    // transformers computes in float32: agree to its rounding.
    const double w = want[i].get<double>();
    EXPECT_NEAR(got[i], w, 2e-6 * std::fabs(w)) << what << " pair " << i;
  }
}

TEST(RopeProbes, FrequenciesAndAttentionFactorMatchTransformers) {
  const nlohmann::json probes = load_json(kFixtures + "rope_probes.json");
  ASSERT_GE(probes["probes"].size(), 8u);
  int checked = 0;
  for (const auto& p : probes["probes"]) {
    const std::string name = p["name"];
    nlohmann::json config = p["config"];
    config["architectures"] = {"LlamaForCausalLM"};
    auto hp = hparams_from_hf_config(config);
    if (name == "yarn_no_truncate") {  // no GGUF key for it: refused, formula still checked
      ASSERT_FALSE(hp.ok());
      EXPECT_NE(hp.error().message.find("truncate"), std::string::npos);
      const nlohmann::json& r = config["rope_parameters"];
      YarnParams y;
      y.base = r["rope_theta"].get<float>();
      y.n_rot = config["head_dim"].get<int32_t>();
      y.factor = r["factor"];
      y.orig_ctx = r["original_max_position_embeddings"];
      y.beta_fast = r["beta_fast"];
      y.beta_slow = r["beta_slow"];
      y.truncate = false;
      expect_freqs_near(yarn_inv_freq(y), p["inv_freq"], name);
      EXPECT_NEAR(yarn_mscale(y.factor), p["attention_scaling"].get<double>(), 1e-6);
      ++checked;
      continue;
    }
    ASSERT_TRUE(hp.ok()) << name << ": " << hp.error().message;
    const HParams back = round_trip(*hp);
    std::vector<float> factors;
    if (name == "llama3") factors = llama3_rope_factors(config["rope_parameters"], back);
    const RopeFreqs r = rope_freqs(back, false, factors.empty() ? nullptr : factors.data());
    expect_freqs_near(r.inv_freq, p["inv_freq"], name);
    EXPECT_NEAR(r.attn_factor, p["attention_scaling"].get<double>(), 1e-6) << name;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(probes["probes"].size()));
}

// A GGUF with just the rope keys of `arch` on top of a minimal llama shape.
Expected<HParams> read_keys(const std::function<void(gguf::Writer&)>& keys) {
  HParams hp;
  hp.arch = "llama";
  hp.n_vocab = 32;
  hp.n_ctx_train = 4096;
  hp.n_embd = 64;
  hp.n_layer = 1;
  hp.n_head = hp.n_head_kv = 4;
  hp.n_ff = 128;
  hp.head_dim_k = hp.head_dim_v = hp.n_rot = 16;
  gguf::Writer w;
  write_hparams(w, hp);
  keys(w);
  auto bytes = w.to_bytes();
  if (!bytes.ok()) return std::move(bytes).take_error();
  auto file = gguf::File::parse(*bytes);
  if (!file.ok()) return std::move(file).take_error();
  return read_hparams(**file);
}

TEST(RopeKeys, ReadAsLlamaCppDoes) {
  // No keys: plain rope.
  auto hp = read_keys([](gguf::Writer&) {});
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->rope_scaling, RopeScaling::kNone);
  // A factor without a type is linear (llama.cpp's default type), also from the old key.
  hp = read_keys([](gguf::Writer& w) { w.set_float32("llama.rope.scale_linear", 4.0f); });
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->rope_scaling, RopeScaling::kLinear);
  EXPECT_EQ(hp->rope_scale_factor, 4.0f);
  EXPECT_EQ(rope_freqs(*hp, false, nullptr).inv_freq[3],
            rope_freqs_default(hp->rope_freq_base, 16, nullptr).inv_freq[3] / 4.0);
  hp = read_keys([](gguf::Writer& w) {
    w.set_string("llama.rope.scaling.type", "none");
    w.set_float32("llama.rope.scaling.factor", 4.0f);
  });
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->rope_scaling, RopeScaling::kNone);
  // YaRN: defaults, the context fallback, and mistral3's mscale ratio.
  hp = read_keys([](gguf::Writer& w) {
    w.set_string("llama.rope.scaling.type", "yarn");
    w.set_float32("llama.rope.scaling.factor", 8.0f);
  });
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->rope_scaling, RopeScaling::kYarn);
  EXPECT_EQ(hp->yarn_beta_fast, 32.0f);
  EXPECT_EQ(hp->yarn_beta_slow, 1.0f);
  EXPECT_NEAR(rope_freqs(*hp, false, nullptr).attn_factor, 0.1 * std::log(8.0) + 1.0, 1e-6);
  hp = read_keys([](gguf::Writer& w) {
    w.set_string("llama.rope.scaling.type", "yarn");
    w.set_float32("llama.rope.scaling.factor", 16.0f);
    w.set_float32("llama.rope.scaling.yarn_log_multiplier", 0.5f);
  });
  ASSERT_TRUE(hp.ok());
  EXPECT_NEAR(rope_freqs(*hp, false, nullptr).attn_factor,
              (0.1 * std::log(16.0) + 1.0) / (0.05 * std::log(16.0) + 1.0), 1e-6);
  // An explicit attention factor wins.
  hp = read_keys([](gguf::Writer& w) {
    w.set_string("llama.rope.scaling.type", "yarn");
    w.set_float32("llama.rope.scaling.factor", 16.0f);
    w.set_float32("llama.rope.scaling.yarn_attn_factor", 0.75f);
  });
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(rope_freqs(*hp, false, nullptr).attn_factor, 0.75f);
  // Unsupported or broken: a clear error.
  hp = read_keys([](gguf::Writer& w) {
    w.set_string("llama.rope.scaling.type", "longrope");
    w.set_float32("llama.rope.scaling.factor", 4.0f);
  });
  ASSERT_FALSE(hp.ok());
  EXPECT_NE(hp.error().message.find("longrope"), std::string::npos);
  hp = read_keys([](gguf::Writer& w) { w.set_string("llama.rope.scaling.type", "yarn"); });
  ASSERT_FALSE(hp.ok());
  EXPECT_NE(hp.error().message.find("factor"), std::string::npos);
}

// gemma3's sliding layers keep the plain rope; the full ones are scaled.
TEST(RopeKeys, Gemma3SlidingLayersUnscaled) {
  HParams hp;
  hp.arch = "gemma3";
  hp.n_rot = 16;
  hp.rope_freq_base = 1e6f;
  hp.rope_freq_base_swa = 1e4f;
  hp.rope_scaling = RopeScaling::kLinear;
  hp.rope_scale_factor = 8.0f;
  hp.rope_scaling_swa = false;
  EXPECT_EQ(rope_freqs(hp, true, nullptr).inv_freq, rope_freqs_default(1e4f, 16, nullptr).inv_freq);
  EXPECT_EQ(rope_freqs(hp, false, nullptr).inv_freq[1],
            rope_freqs_default(1e6f, 16, nullptr).inv_freq[1] / 8.0);
}

struct Loaded {
  std::vector<uint8_t> bytes;
  std::unique_ptr<Model> model;
};

Loaded load(const gguf::Writer& w) {
  Loaded l;
  auto bytes = w.to_bytes();
  EXPECT_TRUE(bytes.ok());
  l.bytes = std::move(*bytes);
  auto file = gguf::File::parse(l.bytes);
  EXPECT_TRUE(file.ok());
  auto m = Model::from_file(std::move(*file));
  EXPECT_TRUE(m.ok()) << m.error().message;
  if (m.ok()) l.model = std::move(*m);
  return l;
}

// Every row's logits of one sequence in one step.
std::vector<float> logits_of(const Model& m, const std::vector<int32_t>& seq) {
  const int32_t n = static_cast<int32_t>(seq.size());
  const int32_t n_blocks = (n + kv::kBlockTokens - 1) / kv::kBlockTokens;
  TestForward tf = make_forward(m, n, n_blocks);
  if (!tf.ok()) return {};
  std::vector<int32_t> blocks(n_blocks), positions(n), rows(n);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::iota(positions.begin(), positions.end(), 0);
  std::iota(rows.begin(), rows.end(), 0);
  const int32_t qo[2] = {0, n}, kv_ptr[2] = {0, n_blocks}, kv_len[1] = {n};
  StepInput in;
  in.tokens = seq;
  in.attn = {1, qo, kv_ptr, blocks.data(), kv_len, positions.data()};
  in.logit_rows = rows;
  std::vector<float> out(static_cast<size_t>(n) * m.hparams().n_vocab);
  EXPECT_TRUE(tf.fwd->run(in, *tf.kv, out.data()).ok());
  return out;
}

// The same file relabelled: general.architecture and every "<from>." key prefix.
gguf::Writer relabel(const gguf::File& f, const std::string& from, const std::string& to) {
  gguf::Writer w;
  for (const gguf::KeyValue& kv : f.metadata()) {
    if (kv.key == "general.architecture") {
      w.set_string(kv.key, to);
    } else if (kv.key.starts_with(from + ".")) {
      w.set(to + kv.key.substr(from.size()), kv.value);
    } else {
      w.set(kv.key, kv.value);
    }
  }
  for (const gguf::TensorInfo& t : f.tensors()) {
    std::vector<uint8_t> raw(t.data, t.data + t.size_bytes);
    EXPECT_TRUE(w.add_tensor(t.name, t.type, t.ne, raw).ok());
  }
  return w;
}

// mistral3 is llama's forward with its own metadata: the same tensors under both names give
// the same logits, with yarn keys too; attention.temperature_scale changes the rows past the
// original context and only those.
TEST(Mistral3, SameForwardAsLlama) {
  ConvertOptions o;
  o.hf_dir = kFixtures + "llama";
  o.type = "f32";
  auto w = convert_hf(o);
  ASSERT_TRUE(w.ok()) << w.error().message;
  w->set_string("llama.rope.scaling.type", "yarn");
  w->set_float32("llama.rope.scaling.factor", 4.0f);
  w->set_uint32("llama.rope.scaling.original_context_length", 8);
  w->set_float32("llama.rope.scaling.yarn_log_multiplier", 1.0f);
  Loaded llama = load(*w);
  ASSERT_NE(llama.model, nullptr);
  EXPECT_EQ(llama.model->hparams().rope_scaling, RopeScaling::kYarn);
  Loaded mistral = load(relabel(llama.model->file(), "llama", "mistral3"));
  ASSERT_NE(mistral.model, nullptr);
  EXPECT_EQ(mistral.model->arch().name, "mistral3");
  EXPECT_EQ(mistral.model->hparams().rope_scaling, RopeScaling::kYarn);
  const std::vector<int32_t> seq = {1, 17, 200, 45, 3, 99, 150, 8, 60, 61, 62, 7};
  const std::vector<float> a = logits_of(*llama.model, seq), b = logits_of(*mistral.model, seq);
  EXPECT_EQ(a, b);

  gguf::Writer t = relabel(llama.model->file(), "llama", "mistral3");
  t.set_float32("mistral3.attention.temperature_scale", 0.1f);
  Loaded temp = load(t);
  ASSERT_NE(temp.model, nullptr);
  EXPECT_EQ(temp.model->hparams().attn_temp_scale, 0.1f);
  const std::vector<float> c = logits_of(*temp.model, seq);
  const size_t v = llama.model->hparams().n_vocab;
  // Positions 0..7 are inside the original context (8): q unscaled, same logits.
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 8 * v, c.begin()));
  EXPECT_FALSE(std::equal(a.begin() + 8 * v, a.end(), c.begin() + 8 * v));
}

TEST(Mistral3, MoeFileRefusedNamingTheTensor) {
  ConvertOptions o;
  o.hf_dir = kFixtures + "llama";
  o.type = "f32";
  auto w = convert_hf(o);
  ASSERT_TRUE(w.ok());
  Loaded llama = load(*w);
  ASSERT_NE(llama.model, nullptr);
  gguf::Writer m = relabel(llama.model->file(), "llama", "mistral3");
  std::vector<uint8_t> raw(64 * 4 * 4, 0);
  ASSERT_TRUE(m.add_tensor("blk.0.ffn_gate_inp.weight", quant::Type::F32, {64, 4}, raw).ok());
  auto bytes = m.to_bytes();
  ASSERT_TRUE(bytes.ok());
  auto file = gguf::File::parse(*bytes);
  ASSERT_TRUE(file.ok());
  auto model = Model::from_file(std::move(*file));
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.error().message.find("ffn_gate_inp"), std::string::npos);
}

}  // namespace
}  // namespace kiln::model
