#include "kiln/model/hparams.h"

#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kiln::model {
namespace {

std::string key(const std::string& arch, std::string_view suffix) {
  return fmt::format("{}.{}", arch, suffix);
}

// A u32 hyperparameter: present and in range, or the fallback when absent.
Expected<uint32_t> get_u32(const gguf::File& f, const std::string& k, uint64_t fallback) {
  KILN_TRY(uint64_t v, f.get_uint_or(k, fallback));
  if (v > 0xffffffffu) return err("gguf: key '{}' = {} is out of range", k, v);
  return static_cast<uint32_t>(v);
}

Status validate(const HParams& hp) {
  auto positive = [](uint32_t v, std::string_view what) -> Status {
    if (v == 0) return err("model: {} must be > 0", what);
    return {};
  };
  KILN_TRY_STATUS(positive(hp.n_embd, "embedding_length"));
  KILN_TRY_STATUS(positive(hp.n_layer, "block_count"));
  KILN_TRY_STATUS(positive(hp.n_head, "attention.head_count"));
  KILN_TRY_STATUS(positive(hp.n_head_kv, "attention.head_count_kv"));
  KILN_TRY_STATUS(positive(hp.n_vocab, "vocab_size"));
  KILN_TRY_STATUS(positive(hp.head_dim_k, "attention.key_length"));
  KILN_TRY_STATUS(positive(hp.head_dim_v, "attention.value_length"));
  if (hp.n_head % hp.n_head_kv != 0)
    return err("model: head_count {} is not a multiple of head_count_kv {}", hp.n_head,
               hp.n_head_kv);
  if (hp.n_rot > hp.head_dim_k || hp.n_rot % 2 != 0)
    return err("model: rope.dimension_count {} must be even and <= key_length {}", hp.n_rot,
               hp.head_dim_k);
  if (hp.n_expert > 0 && (hp.n_expert_used == 0 || hp.n_expert_used > hp.n_expert))
    return err("model: expert_used_count {} must be in 1..expert_count {}", hp.n_expert_used,
               hp.n_expert);
  // Bound the sizes so later products (n_embd * n_vocab, ...) cannot overflow 64 bits.
  if (hp.n_embd > (1u << 20) || hp.n_layer > 4096 || hp.n_head > 4096 || hp.n_ff > (1u << 24))
    return err("model: implausible hyperparameters (n_embd {}, n_layer {}, n_head {}, n_ff {})",
               hp.n_embd, hp.n_layer, hp.n_head, hp.n_ff);
  return {};
}

// Rope scaling keys, as llama.cpp reads them: the type defaults to linear when only a factor is
// given (the old key rope.scale_linear too); YaRN's parameters default to the paper's values.
Status read_rope_scaling(const gguf::File& f, HParams& hp) {
  const std::string& a = hp.arch;
  KILN_TRY(double old_factor, f.get_float_or(key(a, "rope.scale_linear"), 0.0));
  KILN_TRY(double factor, f.get_float_or(key(a, "rope.scaling.factor"), old_factor));
  KILN_TRY(std::string type, f.get_string_or(key(a, "rope.scaling.type"), "linear"));
  if (type == "none" || (type == "linear" && (factor == 0.0 || factor == 1.0))) {
    hp.rope_scaling = RopeScaling::kNone;
  } else if (type == "linear") {
    hp.rope_scaling = RopeScaling::kLinear;
  } else if (type == "yarn") {
    hp.rope_scaling = RopeScaling::kYarn;
  } else {
    return err("model: rope scaling type '{}' is not supported (kiln: none, linear, yarn)", type);
  }
  if (hp.rope_scaling != RopeScaling::kNone && !(factor > 0.0))
    return err("model: rope scaling '{}' needs {} > 0", type, key(a, "rope.scaling.factor"));
  hp.rope_scale_factor = hp.rope_scaling == RopeScaling::kNone ? 1.0f : static_cast<float>(factor);
  KILN_TRY(hp.rope_orig_ctx, get_u32(f, key(a, "rope.scaling.original_context_length"), 0));
  KILN_TRY(double attn, f.get_float_or(key(a, "rope.scaling.attn_factor"), 0.0));
  KILN_TRY(attn, f.get_float_or(key(a, "rope.scaling.yarn_attn_factor"), attn));
  KILN_TRY(double log_mul, f.get_float_or(key(a, "rope.scaling.yarn_log_multiplier"), 0.0));
  KILN_TRY(double ext, f.get_float_or(key(a, "rope.scaling.yarn_ext_factor"), 1.0));
  KILN_TRY(double beta_fast, f.get_float_or(key(a, "rope.scaling.yarn_beta_fast"), 32.0));
  KILN_TRY(double beta_slow, f.get_float_or(key(a, "rope.scaling.yarn_beta_slow"), 1.0));
  KILN_TRY(double temp, f.get_float_or(key(a, "attention.temperature_scale"), 0.0));
  if (attn < 0 || ext < 0 || !(beta_fast > 0) || !(beta_slow > 0))
    return err("model: invalid yarn parameters (attn_factor {}, ext_factor {}, beta {} / {})", attn,
               ext, beta_fast, beta_slow);
  hp.rope_attn_factor = static_cast<float>(attn);
  hp.yarn_log_multiplier = static_cast<float>(log_mul);
  hp.yarn_ext_factor = static_cast<float>(ext);
  hp.yarn_beta_fast = static_cast<float>(beta_fast);
  hp.yarn_beta_slow = static_cast<float>(beta_slow);
  hp.attn_temp_scale = static_cast<float>(temp);
  return {};
}

// The Gated DeltaNet keys of the hybrid architectures (llama.cpp's ssm.* names): the value
// head dim is ssm.inner_size / ssm.time_step_rank, the key head dim ssm.state_size; every
// full_attention_interval-th layer (4 unless given) is full attention.
Status read_linear_attention(const gguf::File& f, const ArchDef& def, HParams& hp) {
  const std::string& a = hp.arch;
  KILN_TRY(hp.n_nextn_layers, get_u32(f, key(a, "nextn_predict_layers"), 0));
  KILN_TRY(hp.n_ff_shared, get_u32(f, key(a, "expert_shared_feed_forward_length"), 0));
  if (hp.n_nextn_layers >= hp.n_layer && hp.n_layer > 0)
    return err("model: nextn_predict_layers {} leaves no layers of {}", hp.n_nextn_layers,
               hp.n_layer);
  if (const gguf::Value* v = f.find(key(a, "rope.dimension_sections"))) {
    const gguf::Array* arr = v->as_array();
    if (arr == nullptr || arr->items.size() > hp.rope_sections.size())
      return err("model: {} must be an array of at most 4 integers",
                 key(a, "rope.dimension_sections"));
    for (size_t i = 0; i < arr->items.size(); ++i) {
      const std::optional<int64_t> x = arr->items[i].as_int();
      if (!x || *x < 0 || *x > 4096)
        return err("model: {} holds an invalid value", key(a, "rope.dimension_sections"));
      hp.rope_sections[i] = static_cast<int32_t>(*x);
    }
  }
  if (!def.features.linear_attention) return {};
  KILN_TRY(hp.linear_conv_kernel, get_u32(f, key(a, "ssm.conv_kernel"), 0));
  KILN_TRY(hp.linear_head_k_dim, get_u32(f, key(a, "ssm.state_size"), 0));
  KILN_TRY(hp.linear_n_k_heads, get_u32(f, key(a, "ssm.group_count"), 0));
  KILN_TRY(hp.linear_n_v_heads, get_u32(f, key(a, "ssm.time_step_rank"), 0));
  KILN_TRY(uint32_t inner, get_u32(f, key(a, "ssm.inner_size"), 0));
  KILN_TRY(hp.full_attn_interval, get_u32(f, key(a, "full_attention_interval"), 4));
  if (hp.linear_conv_kernel < 2 || hp.linear_conv_kernel > 16 || hp.linear_head_k_dim == 0 ||
      hp.linear_head_k_dim > 1024 || hp.linear_n_k_heads == 0 || hp.linear_n_v_heads == 0 ||
      hp.linear_n_v_heads > 4096 || inner == 0 || inner % hp.linear_n_v_heads != 0 ||
      hp.linear_n_v_heads % hp.linear_n_k_heads != 0 || hp.full_attn_interval == 0)
    return err(
        "model: invalid linear attention keys (ssm.conv_kernel {}, ssm.state_size {}, "
        "ssm.group_count {}, ssm.time_step_rank {}, ssm.inner_size {}, "
        "full_attention_interval {})",
        hp.linear_conv_kernel, hp.linear_head_k_dim, hp.linear_n_k_heads, hp.linear_n_v_heads,
        inner, hp.full_attn_interval);
  hp.linear_head_v_dim = inner / hp.linear_n_v_heads;
  if (hp.linear_head_v_dim > 1024)
    return err("model: linear attention value head dim {} is implausible", hp.linear_head_v_dim);
  return {};
}

}  // namespace

Expected<HParams> read_hparams(const gguf::File& f) {
  HParams hp;
  KILN_TRY(hp.arch, f.get_string("general.architecture"));
  const ArchDef* def = find_arch(hp.arch);
  if (def == nullptr)
    return err("model: unsupported architecture '{}' (kiln supports: {})", hp.arch,
               fmt::join(arch_names(), ", "));
  const std::string& a = hp.arch;
  KILN_TRY(hp.n_embd, get_u32(f, key(a, "embedding_length"), 0));
  KILN_TRY(hp.n_layer, get_u32(f, key(a, "block_count"), 0));
  KILN_TRY(hp.n_ctx_train, get_u32(f, key(a, "context_length"), 2048));
  KILN_TRY(hp.n_ff, get_u32(f, key(a, "feed_forward_length"), 0));
  KILN_TRY(hp.n_head, get_u32(f, key(a, "attention.head_count"), 0));
  KILN_TRY(hp.n_head_kv, get_u32(f, key(a, "attention.head_count_kv"), hp.n_head));
  const uint32_t head_dim = hp.n_head ? hp.n_embd / hp.n_head : 0;
  KILN_TRY(hp.head_dim_k, get_u32(f, key(a, "attention.key_length"), head_dim));
  KILN_TRY(hp.head_dim_v, get_u32(f, key(a, "attention.value_length"), head_dim));
  KILN_TRY(hp.n_rot, get_u32(f, key(a, "rope.dimension_count"), hp.head_dim_k));
  KILN_TRY(hp.n_expert, get_u32(f, key(a, "expert_count"), 0));
  KILN_TRY(hp.n_expert_used, get_u32(f, key(a, "expert_used_count"), 0));
  KILN_TRY(hp.n_ff_expert, get_u32(f, key(a, "expert_feed_forward_length"), hp.n_ff));
  KILN_TRY(double eps, f.get_float_or(key(a, "attention.layer_norm_rms_epsilon"), 1e-5));
  KILN_TRY(double base, f.get_float_or(key(a, "rope.freq_base"), 10000.0));
  hp.rms_eps = static_cast<float>(eps);
  hp.rope_freq_base = static_cast<float>(base);
  // Sliding windows, soft-capping and score scale (gemma, mistral); the architecture's
  // defaults (llama.cpp's) where the file has no key: gemma2 slides every other layer, gemma3
  // five of six layers with a local rope base of 10000 and no rope scaling on them.
  const ArchDefaults& dflt = def->defaults;
  KILN_TRY(hp.sliding_window, get_u32(f, key(a, "attention.sliding_window"), 0));
  KILN_TRY(hp.swa_pattern,
           get_u32(f, key(a, "attention.sliding_window_pattern"), dflt.swa_pattern));
  KILN_TRY(double base_swa,
           f.get_float_or(key(a, "rope.freq_base_swa"),
                          dflt.rope_freq_base_swa != 0 ? dflt.rope_freq_base_swa : base));
  KILN_TRY(double scale, f.get_float_or(key(a, "attention.scale"), 0.0));
  KILN_TRY(double attn_cap, f.get_float_or(key(a, "attn_logit_softcapping"), 0.0));
  KILN_TRY(double final_cap, f.get_float_or(key(a, "final_logit_softcapping"), 0.0));
  hp.rope_freq_base_swa = static_cast<float>(base_swa);
  hp.attn_scale = static_cast<float>(scale);
  hp.attn_softcap = static_cast<float>(attn_cap);
  hp.final_softcap = static_cast<float>(final_cap);
  if (const gguf::Value* v = f.find(key(a, "vocab_size"))) {
    KILN_TRY(hp.n_vocab, get_u32(f, key(a, "vocab_size"), 0));
    (void)v;
  } else if (const gguf::Value* toks = f.find("tokenizer.ggml.tokens");
             toks != nullptr && toks->as_array() != nullptr) {
    hp.n_vocab = static_cast<uint32_t>(toks->as_array()->items.size());
  } else if (const gguf::TensorInfo* emb = f.find_tensor("token_embd.weight");
             emb != nullptr && emb->ne.size() == 2) {
    hp.n_vocab = static_cast<uint32_t>(emb->ne[1]);
  }
  hp.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  // Encoders: LayerNorm epsilon, non-causal attention, token types (the count llama.cpp's converter
  // writes, else the table's rows).
  KILN_TRY(double norm_eps, f.get_float_or(key(a, "attention.layer_norm_epsilon"), 1e-12));
  hp.norm_eps = static_cast<float>(norm_eps);
  KILN_TRY(const bool causal, f.get_bool_or(key(a, "attention.causal"), !def->features.encoder));
  if (causal != !def->features.encoder)
    return err("model: {} = {} is not supported for {}", key(a, "attention.causal"), causal, a);
  uint64_t types_rows = 0;
  if (const gguf::TensorInfo* tt = f.find_tensor("token_types.weight");
      tt != nullptr && tt->ne.size() == 2)
    types_rows = static_cast<uint64_t>(tt->ne[1]);
  KILN_TRY(hp.n_token_types, get_u32(f, "tokenizer.ggml.token_type_count", types_rows));
  KILN_TRY(uint32_t pooling, get_u32(f, key(a, "pooling_type"), 0));
  if (pooling > kMaxPooling)
    return err("model: {} is {}, not a pooling type (0 none .. {} rank)", key(a, "pooling_type"),
               pooling, kMaxPooling);
  hp.pooling = static_cast<Pooling>(pooling);
  KILN_TRY_STATUS(read_rope_scaling(f, hp));
  hp.rope_scaling_swa = dflt.rope_scaling_swa;
  KILN_TRY_STATUS(read_linear_attention(f, *def, hp));
  if (def->features.moe && hp.n_expert == 0)
    return err("model: architecture '{}' needs {}.expert_count", a, a);
  KILN_TRY_STATUS(validate(hp));
  return hp;
}

void write_hparams(gguf::Writer& w, const HParams& hp) {
  const std::string& a = hp.arch;
  w.set_string("general.architecture", a);
  w.set_uint32(key(a, "vocab_size"), hp.n_vocab);
  w.set_uint32(key(a, "context_length"), hp.n_ctx_train);
  w.set_uint32(key(a, "embedding_length"), hp.n_embd);
  w.set_uint32(key(a, "block_count"), hp.n_layer);
  w.set_uint32(key(a, "feed_forward_length"), hp.n_ff);
  w.set_uint32(key(a, "attention.head_count"), hp.n_head);
  w.set_uint32(key(a, "attention.head_count_kv"), hp.n_head_kv);
  w.set_uint32(key(a, "attention.key_length"), hp.head_dim_k);
  w.set_uint32(key(a, "attention.value_length"), hp.head_dim_v);
  w.set_uint32(key(a, "rope.dimension_count"), hp.n_rot);
  w.set_float32(key(a, "rope.freq_base"), hp.rope_freq_base);
  w.set_float32(key(a, "attention.layer_norm_rms_epsilon"), hp.rms_eps);
  if (hp.sliding_window > 0) {
    w.set_uint32(key(a, "attention.sliding_window"), hp.sliding_window);
    w.set_uint32(key(a, "attention.sliding_window_pattern"), hp.swa_pattern);
    if (hp.rope_freq_base_swa != hp.rope_freq_base)
      w.set_float32(key(a, "rope.freq_base_swa"), hp.rope_freq_base_swa);
  }
  if (hp.attn_scale != 0) w.set_float32(key(a, "attention.scale"), hp.attn_scale);
  if (hp.attn_softcap != 0) w.set_float32(key(a, "attn_logit_softcapping"), hp.attn_softcap);
  if (hp.final_softcap != 0) w.set_float32(key(a, "final_logit_softcapping"), hp.final_softcap);
  if (hp.rope_scaling != RopeScaling::kNone) {
    w.set_string(key(a, "rope.scaling.type"),
                 hp.rope_scaling == RopeScaling::kYarn ? "yarn" : "linear");
    w.set_float32(key(a, "rope.scaling.factor"), hp.rope_scale_factor);
  }
  if (hp.rope_scaling == RopeScaling::kYarn) {
    w.set_uint32(key(a, "rope.scaling.original_context_length"),
                 hp.rope_orig_ctx != 0 ? hp.rope_orig_ctx : hp.n_ctx_train);
    if (hp.yarn_log_multiplier != 0)
      w.set_float32(key(a, "rope.scaling.yarn_log_multiplier"), hp.yarn_log_multiplier);
    if (hp.yarn_ext_factor != 1.0f)
      w.set_float32(key(a, "rope.scaling.yarn_ext_factor"), hp.yarn_ext_factor);
    if (hp.yarn_beta_fast != 32.0f)
      w.set_float32(key(a, "rope.scaling.yarn_beta_fast"), hp.yarn_beta_fast);
    if (hp.yarn_beta_slow != 1.0f)
      w.set_float32(key(a, "rope.scaling.yarn_beta_slow"), hp.yarn_beta_slow);
  }
  if (hp.rope_attn_factor != 0)
    w.set_float32(key(a, hp.rope_scaling == RopeScaling::kYarn ? "rope.scaling.yarn_attn_factor"
                                                               : "rope.scaling.attn_factor"),
                  hp.rope_attn_factor);
  if (hp.attn_temp_scale != 0)
    w.set_float32(key(a, "attention.temperature_scale"), hp.attn_temp_scale);
  if (const ArchDef* def = find_arch(a); def != nullptr && def->features.encoder) {
    w.set_float32(key(a, "attention.layer_norm_epsilon"), hp.norm_eps);
    w.set_bool(key(a, "attention.causal"), false);
    w.set_uint32("tokenizer.ggml.token_type_count", hp.n_token_types);
  }
  if (hp.pooling != Pooling::kNone)
    w.set_uint32(key(a, "pooling_type"), static_cast<uint32_t>(hp.pooling));
  if (hp.n_expert > 0) {
    w.set_uint32(key(a, "expert_count"), hp.n_expert);
    w.set_uint32(key(a, "expert_used_count"), hp.n_expert_used);
    w.set_uint32(key(a, "expert_feed_forward_length"), hp.n_ff_expert);
  }
  if (hp.n_ff_shared > 0) w.set_uint32(key(a, "expert_shared_feed_forward_length"), hp.n_ff_shared);
  if (hp.full_attn_interval > 0) {
    w.set_uint32(key(a, "ssm.conv_kernel"), hp.linear_conv_kernel);
    w.set_uint32(key(a, "ssm.state_size"), hp.linear_head_k_dim);
    w.set_uint32(key(a, "ssm.group_count"), hp.linear_n_k_heads);
    w.set_uint32(key(a, "ssm.time_step_rank"), hp.linear_n_v_heads);
    w.set_uint32(key(a, "ssm.inner_size"), hp.linear_n_v_heads * hp.linear_head_v_dim);
    w.set_uint32(key(a, "full_attention_interval"), hp.full_attn_interval);
  }
  if (hp.n_nextn_layers > 0) w.set_uint32(key(a, "nextn_predict_layers"), hp.n_nextn_layers);
  if (hp.rope_sections != std::array<int32_t, 4>{})
    w.set_int32_array(key(a, "rope.dimension_sections"), hp.rope_sections);
}

Status check_manifest(const gguf::File& f, const ArchDef& arch, const HParams& hp) {
  std::set<std::string, std::less<>> expected;
  for (const TensorSpec& spec : tensor_manifest(arch, hp)) {
    expected.insert(spec.name);
    const gguf::TensorInfo* t = f.find_tensor(spec.name);
    if (t == nullptr) {
      if (spec.required) return err("model: missing tensor '{}' ({})", spec.name, arch.name);
      continue;
    }
    if (t->ne != spec.ne)
      return err("model: tensor '{}' has shape [{}], expected [{}]", spec.name,
                 fmt::join(t->ne, ", "), fmt::join(spec.ne, ", "));
    const quant::TypeTraits& tr = quant::traits(t->type);
    if (!tr.kiln_supported)
      return err("model: tensor '{}' has type {}, which kiln cannot compute with yet", spec.name,
                 tr.name);
    if (spec.kind == TensorKind::kNorm && tr.is_quantized)
      return err("model: tensor '{}' is {}, expected f32/f16/bf16", spec.name, tr.name);
  }
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (!expected.contains(t.name))
      return err("model: unexpected tensor '{}' for architecture '{}'", t.name, arch.name);
  }
  return {};
}

}  // namespace kiln::model
