#include "kiln/model/make_model.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "kiln/model/convert/hf_to_gguf.h"
#include "kiln/model/file_type.h"
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
  float normal() {                                                            // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
};

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

// The model's shape from a Hugging Face config.json, as `kiln convert` reads it, with the
// vocabulary padded to the config's vocab_size (llama.cpp's converter does the same, and
// asserts that no token id reaches vocab_size).
struct ConfigShape {
  HParams hp;
  nlohmann::json rope;  // the config's rope settings (for llama3's rope_freqs.weight)
};

Expected<ConfigShape> shape_from_config(const std::string& path, size_t n_tokens) {
  std::ifstream in(path);
  if (!in) return err("make-model: cannot read '{}'", path);
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, false);
  if (config.is_discarded() || !config.is_object())
    return err("make-model: '{}' is not a JSON object", path);
  ConfigShape s;
  auto hp = hparams_from_hf_config(config);
  if (!hp) return err("make-model: {}: {}", path, hp.error().message);
  s.hp = std::move(*hp);
  if (s.hp.n_vocab == 0) s.hp.n_vocab = static_cast<uint32_t>(n_tokens);
  if (n_tokens > s.hp.n_vocab)
    return err("make-model: the tokenizer has {} tokens, more than the config's vocab_size {}",
               n_tokens, s.hp.n_vocab);
  s.rope = hf_rope_settings(config);
  return s;
}

// Random values for one tensor: norms near 1, weights ~ N(0, 1/fan_in) so activations keep
// their scale through the layers.
std::vector<float> random_values(const TensorSpec& spec, int64_t n, Rng& rng) {
  std::vector<float> v(static_cast<size_t>(n));
  if (spec.name.ends_with(".ssm_a")) {  // -exp(A_log): decays exp(g) in (0, 1)
    for (float& x : v) x = -0.5f - rng.uniform();
    return v;
  }
  if (spec.name.ends_with("ssm_conv1d.weight")) {  // a conv of a few taps keeps the scale
    for (float& x : v) x = 0.5f * rng.normal();
    return v;
  }
  if (spec.kind == TensorKind::kNorm) {
    const bool bias = spec.name.ends_with(".bias");
    for (float& x : v) x = bias ? 0.02f * rng.normal() : 1.0f + 0.1f * rng.normal();
    return v;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(spec.ne[0]));
  for (float& x : v) x = scale * rng.normal();
  return v;
}

}  // namespace

Expected<gguf::Writer> make_model(const MakeModelOptions& o) {
  const ArchDef* arch = find_arch(o.arch);
  if (arch == nullptr) return err("make-model: unknown architecture '{}'", o.arch);
  if (o.tokenizer_dir.empty()) return err("make-model: --tokenizer DIR is required");
  KILN_TRY(tokenizer::VocabData vocab,
           tokenizer::import_hf_tokenizer(o.tokenizer_dir, o.config_path));
  HParams hp;
  nlohmann::json rope = nlohmann::json::object();
  if (o.config_path.empty()) {
    KILN_TRY(hp, hparams_from(o, static_cast<uint32_t>(vocab.tokens.size())));
  } else {
    KILN_TRY(ConfigShape shape, shape_from_config(o.config_path, vocab.tokens.size()));
    hp = std::move(shape.hp);
    rope = std::move(shape.rope);
    arch = find_arch(hp.arch);
    if (arch == nullptr) return err("make-model: unknown architecture '{}'", hp.arch);
  }
  if (arch->features.moe && (hp.n_expert == 0 || hp.n_expert_used == 0))
    return err("make-model: architecture '{}' needs --experts and --experts-used", hp.arch);
  KILN_TRY(FileType ft, parse_file_type(o.type));

  gguf::Writer w;
  write_hparams(w, hp);
  w.set_string("general.name", fmt::format("kiln-random-{}", hp.arch));
  w.set_uint32("general.file_type", ft.id);
  w.set_uint32("general.quantization_version", 2);
  tokenizer::write_vocab(w, vocab);
  if (o.vocab_only) return w;

  // Each tensor's values come from its own generator (the seed and the tensor's place in the
  // manifest); a tensor of more than kPieceElems values is made in pieces of whole rows, each
  // from its own generator (the seed, the place and the piece), so one large tensor (an 8B
  // model's embedding holds 525M values) does not leave the other threads idle. Pieces are made
  // and quantized in parallel, then the tensors are added in order.
  constexpr int64_t kPieceElems = int64_t{1} << 23;
  struct Job {
    TensorSpec spec;
    quant::Type type = quant::Type::F32;
    std::vector<float> fixed;  // values that are not random (llama3 rope factors)
    std::vector<uint8_t> bytes;
    Status st;
    std::mutex mu;  // guards st
  };
  struct Piece {
    size_t job;
    int64_t row0, rows;
    uint64_t seed;
  };
  std::deque<Job> jobs;
  for (const TensorSpec& spec : tensor_manifest(*arch, hp)) {
    Job& j = jobs.emplace_back();
    j.spec = spec;
    if (spec.name == "rope_freqs.weight" && hf_rope_type(rope) == "llama3") {
      // Not random: the llama3 frequency divisors, as `kiln convert` writes them.
      j.fixed = llama3_rope_factors(rope, hp);
    } else if (!spec.required && !(spec.name == "output.weight" && !hp.tied_embeddings)) {
      jobs.pop_back();
      continue;
    } else {
      j.type = tensor_type(ft, spec, hp);
    }
  }
  std::vector<Piece> pieces;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& j = jobs[i];
    int64_t n = 1;
    for (int64_t d : j.spec.ne) n *= d;
    const int64_t row = j.spec.ne[0];
    const int64_t all_rows = n / row;
    const uint64_t row_bytes = *quant::row_bytes(j.type, static_cast<uint64_t>(row));
    j.bytes.resize(row_bytes * static_cast<uint64_t>(all_rows));
    // The rows made (the rest copied below): the same pieces and generators as a full make.
    const int64_t n_rows = o.distinct_rows > 0 && j.fixed.empty()
                               ? std::min<int64_t>(all_rows, o.distinct_rows)
                               : all_rows;
    const uint64_t seed = o.seed ^ ((i + 1) * 0x9e3779b97f4a7c15ull);
    if (n <= kPieceElems || !j.fixed.empty()) {
      pieces.push_back({i, 0, n_rows, seed});
      continue;
    }
    const int64_t per = std::max<int64_t>(1, kPieceElems / row);
    for (int64_t r = 0, k = 0; r < n_rows; r += per, ++k)
      pieces.push_back({i, r, std::min(per, n_rows - r),
                        seed ^ (static_cast<uint64_t>(k + 1) * 0xbf58476d1ce4e5b9ull)});
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t p; (p = next++) < pieces.size();) {
      const Piece& pc = pieces[p];
      Job& j = jobs[pc.job];
      const int64_t row = j.spec.ne[0];
      Rng rng{pc.seed};
      const std::vector<float> values =
          j.fixed.empty() ? random_values(j.spec, pc.rows * row, rng) : j.fixed;
      const uint64_t row_bytes = *quant::row_bytes(j.type, static_cast<uint64_t>(row));
      Status st;
      for (int64_t r = 0; r < pc.rows && st.ok(); ++r)
        st = quant::quantize_row(j.type, values.data() + r * row,
                                 j.bytes.data() + static_cast<uint64_t>(pc.row0 + r) * row_bytes,
                                 row);
      if (!st.ok()) {
        std::lock_guard lock(j.mu);
        if (j.st.ok()) j.st = std::move(st);
      }
    }
  };
  std::vector<std::thread> threads;
  const unsigned n_threads = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  for (unsigned t = 1; t < n_threads; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  for (Job& j : jobs) {
    KILN_TRY_STATUS(std::move(j.st));
    if (o.distinct_rows > 0 && j.fixed.empty()) {
      // The rows past the first distinct_rows repeat them.
      const uint64_t made =
          *quant::row_bytes(j.type, static_cast<uint64_t>(j.spec.ne[0])) * o.distinct_rows;
      for (uint64_t at = made; at < j.bytes.size(); at += made)
        std::memcpy(j.bytes.data() + at, j.bytes.data(), std::min(made, j.bytes.size() - at));
    }
    KILN_TRY_STATUS(w.add_tensor(j.spec.name, j.type, j.spec.ne, j.bytes));
    std::vector<uint8_t>().swap(j.bytes);
  }
  return w;
}

Status make_model_file(const MakeModelOptions& opts, const std::string& path) {
  KILN_TRY(gguf::Writer w, make_model(opts));
  return w.write_file(path);
}

}  // namespace kiln::model
