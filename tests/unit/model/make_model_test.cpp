// kiln make-model's --distinct-rows (benchmark files made fast): each tensor's rows past the
// first N repeat those N rows, and the first N are the rows a full make of the same seed has.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "forward_util.h"
#include "kiln/gguf/gguf.h"
#include "kiln/model/make_model.h"

namespace kiln::model {
namespace {

TEST(MakeModel, DistinctRowsRepeatTheFirstRows) {
  const std::string tok = llama3_tokenizer_dir();
  if (!std::filesystem::exists(tok + "/tokenizer.json")) GTEST_SKIP() << "no tokenizer in " << tok;
  MakeModelOptions o;
  o.tokenizer_dir = tok;
  o.type = "q8_0";
  o.n_layer = 1;
  o.n_embd = 256;
  o.n_ff = 512;
  const auto dir = std::filesystem::temp_directory_path();
  const std::string full = (dir / "kiln-make-full.gguf").string();
  const std::string fast = (dir / "kiln-make-fast.gguf").string();
  ASSERT_TRUE(make_model_file(o, full).ok());
  o.distinct_rows = 3;
  ASSERT_TRUE(make_model_file(o, fast).ok());
  auto a = gguf::File::open(full);
  auto b = gguf::File::open(fast);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ((*a)->tensors().size(), (*b)->tensors().size());
  int checked = 0;
  for (const gguf::TensorInfo& t : (*b)->tensors()) {
    const gguf::TensorInfo* r = (*a)->find_tensor(t.name);
    ASSERT_NE(r, nullptr) << t.name;
    ASSERT_EQ(r->size_bytes, t.size_bytes) << t.name;
    const int64_t rows = t.num_elements() / t.ne[0];
    const uint64_t row_bytes = t.size_bytes / static_cast<uint64_t>(rows);
    if (rows <= 3) {
      EXPECT_EQ(std::memcmp(r->data, t.data, t.size_bytes), 0) << t.name;
      continue;
    }
    // The first 3 rows as the full make has them, distinct; every later row a copy of row i % 3.
    EXPECT_EQ(std::memcmp(r->data, t.data, 3 * row_bytes), 0) << t.name;
    EXPECT_NE(std::memcmp(t.data, t.data + row_bytes, row_bytes), 0) << t.name;
    for (int64_t i = 3; i < rows; ++i)
      ASSERT_EQ(std::memcmp(t.data + i * row_bytes, t.data + (i % 3) * row_bytes, row_bytes), 0)
          << t.name << " row " << i;
    ++checked;
  }
  EXPECT_GT(checked, 5);
  std::filesystem::remove(full);
  std::filesystem::remove(fast);
}

}  // namespace
}  // namespace kiln::model
