// A GGUF file written by another implementation (llama.cpp's converter): stories260K from
// ../shared/models (see its README). kiln must read it, and rewriting it with kiln's writer
// must give back the same bytes, which pins the writer's layout to ggml's.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "kiln/gguf/gguf.h"
#include "kiln/gguf/writer.h"

namespace kiln::gguf {
namespace {

const std::string kStories = std::string(KILN_SOURCE_DIR) + "/../shared/models/stories260K.gguf";

TEST(GgufInterop, ReadsStories260K) {
  auto opened = File::open(kStories);
  ASSERT_TRUE(opened.ok()) << opened.error().message << " (CI lays shared/ beside the checkout)";
  const File& f = **opened;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  // Hyperparameters as the model's README states them.
  EXPECT_EQ(*f.get_string("general.architecture"), "llama");
  EXPECT_EQ(*f.get_uint("llama.embedding_length"), 64u);
  EXPECT_EQ(*f.get_uint("llama.block_count"), 5u);
  EXPECT_EQ(*f.get_uint("llama.attention.head_count"), 8u);
  EXPECT_EQ(*f.get_uint("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(*f.get_string("tokenizer.ggml.model"), "llama");
  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 512u);
  EXPECT_EQ((*tokens)[0], "<unk>");
  EXPECT_EQ((*tokens)[1], "<s>");
  EXPECT_EQ((*tokens)[2], "</s>");
  EXPECT_EQ(f.get_float_array("tokenizer.ggml.scores")->size(), 512u);
  EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type")->size(), 512u);
  EXPECT_EQ(static_cast<float>(*f.get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);

  // 5 layers x 9 tensors + token_embd, output_norm, output; all F32.
  ASSERT_EQ(f.tensors().size(), 48u);
  const TensorInfo* embd = f.find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->ne, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(embd->size_bytes, 64u * 512 * 4);
  const TensorInfo* down = f.find_tensor("blk.4.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->ne, (std::vector<int64_t>{172, 64}));
  uint64_t total_bytes = 0;
  for (const TensorInfo& t : f.tensors()) {
    EXPECT_EQ(t.type, quant::Type::F32) << t.name;
    EXPECT_EQ(t.size_bytes, static_cast<uint64_t>(t.num_elements()) * 4) << t.name;
    total_bytes += t.size_bytes;
  }
  // Every byte after the header belongs to exactly one tensor (no gaps: all sizes are
  // multiples of 32), so the data section is the tensors back to back.
  EXPECT_EQ(f.data_offset() + total_bytes, f.size_bytes());
}

TEST(GgufInterop, RewritingStories260KGivesTheSameBytes) {
  auto opened = File::open(kStories);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  const File& f = **opened;
  Writer w;
  for (const KeyValue& kv : f.metadata()) w.set(kv.key, kv.value);
  for (const TensorInfo& t : f.tensors()) {
    ASSERT_TRUE(w.add_tensor(t.name, t.type, t.ne, t.bytes()).ok()) << t.name;
  }
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes.ok()) << bytes.error().message;
  ASSERT_EQ(bytes->size(), f.size_bytes());
  auto original = util::MappedFile::open(kStories);
  ASSERT_TRUE(original.ok());
  EXPECT_EQ(0, std::memcmp(bytes->data(), original->data(), bytes->size()));
}

// Every prefix of the first KiB, every 13th through the header (the vocab arrays make each
// parse cost ~100 us), then a sample of longer ones: all errors, each parsed from an exactly sized
// buffer so ASan sees any overread.
TEST(GgufInterop, TruncatedStories260KIsAnError) {
  auto original = util::MappedFile::open(kStories);
  ASSERT_TRUE(original.ok()) << original.error().message;
  const std::span<const uint8_t> all = original->bytes();
  auto full = File::parse(all);
  ASSERT_TRUE(full.ok());
  const size_t header_end = (*full)->data_offset() + 64;
  int num_checked = 0;
  for (size_t len = 0; len < all.size(); len += (len < 1024 ? 1 : len < header_end ? 13 : 4099)) {
    std::vector<uint8_t> prefix(all.begin(), all.begin() + static_cast<ptrdiff_t>(len));
    auto f = File::parse(prefix);
    EXPECT_FALSE(f.ok()) << "prefix of " << len << " bytes parsed";
    ++num_checked;
  }
  EXPECT_GT(num_checked, 2000);
}

}  // namespace
}  // namespace kiln::gguf
