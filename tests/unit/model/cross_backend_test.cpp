// The CPU and a GPU backend agree token for token: random-weight Llama- and Qwen3-shaped models
// with F32 weights (made by make-model with the Llama 3 tokenizer) decode greedily to the same
// 128 tokens on both. Runs where KILN_TEST_DEVICE names a GPU backend (tools/cuda_check.sh);
// skipped on the CPU-only machines, and where the tokenizer is missing (it comes from
// node_modules, or KILN_TEST_LLAMA3_TOKENIZER names its folder).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "forward_util.h"
#include "kiln/engine/sequence.h"
#include "kiln/model/make_model.h"
#include "kiln/util/thread_pool.h"

namespace kiln::model {
namespace {

std::vector<int32_t> greedy(const Model& m, backend::Backend& be, int n) {
  auto seq = engine::SequenceRunner::create(m, be, 1024);
  EXPECT_TRUE(seq.ok()) << seq.error().message;
  if (!seq.ok()) return {};
  std::vector<int32_t> out;
  std::vector<int32_t> next = {128000, 791, 4062, 14198, 39935, 35308, 927};
  for (int i = 0; i < n; ++i) {
    auto logits = (*seq)->append(next);
    EXPECT_TRUE(logits.ok()) << logits.error().message;
    if (!logits.ok()) break;
    const int32_t tok =
        static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    out.push_back(tok);
    next = {tok};
  }
  return out;
}

TEST(CrossBackend, RandomF32ModelsGreedyEqualTheCpu) {
  if (test_device() == "cpu") GTEST_SKIP() << "set KILN_TEST_DEVICE to a GPU backend";
  const std::string tok = llama3_tokenizer_dir();
  if (!std::filesystem::exists(tok + "/tokenizer.json"))
    GTEST_SKIP() << "no Llama 3 tokenizer.json in " << tok;
  for (const char* arch : {"llama", "qwen3"}) {
    SCOPED_TRACE(arch);
    MakeModelOptions o;
    o.arch = arch;
    o.tokenizer_dir = tok;
    o.type = "f32";
    o.n_layer = 2;
    o.n_embd = 256;
    o.n_head = 4;
    o.n_head_kv = 2;
    o.n_ff = 512;
    o.seed = 7;
    const std::string path =
        (std::filesystem::temp_directory_path() / (std::string("kiln-cross-") + arch + ".gguf"))
            .string();
    const Status made = make_model_file(o, path);
    ASSERT_TRUE(made.ok()) << made.error().message;
    auto model = Model::load(path);
    ASSERT_TRUE(model.ok()) << model.error().message;
    util::ThreadPool pool(2);
    backend::cpu::CpuBackend cpu(&pool);
    const std::vector<int32_t> want = greedy(**model, cpu, 128);
    auto dev = test_backend();
    const std::vector<int32_t> got = greedy(**model, *dev, 128);
    EXPECT_EQ(want.size(), 128u);
    EXPECT_EQ(got, want) << dev->name() << " against the CPU";
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace kiln::model
