// The CPU backend's copy op, and its profiling seam (Backend::set_profiling, profile_take) on a
// real forward step: one class per distinct matmul (or matmuls group) of the file, called once
// per layer, with the bytes of the weights it reads (kiln bench --roofline's table).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <numeric>
#include <random>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/kv/kv_cache.h"
#include "kiln/model/forward.h"
#include "kiln/model/model.h"

namespace kiln::backend::cpu {
namespace {

const std::string kModels = std::string(KILN_SOURCE_DIR) + "/../shared/models/";

TEST(CpuBackendCopy, EqualsMemcpy) {
  CpuBackend be(nullptr);
  std::mt19937 rng(7);
  for (uint64_t n : {uint64_t{1}, uint64_t{63}, uint64_t{4096}, (uint64_t{1} << 20) + 7}) {
    auto src = be.alloc(n);
    auto dst = be.alloc(n + 1);
    ASSERT_TRUE(src.ok() && dst.ok());
    auto* s = static_cast<uint8_t*>((*src)->data());
    auto* d = static_cast<uint8_t*>((*dst)->data());
    for (uint64_t i = 0; i < n; ++i) s[i] = static_cast<uint8_t>(rng());
    std::memset(d, 0xAA, n + 1);
    be.copy(d, s, n);
    be.sync();
    EXPECT_EQ(std::memcmp(d, s, n), 0) << n << " bytes";
    EXPECT_EQ(d[n], 0xAA) << "wrote past " << n << " bytes";
  }
}

TEST(CpuBackendCopy, TimedOnlyWhileProfiling) {
  CpuBackend be(nullptr);
  const uint64_t n = uint64_t{4} << 20;
  auto src = be.alloc(n);
  auto dst = be.alloc(n);
  ASSERT_TRUE(src.ok() && dst.ok());
  std::memset((*src)->data(), 1, n);
  be.copy((*dst)->data(), (*src)->data(), n);
  EXPECT_TRUE(be.profile_take().empty());
  be.set_profiling(true);
  be.copy((*dst)->data(), (*src)->data(), n);
  be.copy((*dst)->data(), (*src)->data(), n);
  const std::vector<OpTime> t = be.profile_take();
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].label, "copy");
  EXPECT_EQ(t[0].calls, 2);
  EXPECT_EQ(t[0].bytes, 2 * n);
  EXPECT_GT(t[0].us, 0);
  EXPECT_TRUE(be.profile_take().empty());  // a take starts the sums again
}

// "f32 64x172": the type, then n_out x n_in (ggml's ne[1] x ne[0]), written here from the
// file's tensor, not by the backend's label function.
std::string label_of(const gguf::TensorInfo& t) {
  return fmt::format("{} {}x{}", quant::type_name(t.type), t.ne[1], t.ne[0]);
}

struct Want {
  int64_t calls = 0;
  uint64_t bytes = 0;
};

// The matmul classes a llama-family step over this file must report: per layer the q/k/v
// group, attn_output, the gate/up group and ffn_down, and the output (the tied embedding
// table when there is no output.weight), each weighing its tensors' bytes per call.
std::map<std::string, Want> expected_classes(const model::Model& m) {
  const gguf::File& f = m.file();
  std::map<std::string, Want> out;
  auto add = [&](std::vector<std::string> names) {
    std::string label;
    uint64_t bytes = 0;
    for (const std::string& n : names) {
      const gguf::TensorInfo* t = f.find_tensor(n);
      EXPECT_NE(t, nullptr) << n;
      if (t == nullptr) return;
      label += (label.empty() ? "" : " + ") + label_of(*t);
      bytes += t->size_bytes;
    }
    out[label].calls += 1;
    out[label].bytes += bytes;
  };
  for (uint32_t il = 0; il < m.hparams().n_layer; ++il) {
    const std::string b = fmt::format("blk.{}.", il);
    add({b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"});
    add({b + "attn_output.weight"});
    add({b + "ffn_gate.weight", b + "ffn_up.weight"});
    add({b + "ffn_down.weight"});
  }
  add({f.find_tensor("output.weight") != nullptr ? "output.weight" : "token_embd.weight"});
  return out;
}

class CpuProfileTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuProfileTest, ForwardStepReportsEachMatmulClass) {
  auto m = model::Model::load(GetParam());
  ASSERT_TRUE(m.ok()) << m.error().message;
  const model::Model& model = **m;
  util::ThreadPool pool(2);
  CpuBackend be(&pool);
  model::ForwardOptions fo;
  fo.max_tokens = 8;
  fo.max_context = 2 * kv::kBlockTokens;
  auto fwd = model::Forward::create(model, be, fo);
  ASSERT_TRUE(fwd.ok()) << fwd.error().message;
  auto kv = be.create_kv(model::kv_spec(model.hparams()), 2);
  ASSERT_TRUE(kv.ok()) << kv.error().message;

  const int32_t n = 5;
  std::vector<int32_t> tokens(n), positions(n);
  for (int32_t i = 0; i < n; ++i) tokens[i] = 1 + 3 * i;
  std::iota(positions.begin(), positions.end(), 0);
  const int32_t qo[2] = {0, n}, kv_ptr[2] = {0, 1}, kv_idx[1] = {0}, kv_len[1] = {n};
  const int32_t rows[1] = {n - 1};
  model::StepInput in;
  in.tokens = tokens;
  in.attn = {1, qo, kv_ptr, kv_idx, kv_len, positions.data()};
  in.logit_rows = rows;
  std::vector<float> logits(model.hparams().n_vocab);

  // Off: nothing is timed.
  ASSERT_TRUE((*fwd)->run(in, **kv, logits.data()).ok());
  EXPECT_TRUE(be.profile_take().empty());

  be.set_profiling(true);
  ASSERT_TRUE((*fwd)->run(in, **kv, logits.data()).ok());
  const std::vector<OpTime> took = be.profile_take();
  be.set_profiling(false);

  const std::map<std::string, Want> want = expected_classes(model);
  const int64_t layers = model.hparams().n_layer;
  std::map<std::string, OpTime> got;
  for (const OpTime& t : took) {
    EXPECT_EQ(got.count(t.label), 0u) << "label twice: " << t.label;
    got[t.label] = t;
    EXPECT_GT(t.us, 0) << t.label;
  }
  ASSERT_EQ(got.count("attention"), 1u);
  EXPECT_EQ(got["attention"].calls, layers);
  EXPECT_EQ(got["attention"].bytes, 0u);
  got.erase("attention");
  EXPECT_EQ(got.size(), want.size());
  uint64_t bytes = 0, want_bytes = 0;
  for (const auto& [label, w] : want) {
    ASSERT_EQ(got.count(label), 1u) << "no class " << label;
    EXPECT_EQ(got[label].calls, w.calls) << label;
    EXPECT_EQ(got[label].bytes, w.bytes) << label;
    bytes += got[label].bytes;
    want_bytes += w.bytes;
  }
  // Every matmul weight of the file once: all tensors but the norms and the embedding table
  // (unless tied: then it is the output).
  uint64_t file_bytes = 0;
  for (const gguf::TensorInfo& t : model.file().tensors()) {
    if (t.ne.size() < 2) continue;  // norms
    if (t.name == "token_embd.weight" && model.file().find_tensor("output.weight") != nullptr)
      continue;
    file_bytes += t.size_bytes;
  }
  EXPECT_EQ(bytes, file_bytes);
  EXPECT_EQ(want_bytes, file_bytes);

  // Off again: the next step is not timed.
  ASSERT_TRUE((*fwd)->run(in, **kv, logits.data()).ok());
  EXPECT_TRUE(be.profile_take().empty());
}

INSTANTIATE_TEST_SUITE_P(Models, CpuProfileTest,
                         ::testing::Values(kModels + "stories260K.gguf",
                                           std::string(KILN_SOURCE_DIR) +
                                               "/models/kiln-tiny.gguf"));

}  // namespace
}  // namespace kiln::backend::cpu
