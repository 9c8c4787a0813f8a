#include "kiln/model/convert/qwen35.h"

#include <cmath>

#include "kiln/model/arch/arch.h"
#include "kiln/model/convert/safetensors.h"
#include "kiln/model/file_type.h"
#include "kiln/model/hparams.h"

namespace kiln::model {
namespace {

std::string first_architecture(const nlohmann::json& c) {
  if (!c.contains("architectures") || !c["architectures"].is_array() ||
      c["architectures"].empty() || !c["architectures"][0].is_string())
    return "";
  return c["architectures"][0].get<std::string>();
}

std::string gguf_arch(const std::string& hf) {
  if (hf == "Qwen3_5ForCausalLM" || hf == "Qwen3_5ForConditionalGeneration") return "qwen35";
  if (hf == "Qwen3_5MoeForCausalLM" || hf == "Qwen3_5MoeForConditionalGeneration")
    return "qwen35moe";
  if (hf == "Qwen3NextForCausalLM") return "qwen3next";
  return "";
}

Expected<uint32_t> get_u32(const nlohmann::json& c, const char* key, int64_t fallback = -1) {
  if (!c.contains(key) || c[key].is_null()) {
    if (fallback >= 0) return static_cast<uint32_t>(fallback);
    return err("convert: config.json has no '{}'", key);
  }
  if (!c[key].is_number_integer()) return err("convert: config.json '{}' is not an integer", key);
  const int64_t v = c[key].get<int64_t>();
  if (v < 0 || v > (int64_t{1} << 30)) return err("convert: config.json {} = {}", key, v);
  return static_cast<uint32_t>(v);
}

// full_attention_interval, or the period of layer_types (every n-th layer full attention).
Expected<uint32_t> attention_interval(const nlohmann::json& c, uint32_t n_layer) {
  if (!c.contains("layer_types") || !c["layer_types"].is_array())
    return get_u32(c, "full_attention_interval", 4);
  const nlohmann::json& types = c["layer_types"];
  if (types.size() != n_layer)
    return err("convert: layer_types has {} entries for {} layers", types.size(), n_layer);
  uint32_t interval = 0;
  for (uint32_t i = 0; i < n_layer && interval == 0; ++i)
    if (types[i] == "full_attention") interval = i + 1;
  if (interval == 0) return err("convert: layer_types has no full_attention layer");
  for (uint32_t i = 0; i < n_layer; ++i) {
    const bool full = (i + 1) % interval == 0;
    if (types[i] != (full ? "full_attention" : "linear_attention"))
      return err("convert: layer_types is not every {}-th layer full attention (layer {} is {})",
                 interval, i, types[i].dump());
  }
  return interval;
}

Expected<HParams> hparams_of(const nlohmann::json& c, const std::string& arch) {
  HParams hp;
  hp.arch = arch;
  KILN_TRY(hp.n_vocab, get_u32(c, "vocab_size"));
  KILN_TRY(hp.n_ctx_train, get_u32(c, "max_position_embeddings", 32768));
  KILN_TRY(hp.n_embd, get_u32(c, "hidden_size"));
  KILN_TRY(hp.n_layer, get_u32(c, "num_hidden_layers"));
  KILN_TRY(hp.n_head, get_u32(c, "num_attention_heads"));
  KILN_TRY(hp.n_head_kv, get_u32(c, "num_key_value_heads", hp.n_head));
  KILN_TRY(hp.n_ff, get_u32(c, "intermediate_size", 0));
  if (hp.n_head == 0 || hp.n_embd == 0 || hp.n_layer == 0)
    return err("convert: hidden_size, num_hidden_layers, num_attention_heads must be > 0");
  KILN_TRY(hp.head_dim_k, get_u32(c, "head_dim", hp.n_embd / hp.n_head));
  hp.head_dim_v = hp.head_dim_k;
  const nlohmann::json rope = hf_rope_settings(c);
  if (const std::string t = hf_rope_type(rope); t != "default")
    return err("convert: {} with rope type '{}' is not supported (kiln: default)", arch, t);
  auto number = [&](const char* key, double fallback) {
    if (rope.contains(key) && rope[key].is_number()) return rope[key].get<double>();
    if (c.contains(key) && c[key].is_number()) return c[key].get<double>();
    return fallback;
  };
  hp.rope_freq_base = static_cast<float>(number("rope_theta", 10000.0));
  const double partial = number("partial_rotary_factor", 0.25);
  hp.n_rot = static_cast<uint32_t>(hp.head_dim_k * partial);
  hp.rms_eps = static_cast<float>(c.contains("rms_norm_eps") && c["rms_norm_eps"].is_number()
                                      ? c["rms_norm_eps"].get<double>()
                                      : 1e-6);
  hp.tied_embeddings = c.contains("tie_word_embeddings") && c["tie_word_embeddings"].is_boolean() &&
                       c["tie_word_embeddings"].get<bool>();
  KILN_TRY(hp.linear_conv_kernel, get_u32(c, "linear_conv_kernel_dim", 4));
  KILN_TRY(hp.linear_head_k_dim, get_u32(c, "linear_key_head_dim", 128));
  KILN_TRY(hp.linear_head_v_dim, get_u32(c, "linear_value_head_dim", 128));
  KILN_TRY(hp.linear_n_k_heads, get_u32(c, "linear_num_key_heads", 16));
  KILN_TRY(hp.linear_n_v_heads, get_u32(c, "linear_num_value_heads", 32));
  if (hp.linear_n_k_heads == 0 || hp.linear_n_v_heads % hp.linear_n_k_heads != 0)
    return err("convert: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
               hp.linear_n_v_heads, hp.linear_n_k_heads);
  // llama.cpp's kernels assume square states (ssm.state_size is both head dims).
  if (hp.linear_head_k_dim != hp.linear_head_v_dim)
    return err("convert: linear_key_head_dim {} != linear_value_head_dim {} has no GGUF form",
               hp.linear_head_k_dim, hp.linear_head_v_dim);
  KILN_TRY(hp.full_attn_interval, attention_interval(c, hp.n_layer));
  if (arch != "qwen35") {
    KILN_TRY(hp.n_expert, get_u32(c, "num_experts"));
    KILN_TRY(hp.n_expert_used, get_u32(c, "num_experts_per_tok"));
    KILN_TRY(hp.n_ff_expert, get_u32(c, "moe_intermediate_size"));
    KILN_TRY(hp.n_ff_shared, get_u32(c, "shared_expert_intermediate_size"));
    if (c.contains("norm_topk_prob") && c["norm_topk_prob"].is_boolean() &&
        !c["norm_topk_prob"].get<bool>())
      return err("convert: norm_topk_prob = false is not supported (kiln renormalises top-k)");
    if (arch == "qwen3next" && c.contains("mlp_only_layers") && c["mlp_only_layers"].is_array() &&
        !c["mlp_only_layers"].empty())
      return err("convert: qwen3next with dense mlp_only_layers is not supported");
    KILN_TRY(const uint32_t sparse_step, get_u32(c, "decoder_sparse_step", 1));
    if (arch == "qwen3next" && sparse_step != 1)
      return err("convert: qwen3next with decoder_sparse_step != 1 is not supported");
  }
  if (arch != "qwen3next") {
    // The multimodal rope's sections (text positions make it the plain rope; written back as
    // llama.cpp requires the key), [11, 11, 10] unless the config says otherwise.
    hp.rope_sections = {11, 11, 10, 0};
    if (rope.contains("mrope_section") && rope["mrope_section"].is_array()) {
      const nlohmann::json& s = rope["mrope_section"];
      if (s.size() > 4) return err("convert: mrope_section has {} entries", s.size());
      hp.rope_sections = {};
      for (size_t i = 0; i < s.size(); ++i) hp.rope_sections[i] = s[i].get<int32_t>();
    }
  }
  return hp;
}

// The checkpoint's tensors of the text model: names under `prefix` ("model." or, for the
// multimodal checkpoints, "model.language_model.").
struct Source {
  const Checkpoint& ck;
  std::string prefix;
  const HParams& hp;
  bool tiled;  // value heads go from grouped to tiled (qwen35, qwen35moe)

  std::string layer(const std::string& layer, const char* name) const {
    return prefix + "layers." + layer + "." + name;
  }
  Expected<std::vector<float>> read(const std::string& name) const { return ck.read(name); }
  int64_t r() const { return hp.linear_n_v_heads / hp.linear_n_k_heads; }
  // Value heads from grouped to tiled, each head `width` x `inner` values, `outer` times.
  std::vector<float> tile(std::vector<float> x, int64_t outer, int64_t width, int64_t inner) const {
    if (!tiled || r() == 1) return x;
    return tile_value_heads(x, outer, hp.linear_n_k_heads, r(), width, inner);
  }
};

Expected<std::vector<float>> read_experts(const Source& s, const std::string& layer,
                                          const std::string& which) {
  const HParams& hp = s.hp;
  const std::string per_expert = s.layer(layer, "mlp.experts.0.gate_proj.weight");
  std::vector<float> out;
  if (s.ck.has(per_expert) || s.ck.has(per_expert.substr(6))) {
    for (uint32_t e = 0; e < hp.n_expert; ++e) {
      KILN_TRY(
          std::vector<float> w,
          s.read(s.layer(layer, fmt::format("mlp.experts.{}.{}_proj.weight", e, which).c_str())));
      out.insert(out.end(), w.begin(), w.end());
    }
    return out;
  }
  // transformers 5's fused experts: gate_up_proj [E, 2 * ff, d], down_proj [E, d, ff].
  if (which == "down") return s.read(s.layer(layer, "mlp.experts.down_proj"));
  KILN_TRY(std::vector<float> gu, s.read(s.layer(layer, "mlp.experts.gate_up_proj")));
  const int64_t half = int64_t{hp.n_ff_expert} * hp.n_embd;
  if (static_cast<int64_t>(gu.size()) != 2 * half * hp.n_expert)
    return err("convert: layer {} mlp.experts.gate_up_proj has {} values", layer, gu.size());
  for (uint32_t e = 0; e < hp.n_expert; ++e) {
    const auto begin = gu.begin() + (2 * e + (which == "up" ? 1 : 0)) * half;
    out.insert(out.end(), begin, begin + half);
  }
  return out;
}

// qwen3next's in_proj_qkvz: per key head [q (dk) | k (dk) | v (r dv) | z (r dv)] rows;
// part 0 gives attn_qkv ([all q | all k | all v]), part 1 attn_gate (all z).
Expected<std::vector<float>> split_qkvz(const Source& s, const std::string& layer, int part) {
  const HParams& hp = s.hp;
  KILN_TRY(std::vector<float> w, s.read(s.layer(layer, "linear_attn.in_proj_qkvz.weight")));
  const int64_t d = hp.n_embd, dk = hp.linear_head_k_dim, rv = s.r() * hp.linear_head_v_dim;
  const int64_t group = 2 * dk + 2 * rv, nk = hp.linear_n_k_heads;
  if (static_cast<int64_t>(w.size()) != nk * group * d)
    return err("convert: layer {} in_proj_qkvz has {} values", layer, w.size());
  std::vector<float> out;
  auto rows = [&](int64_t g, int64_t first, int64_t n) {
    const auto begin = w.begin() + (g * group + first) * d;
    out.insert(out.end(), begin, begin + n * d);
  };
  if (part == 1) {
    for (int64_t g = 0; g < nk; ++g) rows(g, 2 * dk + rv, rv);
    return out;
  }
  for (int64_t g = 0; g < nk; ++g) rows(g, 0, dk);
  for (int64_t g = 0; g < nk; ++g) rows(g, dk, dk);
  for (int64_t g = 0; g < nk; ++g) rows(g, 2 * dk, rv);
  return out;
}

// The values of GGUF tensor `name` (a blk.N.* or model-wide tensor of the manifest).
Expected<std::vector<float>> tensor_values(const Source& s, const std::string& name) {
  const HParams& hp = s.hp;
  auto plus_one = [](std::vector<float> v) {
    for (float& x : v) x += 1.0f;
    return v;
  };
  if (name == "token_embd.weight") return s.read(s.prefix + "embed_tokens.weight");
  if (name == "output.weight") return s.read("lm_head.weight");
  if (name == "output_norm.weight") {
    KILN_TRY(std::vector<float> v, s.read(s.prefix + "norm.weight"));
    return plus_one(std::move(v));
  }
  const size_t dot = name.find('.', 4);
  const std::string layer = name.substr(4, dot - 4), suffix = name.substr(dot + 1);
  const int64_t d = hp.n_embd, dv = hp.linear_head_v_dim;
  const int64_t qk = 2 * int64_t{hp.linear_n_k_heads} * hp.linear_head_k_dim;
  static const std::pair<const char*, const char*> kNorms[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"post_attention_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
  };
  for (auto [g, h] : kNorms)
    if (suffix == g) {
      KILN_TRY(std::vector<float> v, s.read(s.layer(layer, h)));
      return plus_one(std::move(v));
    }
  static const std::pair<const char*, const char*> kPlain[] = {
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
      {"ffn_gate_inp.weight", "mlp.gate.weight"},
      {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"},
      {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},
      {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"},
      {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"},
      {"ssm_norm.weight", "linear_attn.norm.weight"},
      {"ssm_ba.weight", "linear_attn.in_proj_ba.weight"},
  };
  for (auto [g, h] : kPlain)
    if (suffix == g) return s.read(s.layer(layer, h));
  if (suffix == "ffn_gate_exps.weight") return read_experts(s, layer, "gate");
  if (suffix == "ffn_up_exps.weight") return read_experts(s, layer, "up");
  if (suffix == "ffn_down_exps.weight") return read_experts(s, layer, "down");
  const bool fused_qkvz = s.ck.has(s.layer(layer, "linear_attn.in_proj_qkvz.weight")) ||
                          s.ck.has(s.layer(layer, "linear_attn.in_proj_qkvz.weight").substr(6));
  if (suffix == "attn_qkv.weight") {
    if (fused_qkvz) return split_qkvz(s, layer, 0);
    KILN_TRY(std::vector<float> w, s.read(s.layer(layer, "linear_attn.in_proj_qkv.weight")));
    std::vector<float> v(w.begin() + qk * d, w.end());
    v = s.tile(std::move(v), 1, dv, d);
    std::copy(v.begin(), v.end(), w.begin() + qk * d);
    return w;
  }
  if (suffix == "attn_gate.weight") {
    if (fused_qkvz) return split_qkvz(s, layer, 1);
    KILN_TRY(std::vector<float> w, s.read(s.layer(layer, "linear_attn.in_proj_z.weight")));
    return s.tile(std::move(w), 1, dv, d);
  }
  if (suffix == "ssm_beta.weight" || suffix == "ssm_alpha.weight") {
    KILN_TRY(std::vector<float> w,
             s.read(s.layer(layer, suffix == "ssm_beta.weight" ? "linear_attn.in_proj_b.weight"
                                                               : "linear_attn.in_proj_a.weight")));
    return s.tile(std::move(w), 1, 1, d);
  }
  if (suffix == "ssm_conv1d.weight") {  // [C, 1, K] -> [C, K]: the same values
    const int64_t k = hp.linear_conv_kernel;
    KILN_TRY(std::vector<float> w, s.read(s.layer(layer, "linear_attn.conv1d.weight")));
    if (static_cast<int64_t>(w.size()) < qk * k)
      return err("convert: layer {} conv1d has {} values", layer, w.size());
    std::vector<float> v(w.begin() + qk * k, w.end());
    v = s.tile(std::move(v), 1, dv, k);
    std::copy(v.begin(), v.end(), w.begin() + qk * k);
    return w;
  }
  if (suffix == "ssm_dt.bias") {
    KILN_TRY(std::vector<float> v, s.read(s.layer(layer, "linear_attn.dt_bias")));
    return s.tile(std::move(v), 1, 1, 1);
  }
  if (suffix == "ssm_a") {
    KILN_TRY(std::vector<float> v, s.read(s.layer(layer, "linear_attn.A_log")));
    for (float& x : v) x = -std::exp(x);
    return s.tile(std::move(v), 1, 1, 1);
  }
  if (suffix == "ssm_out.weight") {  // [d, n_v dv]: the value heads are columns
    KILN_TRY(std::vector<float> w, s.read(s.layer(layer, "linear_attn.out_proj.weight")));
    return s.tile(std::move(w), d, dv, 1);
  }
  return err("convert: no Hugging Face tensor for '{}'", name);
}

}  // namespace

std::vector<float> tile_value_heads(const std::vector<float>& x, int64_t outer, int64_t n_k,
                                    int64_t r, int64_t width, int64_t inner) {
  const int64_t head = width * inner, row = n_k * r * head;
  std::vector<float> out(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t g = 0; g < n_k; ++g)
      for (int64_t j = 0; j < r; ++j) {
        const auto src = x.begin() + o * row + (g * r + j) * head;
        std::copy(src, src + head, out.begin() + o * row + (j * n_k + g) * head);
      }
  return out;
}

Expected<HParams> qwen35_hparams(const nlohmann::json& config) {
  const std::string arch = gguf_arch(first_architecture(config));
  if (arch.empty()) return err("convert: not a Qwen3.5 / Qwen3-Next config");
  // The multimodal checkpoints nest the text model's config.
  const bool nested = config.contains("text_config") && config["text_config"].is_object();
  return hparams_of(nested ? config["text_config"] : config, arch);
}

bool is_qwen35_config(const nlohmann::json& config) {
  return !gguf_arch(first_architecture(config)).empty();
}

Expected<gguf::Writer> convert_qwen35(const ConvertOptions& o, const nlohmann::json& config) {
  KILN_TRY(HParams hp, qwen35_hparams(config));
  const std::string arch = hp.arch;
  KILN_TRY(FileType ft, parse_file_type(o.type));
  KILN_TRY(Checkpoint ck, open_checkpoint(o.hf_dir));
  const std::string prefix =
      ck.has("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
  if (!ck.has("lm_head.weight")) hp.tied_embeddings = true;
  const ArchDef* def = find_arch(arch);
  const Source src{ck, prefix, hp, arch != "qwen3next"};

  gguf::Writer w;
  KILN_TRY_STATUS(write_file_header(w, hp, o, ft));
  for (const TensorSpec& spec : tensor_manifest(*def, hp)) {
    if (spec.name == "output.weight" && hp.tied_embeddings) continue;
    KILN_TRY(std::vector<float> values, tensor_values(src, spec.name));
    KILN_TRY_STATUS(check_tensor_size(spec, values.size()));
    KILN_TRY_STATUS(add_tensor_f32(w, spec, tensor_type(ft, spec, hp), values));
  }
  return w;
}

}  // namespace kiln::model
