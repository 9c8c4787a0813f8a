// The CPU backend's KV storage (sizes per type, errors, the layout's one definition) and its
// memory plan inputs.
#include "kiln/backend/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <cstddef>

namespace kiln::backend::cpu {
namespace {

using quant::Type;

KvSpec spec(int32_t layers, int32_t heads, int32_t dk, int32_t dv, Type t) {
  KvSpec s;
  s.n_layer = layers;
  s.n_kv_heads = heads;
  s.head_dim_k = dk;
  s.head_dim_v = dv;
  s.type = t;
  return s;
}

TEST(CpuKvCache, BytesPerBlockFollowTheType) {
  CpuBackend be(nullptr);
  KvSpec s = spec(28, 8, 128, 128, Type::F32);
  // layers * 16 tokens * kv heads * (dk + dv) * bytes per element
  EXPECT_EQ(be.kv_bytes_per_block(s), 28ull * 16 * 8 * 256 * 4);
  s.type = Type::F16;
  EXPECT_EQ(be.kv_bytes_per_block(s), 28ull * 16 * 8 * 256 * 2);
  s.type = Type::Q8_0;  // 34 bytes per 32 values
  EXPECT_EQ(be.kv_bytes_per_block(s), 28ull * 16 * 8 * (256 / 32) * 34);
}

TEST(CpuKvCache, LayersAndBlocksAreAdjacent) {
  CpuBackend be(nullptr);
  for (Type t : {Type::F32, Type::F16, Type::Q8_0}) {
    const KvSpec s = spec(2, 2, 64, 32, t);
    auto c = be.create_kv(s, 10);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ((*c)->num_blocks(), 10);
    EXPECT_EQ((*c)->type(), t);
    const KvLayerView l0 = CpuBackend::layer_view(**c, 0), l1 = CpuBackend::layer_view(**c, 1);
    EXPECT_EQ(static_cast<uint64_t>(l0.k_block_bytes + l0.v_block_bytes) * 2,
              be.kv_bytes_per_block(s));
    EXPECT_EQ(l1.k - l0.k, static_cast<ptrdiff_t>(l0.k_block_bytes * 10));
    EXPECT_EQ(l1.v - l0.v, static_cast<ptrdiff_t>(l0.v_block_bytes * 10));
    // Fresh storage reads back as zeros.
    std::vector<float> row(64, 1.0f);
    (*c)->read(true, 1, 9, 15, 1, row.data());
    EXPECT_EQ(row, std::vector<float>(64, 0.0f));
  }
}

TEST(CpuKvCache, ClearErrors) {
  CpuBackend be(nullptr);
  auto q = be.create_kv(spec(2, 2, 16, 16, Type::Q8_0), 4);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.error().message.find("multiples of 32"), std::string::npos) << q.error().message;
  EXPECT_EQ(be.kv_bytes_per_block(spec(2, 2, 16, 16, Type::Q8_0)), 0u);
  auto bad = be.create_kv(spec(2, 2, 64, 64, Type::Q4_K), 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("f16, f32 or q8_0"), std::string::npos);
  EXPECT_FALSE(be.create_kv(spec(2, 2, 64, 64, Type::F16), 0).ok());
  EXPECT_FALSE(be.create_kv(spec(0, 2, 64, 64, Type::F16), 4).ok());
}

TEST(CpuBackend, PreparedWeightsArePackedOnceAndRowsStayAsStored) {
  CpuBackend be(nullptr);
  std::vector<uint8_t> bytes(static_cast<size_t>(64) * 34 * 2, 0);  // Q8_0 [64 in, 64 out]
  Weight w{Type::Q8_0, 64, 64, bytes.data(), 68};
  auto a = be.prepare_weight(w, Backend::WeightUse::kMatmul);
  auto b = be.prepare_weight(w, Backend::WeightUse::kMatmul);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->prepared, b->prepared);  // one copy per file tensor
  EXPECT_EQ(a->data, w.data);           // the rows stay readable as stored
  if (packing_enabled() && pack_rows(best_kernel_path()) > 0) {
    EXPECT_NE(a->prepared, nullptr);
    EXPECT_EQ(be.prepared_bytes(), packed_bytes(w, pack_rows(best_kernel_path())));
  }
  auto rows = be.prepare_weight(w, Backend::WeightUse::kRows);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->prepared, nullptr);
}

}  // namespace
}  // namespace kiln::backend::cpu
