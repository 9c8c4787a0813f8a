#include "kiln/model/convert/hf_to_gguf.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "kiln/model/arch/arch.h"
#include "kiln/model/convert/bert.h"
#include "kiln/model/convert/nomic_bert.h"
#include "kiln/model/convert/qwen35.h"
#include "kiln/model/convert/safetensors.h"
#include "kiln/model/file_type.h"
#include "kiln/model/hparams.h"
#include "kiln/model/rope.h"
#include "kiln/tokenizer/gguf_vocab.h"
#include "kiln/tokenizer/hf_import.h"

namespace kiln::model {
namespace fs = std::filesystem;
namespace {

// HF "architectures" -> GGUF general.architecture.
Expected<std::string> arch_for(const nlohmann::json& config) {
  if (!config.contains("architectures") || !config["architectures"].is_array() ||
      config["architectures"].empty())
    return err("convert: config.json has no 'architectures'");
  const std::string a = config["architectures"][0].get<std::string>();
  if (a == "LlamaForCausalLM" || a == "MistralForCausalLM") return std::string("llama");
  if (a == "Qwen2ForCausalLM") return std::string("qwen2");
  // Qwen3Model: the base model as Qwen3-Embedding checkpoints save it (no lm_head, names
  // without the "model." prefix).
  if (a == "Qwen3ForCausalLM" || a == "Qwen3Model") return std::string("qwen3");
  if (a == "Qwen3MoeForCausalLM") return std::string("qwen3moe");
  if (a == "Gemma2ForCausalLM") return std::string("gemma2");
  if (a == "Gemma3ForCausalLM") return std::string("gemma3");
  if (a == "Phi3ForCausalLM") return std::string("phi3");
  return err("convert: unsupported architecture '{}'", a);
}

// sliding_window and, from layer_types, which layers slide: every one (Mistral) or all but
// every n-th (Gemma), written as attention.sliding_window_pattern n.
Status sliding_window_from_config(const nlohmann::json& c, HParams& hp) {
  if (!c.contains("sliding_window") || !c["sliding_window"].is_number()) return {};
  if (c.contains("use_sliding_window") && c["use_sliding_window"].is_boolean() &&
      !c["use_sliding_window"].get<bool>())
    return {};
  hp.sliding_window = c["sliding_window"].get<uint32_t>();
  hp.swa_pattern = 0;
  if (!c.contains("layer_types") || !c["layer_types"].is_array()) return {};
  const auto& types = c["layer_types"];
  uint32_t pattern = 0;
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] == "full_attention") {
      pattern = static_cast<uint32_t>(i + 1);
      break;
    }
  }
  if (pattern == 0) return {};
  hp.swa_pattern = pattern;
  for (uint32_t i = 0; i < types.size(); ++i) {
    if ((types[i] == "sliding_attention") != hp.swa_layer(i))
      return err("convert: layer_types does not follow a sliding pattern of {}", pattern);
  }
  return {};
}

template <typename T>
T cfg(const nlohmann::json& c, const char* key, T fallback) {
  if (c.contains(key) && !c[key].is_null()) return c[key].get<T>();
  return fallback;
}

// Rope scaling as transformers reads it (modeling_rope_utils), written as llama.cpp's
// rope.scaling.* keys. gemma3 (transformers >= 5) nests it per layer type: the full-attention
// layers' entry holds the scaling, the sliding layers keep the plain rope.
Status rope_scaling_from_config(const nlohmann::json& rope_all, HParams& hp) {
  const nlohmann::json& rope =
      rope_all.contains("full_attention") ? rope_all["full_attention"] : rope_all;
  const std::string type = hf_rope_type(rope);
  if (type == "default" || type == "llama3") return {};  // llama3: rope_freqs.weight
  if (type != "linear" && type != "yarn")
    return err("convert: rope type '{}' is not supported (kiln: default, linear, yarn, llama3)",
               type);
  const double factor = cfg<double>(rope, "factor", 0.0);
  if (!(factor > 0.0)) return err("convert: rope type '{}' needs a factor > 0", type);
  hp.rope_scale_factor = static_cast<float>(factor);
  if (type == "linear") {
    hp.rope_scaling = RopeScaling::kLinear;
    return {};
  }
  hp.rope_scaling = RopeScaling::kYarn;
  if (!cfg<bool>(rope, "truncate", true))
    return err("convert: yarn with truncate = false has no GGUF key; kiln cannot convert it");
  hp.rope_orig_ctx = cfg<uint32_t>(rope, "original_max_position_embeddings", hp.n_ctx_train);
  hp.yarn_beta_fast = cfg<float>(rope, "beta_fast", 32.0f);
  hp.yarn_beta_slow = cfg<float>(rope, "beta_slow", 1.0f);
  // transformers' attention factor: given, or the ratio of two mscales (DeepSeek-style), or
  // 0.1 ln(factor) + 1 (left for the loader to derive).
  const double mscale = cfg<double>(rope, "mscale", 0.0);
  const double mscale_all_dim = cfg<double>(rope, "mscale_all_dim", 0.0);
  if (rope.contains("attention_factor") && rope["attention_factor"].is_number()) {
    hp.rope_attn_factor = rope["attention_factor"].get<float>();
  } else if (mscale != 0.0 && mscale_all_dim != 0.0) {
    hp.rope_attn_factor =
        static_cast<float>(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim));
  }
  return {};
}

}  // namespace

Expected<Pooling> pooling_from_sentence_transformers(const std::string& dir_name) {
  const fs::path dir(dir_name);
  std::ifstream mf(dir / "modules.json");
  if (!mf) return Pooling::kNone;
  const nlohmann::json modules = nlohmann::json::parse(mf, nullptr, false);
  if (!modules.is_array()) return err("convert: modules.json is not a JSON array");
  for (const nlohmann::json& m : modules) {
    if (!m.is_object() || cfg<std::string>(m, "type", "") != "sentence_transformers.models.Pooling")
      continue;
    const fs::path path = dir / cfg<std::string>(m, "path", "") / "config.json";
    std::ifstream pf(path);
    if (!pf) return err("convert: cannot read '{}'", path.string());
    const nlohmann::json pc = nlohmann::json::parse(pf, nullptr, false);
    if (!pc.is_object()) return err("convert: '{}' is not a JSON object", path.string());
    if (cfg<bool>(pc, "pooling_mode_mean_tokens", false)) return Pooling::kMean;
    if (cfg<bool>(pc, "pooling_mode_cls_token", false)) return Pooling::kCls;
    if (cfg<bool>(pc, "pooling_mode_lasttoken", false)) return Pooling::kLast;
    return err("convert: '{}' asks for a pooling kiln does not have (mean, cls, lasttoken)",
               path.string());
  }
  return Pooling::kNone;
}

nlohmann::json hf_rope_settings(const nlohmann::json& c) {
  if (c.contains("rope_parameters") && c["rope_parameters"].is_object())
    return c["rope_parameters"];
  if (c.contains("rope_scaling") && c["rope_scaling"].is_object()) return c["rope_scaling"];
  return nlohmann::json::object();
}

std::string hf_rope_type(const nlohmann::json& rope) {
  for (const char* k : {"rope_type", "type"})
    if (rope.contains(k) && rope[k].is_string()) return rope[k].get<std::string>();
  return "default";
}

Expected<HParams> hparams_from_hf_config(const nlohmann::json& c) {
  if (is_qwen35_config(c)) return qwen35_hparams(c);
  HParams hp;
  KILN_TRY(hp.arch, arch_for(c));
  hp.n_vocab = cfg<uint32_t>(c, "vocab_size", 0);
  hp.n_ctx_train = cfg<uint32_t>(c, "max_position_embeddings", 2048);
  hp.n_embd = cfg<uint32_t>(c, "hidden_size", 0);
  hp.n_layer = cfg<uint32_t>(c, "num_hidden_layers", 0);
  hp.n_head = cfg<uint32_t>(c, "num_attention_heads", 0);
  hp.n_head_kv = cfg<uint32_t>(c, "num_key_value_heads", hp.n_head);
  hp.n_ff = cfg<uint32_t>(c, "intermediate_size", 0);
  if (hp.n_head == 0) return err("convert: num_attention_heads missing");
  hp.head_dim_k = hp.head_dim_v = cfg<uint32_t>(c, "head_dim", hp.n_embd / hp.n_head);
  hp.n_rot = hp.head_dim_k;
  hp.n_expert = cfg<uint32_t>(c, "num_experts", cfg<uint32_t>(c, "num_local_experts", 0));
  hp.n_expert_used = cfg<uint32_t>(c, "num_experts_per_tok", 0);
  hp.n_ff_expert = cfg<uint32_t>(c, "moe_intermediate_size", hp.n_ff);
  hp.rms_eps = cfg<float>(c, "rms_norm_eps", 1e-6f);
  // transformers >= 5 nests rope settings in rope_parameters; older configs use rope_theta
  // and rope_scaling.
  const nlohmann::json rope = hf_rope_settings(c);
  hp.rope_freq_base = cfg<float>(c, "rope_theta", cfg<float>(rope, "rope_theta", 10000.0f));
  // Per-layer-type rope (gemma3 in transformers >= 5): full and sliding bases.
  if (rope.contains("full_attention"))
    hp.rope_freq_base = cfg<float>(rope["full_attention"], "rope_theta", hp.rope_freq_base);
  hp.rope_freq_base_swa = cfg<float>(c, "rope_local_base_freq", hp.rope_freq_base);
  if (rope.contains("sliding_attention"))
    hp.rope_freq_base_swa =
        cfg<float>(rope["sliding_attention"], "rope_theta", hp.rope_freq_base_swa);
  KILN_TRY_STATUS(sliding_window_from_config(c, hp));
  if (c.contains("query_pre_attn_scalar") && c["query_pre_attn_scalar"].is_number())
    hp.attn_scale = 1.0f / std::sqrt(c["query_pre_attn_scalar"].get<float>());
  hp.attn_softcap = cfg<float>(c, "attn_logit_softcapping", 0.0f);
  hp.final_softcap = cfg<float>(c, "final_logit_softcapping", 0.0f);
  hp.tied_embeddings = cfg<bool>(c, "tie_word_embeddings", false);
  KILN_TRY_STATUS(rope_scaling_from_config(rope, hp));
  return hp;
}

// llama3 rope scaling as per-dimension frequency divisors (rope_freqs.weight, [n_rot / 2]),
// the form llama.cpp's converter writes: wavelengths shorter than the high-frequency bound
// keep their frequency, longer than the low-frequency bound are divided by `factor`, and the
// band between is interpolated.
std::vector<float> llama3_rope_factors(const nlohmann::json& rope, const HParams& hp) {
  const double factor = cfg<double>(rope, "factor", 8.0);
  const double low = cfg<double>(rope, "low_freq_factor", 1.0);
  const double high = cfg<double>(rope, "high_freq_factor", 4.0);
  const double old_ctx = cfg<double>(rope, "original_max_position_embeddings", 8192.0);
  const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
  std::vector<float> out(hp.n_rot / 2);
  for (uint32_t i = 0; i < hp.n_rot / 2; ++i) {
    const double freq = std::pow(static_cast<double>(hp.rope_freq_base), -2.0 * i / hp.n_rot);
    const double wavelen = 2.0 * M_PI / freq;
    double f = 1.0;
    if (wavelen > low_wavelen) {
      f = factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (old_ctx / wavelen - low) / (high - low);
      f = 1.0 / ((1.0 - smooth) / factor + smooth);
    }
    out[i] = static_cast<float>(f);
  }
  return out;
}

namespace {

// The HF name of a GGUF tensor of the llama family ("" when it is built another way).
std::string hf_name(const std::string& gguf, const ArchFeatures& f) {
  static const std::pair<const char*, const char*> kGlobal[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  for (auto [g, h] : kGlobal)
    if (gguf == g) return h;
  static const std::pair<const char*, const char*> kLayer[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
      {"ffn_gate_inp.weight", "mlp.gate.weight"},
  };
  // Gemma's four norms per layer; phi3's fused projections.
  static const std::pair<const char*, const char*> kSandwich[] = {
      {"post_attention_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
      {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
  };
  static const std::pair<const char*, const char*> kFused[] = {
      {"attn_qkv.weight", "self_attn.qkv_proj.weight"},
      {"ffn_up.weight", "mlp.gate_up_proj.weight"},
  };
  if (!gguf.starts_with("blk.")) return "";
  const size_t dot = gguf.find('.', 4);
  const std::string layer = gguf.substr(4, dot - 4), suffix = gguf.substr(dot + 1);
  if (f.sandwich_norm)
    for (auto [g, h] : kSandwich)
      if (suffix == g) return "model.layers." + layer + "." + h;
  if (f.fused_qkv || f.fused_gate_up)
    for (auto [g, h] : kFused)
      if (suffix == g) return "model.layers." + layer + "." + h;
  for (auto [g, h] : kLayer)
    if (suffix == g) return "model.layers." + layer + "." + h;
  return "";
}

// Experts: HF stores mlp.experts.<e>.<proj>.weight; GGUF stacks them as [in, out, n_expert].
Expected<std::vector<float>> read_experts(const Checkpoint& ck, const std::string& gguf,
                                          uint32_t n_expert) {
  const size_t dot = gguf.find('.', 4);
  const std::string layer = gguf.substr(4, dot - 4);
  const std::string proj = gguf.find("gate_exps") != std::string::npos ? "gate_proj"
                           : gguf.find("up_exps") != std::string::npos ? "up_proj"
                                                                       : "down_proj";
  std::vector<float> out;
  for (uint32_t e = 0; e < n_expert; ++e) {
    KILN_TRY(std::vector<float> w,
             ck.read(fmt::format("model.layers.{}.mlp.experts.{}.{}.weight", layer, e, proj)));
    out.insert(out.end(), w.begin(), w.end());
  }
  return out;
}

}  // namespace

std::vector<float> permute_qk_rows(const std::vector<float>& w, int64_t n_head, int64_t n_in) {
  const int64_t rows = static_cast<int64_t>(w.size()) / n_in;
  const int64_t head_dim = rows / n_head, half = head_dim / 2;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t i = 0; i < half; ++i) {
        const int64_t src = h * head_dim + j * half + i;
        const int64_t dst = h * head_dim + 2 * i + j;
        std::copy_n(w.begin() + src * n_in, n_in, out.begin() + dst * n_in);
      }
  return out;
}

Status write_file_header(gguf::Writer& w, const HParams& hp, const ConvertOptions& o,
                         const FileType& ft) {
  write_hparams(w, hp);
  w.set_string("general.name", fs::path(o.hf_dir).filename().string());
  w.set_uint32("general.file_type", ft.id);
  w.set_uint32("general.quantization_version", 2);
  if (o.with_tokenizer && fs::exists(fs::path(o.hf_dir) / "tokenizer.json")) {
    KILN_TRY(tokenizer::VocabData vocab, tokenizer::import_hf_tokenizer(o.hf_dir));
    tokenizer::write_vocab(w, vocab);
  }
  return {};
}

Status check_tensor_size(const TensorSpec& spec, size_t values) {
  int64_t n = 1;
  for (int64_t d : spec.ne) n *= d;
  if (static_cast<int64_t>(values) != n)
    return err("convert: '{}' has {} elements, expected {}", spec.name, values, n);
  return {};
}

Expected<gguf::Writer> convert_hf(const ConvertOptions& o) {
  std::ifstream cf(fs::path(o.hf_dir) / "config.json");
  if (!cf) return err("convert: cannot read '{}/config.json'", o.hf_dir);
  const nlohmann::json config = nlohmann::json::parse(cf, nullptr, false);
  if (config.is_discarded()) return err("convert: config.json is not valid JSON");
  if (is_bert_config(config)) return convert_bert(o, config);  // an encoder: convert/bert.cpp
  if (is_nomic_bert_config(config)) return convert_nomic_bert(o, config);  // convert/nomic_bert.cpp
  if (is_qwen35_config(config)) return convert_qwen35(o, config);          // convert/qwen35.cpp
  KILN_TRY(HParams hp, hparams_from_hf_config(config));
  KILN_TRY(FileType ft, parse_file_type(o.type));
  KILN_TRY(Checkpoint ck, open_checkpoint(o.hf_dir));
  if (!ck.has("lm_head.weight")) hp.tied_embeddings = true;
  KILN_TRY(hp.pooling, pooling_from_sentence_transformers(o.hf_dir));
  const ArchDef* arch = find_arch(hp.arch);

  gguf::Writer w;
  KILN_TRY_STATUS(write_file_header(w, hp, o, ft));
  const nlohmann::json rope = hf_rope_settings(config);
  for (const TensorSpec& spec : tensor_manifest(*arch, hp)) {
    if (spec.name == "rope_freqs.weight") {
      if (hf_rope_type(rope) == "llama3")
        KILN_TRY_STATUS(add_tensor_f32(w, spec, quant::Type::F32, llama3_rope_factors(rope, hp)));
      continue;
    }
    if (spec.name == "output.weight" && hp.tied_embeddings) continue;
    std::vector<float> values;
    if (spec.name.find("_exps.") != std::string::npos) {
      KILN_TRY(values, read_experts(ck, spec.name, hp.n_expert));
    } else {
      const std::string src = hf_name(spec.name, arch->features);
      if (src.empty()) return err("convert: no Hugging Face name for '{}'", spec.name);
      KILN_TRY(values, ck.read(src));
    }
    KILN_TRY_STATUS(check_tensor_size(spec, values.size()));
    // llama's GGUF rope pairs adjacent dims; HF's rotate-half pairs (i, i + d/2).
    if (!arch->features.rope_neox && spec.name.ends_with("attn_q.weight"))
      values = permute_qk_rows(values, hp.n_head, spec.ne[0]);
    if (!arch->features.rope_neox && spec.name.ends_with("attn_k.weight"))
      values = permute_qk_rows(values, hp.n_head_kv, spec.ne[0]);
    // Gemma's RMSNorm scales by (1 + w); GGUF files store 1 + w (llama.cpp's converter).
    if (arch->features.embed_scale && spec.name.ends_with("norm.weight"))
      for (float& x : values) x += 1.0f;
    KILN_TRY_STATUS(add_tensor_f32(w, spec, tensor_type(ft, spec, hp), values));
  }
  return w;
}

Status convert_hf_file(const ConvertOptions& opts, const std::string& out_path) {
  KILN_TRY(gguf::Writer w, convert_hf(opts));
  return w.write_file(out_path);
}

}  // namespace kiln::model
