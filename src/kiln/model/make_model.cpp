#include "kiln/model/make_model.h"

#include <cmath>
#include <cstring>
#include <optional>

#include "kiln/model/hparams.h"
#include "kiln/quant/convert.h"
#include "kiln/quant/types.h"
#include "kiln/tokenizer/gguf_vocab.h"
#include "kiln/tokenizer/hf_import.h"

namespace kiln::model {
namespace {

// splitmix64: a small, fully specified generator, so a seed gives the same file everywhere
// (std::normal_distribution is implementation-defined).
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  float normal() {  // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
};

// llama.cpp's general.file_type (enum llama_ftype, append-only).
std::optional<uint32_t> file_type_id(std::string_view type) {
  struct Row {
    std::string_view name;
    uint32_t id;
  };
  static constexpr Row kRows[] = {{"f32", 0},   {"f16", 1},   {"q4_0", 2},  {"q4_1", 3},
                                  {"q8_0", 7},  {"q5_0", 8},  {"q5_1", 9},  {"q4_k", 14},
                                  {"q4_k_m", 15}, {"q5_k", 16}, {"q5_k_m", 17}, {"q6_k", 18},
                                  {"bf16", 32}};
  for (const Row& r : kRows) {
    if (r.name == type) return r.id;
  }
  return std::nullopt;
}

// llama.cpp's use_more_bits(i, n): the layers a *_M mixture gives more bits.
bool use_more_bits(uint32_t i, uint32_t n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

uint32_t layer_of(const std::string& name) {
  // "blk.<i>.<...>"
  return static_cast<uint32_t>(std::strtoul(name.c_str() + 4, nullptr, 10));
}

// The quant type of one weight under the requested file type.
quant::Type weight_type(const std::string& type, quant::Type base, const TensorSpec& spec,
                        const HParams& hp) {
  if (spec.kind == TensorKind::kNorm) return quant::Type::F32;
  quant::Type t = base;
  const bool mixture = type == "q4_k_m" || type == "q5_k_m";
  if (mixture) {
    const bool is_output = spec.name == "output.weight" ||
                           (hp.tied_embeddings && spec.name == "token_embd.weight");
    const bool more_bits_layer = spec.name.starts_with("blk.") &&
                                 use_more_bits(layer_of(spec.name), hp.n_layer);
    if (is_output) t = quant::Type::Q6_K;
    if (more_bits_layer && (spec.name.ends_with("attn_v.weight") ||
                            spec.name.ends_with("ffn_down.weight")))
      t = quant::Type::Q6_K;
  }
  // Rows that are not a multiple of the block fall back, as llama-quantize does.
  const uint32_t block = quant::traits(t).block_elems;
  if (spec.ne[0] % block != 0) t = spec.ne[0] % 32 == 0 ? quant::Type::Q8_0 : quant::Type::F16;
  return t;
}

Expected<quant::Type> base_type(const std::string& type) {
  if (!file_type_id(type)) return err("make-model: unknown --type '{}'", type);
  if (type == "q4_k_m") return quant::Type::Q4_K;
  if (type == "q5_k_m") return quant::Type::Q5_K;
  auto t = quant::type_from_name(type);
  if (!t || !quant::can_quantize(*t))
    return err("make-model: kiln cannot quantize to '{}'", type);
  return *t;
}

Expected<HParams> hparams_from(const MakeModelOptions& o, uint32_t n_vocab) {
  HParams hp;
  hp.arch = o.arch;
  hp.n_vocab = n_vocab;
  hp.n_ctx_train = o.n_ctx;
  hp.n_embd = o.n_embd;
  hp.n_layer = o.n_layer;
  hp.n_head = o.n_head;
  hp.n_head_kv = o.n_head_kv;
  hp.n_ff = o.n_ff;
  if (o.n_head == 0) return err("make-model: --heads must be > 0");
  hp.head_dim_k = hp.head_dim_v = o.head_dim ? o.head_dim : o.n_embd / o.n_head;
  hp.n_rot = hp.head_dim_k;
  hp.n_expert = o.n_expert;
  hp.n_expert_used = o.n_expert_used;
  hp.n_ff_expert = o.n_ff_expert ? o.n_ff_expert : o.n_ff;
  hp.rms_eps = 1e-5f;
  hp.rope_freq_base = o.arch == "llama" ? 500000.0f : 1000000.0f;
  hp.tied_embeddings = o.tied_embeddings;
  if (hp.n_embd == 0 || hp.n_layer == 0 || hp.n_ff == 0 || hp.n_head_kv == 0)
    return err("make-model: --layers, --hidden, --ffn and --kv-heads must be > 0");
  if (hp.n_head % hp.n_head_kv != 0)
    return err("make-model: --heads {} must be a multiple of --kv-heads {}", hp.n_head,
               hp.n_head_kv);
  if (hp.head_dim_k % 2 != 0) return err("make-model: head dimension must be even");
  return hp;
}

// Random values for one tensor: norms near 1, weights ~ N(0, 1/fan_in) so activations keep
// their scale through the layers.
std::vector<float> random_values(const TensorSpec& spec, int64_t n, Rng& rng) {
  std::vector<float> v(static_cast<size_t>(n));
  if (spec.kind == TensorKind::kNorm) {
    const bool bias = spec.name.ends_with(".bias");
    for (float& x : v) x = bias ? 0.02f * rng.normal() : 1.0f + 0.1f * rng.normal();
    return v;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(spec.ne[0]));
  for (float& x : v) x = scale * rng.normal();
  return v;
}

Status add_tensor(gguf::Writer& w, const TensorSpec& spec, quant::Type type, Rng& rng) {
  int64_t n = 1;
  for (int64_t d : spec.ne) n *= d;
  const std::vector<float> values = random_values(spec, n, rng);
  const int64_t row = spec.ne[0];
  const uint64_t row_bytes = *quant::row_bytes(type, static_cast<uint64_t>(row));
  std::vector<uint8_t> data(row_bytes * static_cast<uint64_t>(n / row));
  for (int64_t r = 0; r < n / row; ++r) {
    KILN_TRY_STATUS(quant::quantize_row(type, values.data() + r * row,
                                        data.data() + static_cast<uint64_t>(r) * row_bytes,
                                        row));
  }
  return w.add_tensor(spec.name, type, spec.ne, data);
}

}  // namespace

Expected<gguf::Writer> make_model(const MakeModelOptions& o) {
  const ArchDef* arch = find_arch(o.arch);
  if (arch == nullptr) return err("make-model: unknown architecture '{}'", o.arch);
  if (o.tokenizer_dir.empty()) return err("make-model: --tokenizer DIR is required");
  KILN_TRY(tokenizer::VocabData vocab, tokenizer::import_hf_tokenizer(o.tokenizer_dir));
  KILN_TRY(HParams hp, hparams_from(o, static_cast<uint32_t>(vocab.tokens.size())));
  if (arch->features.moe && (hp.n_expert == 0 || hp.n_expert_used == 0))
    return err("make-model: architecture '{}' needs --experts and --experts-used", o.arch);
  KILN_TRY(quant::Type base, base_type(o.type));

  gguf::Writer w;
  write_hparams(w, hp);
  w.set_string("general.name", fmt::format("kiln-random-{}", o.arch));
  w.set_uint32("general.file_type", *file_type_id(o.type));
  w.set_uint32("general.quantization_version", 2);
  tokenizer::write_vocab(w, vocab);
  if (o.vocab_only) return w;

  Rng rng{o.seed};
  for (const TensorSpec& spec : arch->manifest(hp)) {
    if (!spec.required && !(spec.name == "output.weight" && !hp.tied_embeddings)) continue;
    KILN_TRY_STATUS(add_tensor(w, spec, weight_type(o.type, base, spec, hp), rng));
  }
  return w;
}

Status make_model_file(const MakeModelOptions& opts, const std::string& path) {
  KILN_TRY(gguf::Writer w, make_model(opts));
  return w.write_file(path);
}

}  // namespace kiln::model
