// Pooling types (llama.cpp's enum and spellings), the accumulator over chunks, the L2 norm,
// and <arch>.pooling_type through GGUF metadata.
#include "kiln/model/pooling.h"

#include <gtest/gtest.h>

#include "kiln/gguf/gguf.h"
#include "kiln/model/hparams.h"

namespace kiln::model {
namespace {

TEST(Pooling, NamesAndLlamaCppValues) {
  EXPECT_EQ(static_cast<uint32_t>(Pooling::kMean), 1u);
  EXPECT_EQ(static_cast<uint32_t>(Pooling::kCls), 2u);
  EXPECT_EQ(static_cast<uint32_t>(Pooling::kLast), 3u);
  EXPECT_EQ(static_cast<uint32_t>(Pooling::kRank), 4u);
  for (const char* n : {"none", "mean", "cls", "last", "rank"}) {
    auto p = parse_pooling(n);
    ASSERT_TRUE(p.ok()) << n;
    EXPECT_EQ(pooling_name(*p), n);
  }
  EXPECT_FALSE(parse_pooling("max").ok());
}

TEST(Pooling, WantedRowsPerSlice) {
  std::vector<int32_t> rows;
  // A 10-token sequence computed as slices [0, 4) at flat row 5 and [4, 10) at flat row 0.
  PoolAccumulator::wanted_rows(Pooling::kMean, 0, 4, 10, 5, &rows);
  EXPECT_EQ(rows, (std::vector<int32_t>{5, 6, 7, 8}));
  rows.clear();
  PoolAccumulator::wanted_rows(Pooling::kCls, 0, 4, 10, 5, &rows);
  PoolAccumulator::wanted_rows(Pooling::kCls, 4, 6, 10, 0, &rows);
  EXPECT_EQ(rows, (std::vector<int32_t>{5}));
  rows.clear();
  PoolAccumulator::wanted_rows(Pooling::kLast, 0, 4, 10, 5, &rows);
  PoolAccumulator::wanted_rows(Pooling::kLast, 4, 6, 10, 0, &rows);
  EXPECT_EQ(rows, (std::vector<int32_t>{5}));
  rows.clear();
  PoolAccumulator::wanted_rows(Pooling::kNone, 0, 10, 10, 0, &rows);
  EXPECT_TRUE(rows.empty());
}

TEST(Pooling, AccumulatorMeanClsLastAndReset) {
  const std::vector<float> a = {1, 2}, b = {3, -6}, c = {5, 1};
  PoolAccumulator mean(Pooling::kMean, 2);
  EXPECT_TRUE(mean.result().empty());
  mean.add(a);
  mean.add(b);
  mean.add(c);
  EXPECT_EQ(mean.result(), (std::vector<float>{3, -1}));
  mean.reset();  // recomputed from position 0
  mean.add(c);
  EXPECT_EQ(mean.result(), c);
  PoolAccumulator last(Pooling::kLast, 2);
  last.add(b);
  EXPECT_EQ(last.result(), b);
}

TEST(Pooling, L2Normalize) {
  std::vector<float> v = {3, 4};
  l2_normalize(v);
  EXPECT_FLOAT_EQ(v[0], 0.6f);
  EXPECT_FLOAT_EQ(v[1], 0.8f);
  std::vector<float> z = {0, 0};
  l2_normalize(z);
  EXPECT_EQ(z, (std::vector<float>{0, 0}));
}

TEST(Pooling, PoolingTypeKeyRoundTrips) {
  HParams hp;
  hp.arch = "qwen3";
  hp.n_vocab = 16;
  hp.n_ctx_train = 64;
  hp.n_embd = 8;
  hp.n_layer = 1;
  hp.n_head = 2;
  hp.n_head_kv = 1;
  hp.n_ff = 16;
  hp.head_dim_k = hp.head_dim_v = hp.n_rot = 4;
  for (Pooling p : {Pooling::kNone, Pooling::kLast, Pooling::kMean}) {
    hp.pooling = p;
    gguf::Writer w;
    write_hparams(w, hp);
    auto bytes = w.to_bytes();
    ASSERT_TRUE(bytes.ok());
    auto f = gguf::File::parse(*bytes);
    ASSERT_TRUE(f.ok()) << f.error().message;
    EXPECT_EQ((*f)->find("qwen3.pooling_type") != nullptr, p != Pooling::kNone);
    auto back = read_hparams(**f);
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(back->pooling, p);
  }
}

}  // namespace
}  // namespace kiln::model
