// CUDA dequantization against the reference quant::dequantize_row: fp32 output bit for bit
// (NaN payloads of the plain types included), fp16 output equal to the reference rounded to
// nearest even, embedding gathers. Blocks are random bytes with random finite f16 scales of
// every magnitude (subnormal to 65504), so extreme scales are covered.
#include <cstring>
#include <random>
#include <vector>

#include "kiln/backend/cuda/kernels.h"
#include "kiln/quant/convert.h"
#include "kiln/quant/fp16.h"
#include "test_util.h"
#include "unit/quant/random_blocks.h"

namespace kiln {
namespace {

using backend::Weight;
using quant::Type;
using quant::testing::RandomLayout;

struct TypeCase {
  Type type;
  RandomLayout layout;  // plain types: one "block" per element, every bit pattern allowed
};

// Offsets of the f16 scale fields (blocks.h); Q8_K has an fp32 d.
const TypeCase kCases[] = {
    {Type::F32, {4, {-1, -1}, -1}},     {Type::F16, {2, {-1, -1}, -1}},
    {Type::BF16, {2, {-1, -1}, -1}},    {Type::Q4_0, {18, {0, -1}, -1}},
    {Type::Q4_1, {20, {0, 2}, -1}},     {Type::Q5_0, {22, {0, -1}, -1}},
    {Type::Q5_1, {24, {0, 2}, -1}},     {Type::Q8_0, {34, {0, -1}, -1}},
    {Type::Q8_1, {36, {0, 2}, -1}},     {Type::Q2_K, {84, {80, 82}, -1}},
    {Type::Q3_K, {110, {108, -1}, -1}}, {Type::Q4_K, {144, {0, 2}, -1}},
    {Type::Q5_K, {176, {0, 2}, -1}},    {Type::Q6_K, {210, {208, -1}, -1}},
    {Type::Q8_K, {292, {-1, -1}, 0}},   {Type::IQ4_NL, {18, {0, -1}, -1}},
    {Type::IQ4_XS, {136, {0, -1}, -1}},
};

uint64_t fresh_seed() {
  return (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
}

// A host weight of n_rows rows of n_in random elements of the case's type.
struct HostWeight {
  std::vector<uint8_t> bytes;
  Weight w;
};
HostWeight random_weight(const TypeCase& c, int64_t n_rows, int64_t n_in, uint64_t seed) {
  const auto& tr = quant::traits(c.type);
  const int64_t blocks = n_rows * n_in / tr.block_elems;
  HostWeight h;
  h.bytes = quant::testing::random_blocks(c.layout, static_cast<int>(blocks), seed);
  h.w.type = c.type;
  h.w.n_in = n_in;
  h.w.n_out = n_rows;
  h.w.row_bytes = *quant::row_bytes(c.type, static_cast<uint64_t>(n_in));
  h.w.data = h.bytes.data();
  return h;
}

// Elements per row for a case: a few blocks (an odd count), and odd for the plain types.
int64_t row_elems(Type t, int k) {
  const auto& tr = quant::traits(t);
  return tr.block_elems == 1 ? 37 + 64 * k : tr.block_elems * (3 + 2 * k);
}

TEST(CudaDequant, SupportsEveryTypeTheReferenceDecodes) {
  for (uint32_t id = 0; id < 64; ++id) {
    const auto tr = quant::traits(id);
    if (!tr) continue;
    EXPECT_EQ(backend::cuda::supports_type(tr->type), quant::can_dequantize(tr->type)) << tr->name;
  }
}

TEST(CudaDequant, F32BitExactWithReference) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  for (const TypeCase& c : kCases) {
    for (int k = 0; k < 2; ++k) {
      SCOPED_TRACE(testing::Message()
                   << quant::type_name(c.type) << " k=" << k << " seed=" << seed);
      const int64_t n_in = row_elems(c.type, k), n_rows_total = 11, row0 = 3, n_rows = 7;
      HostWeight h = random_weight(c, n_rows_total, n_in, seed + k);
      test::DeviceVec<uint8_t> dw(h.bytes);
      Weight w = h.w;
      w.data = dw.get();
      test::DeviceVec<float> out(static_cast<size_t>(n_rows * n_in + 5));
      KILN_CUDA_OK(cudaMemset(out.get(), 0xff, (n_rows * n_in + 5) * sizeof(float)));  // NaN
      backend::cuda::dequantize_rows_f32(w, row0, n_rows, out.get(), nullptr);
      KILN_CUDA_OK(cudaDeviceSynchronize());
      const std::vector<float> got = out.to_host();
      std::vector<float> ref(static_cast<size_t>(n_in));
      for (int64_t r = 0; r < n_rows; ++r) {
        ASSERT_TRUE(quant::dequantize_row(c.type, h.w.row(row0 + r), ref.data(), n_in).ok());
        ASSERT_EQ(0, std::memcmp(ref.data(), got.data() + r * n_in, n_in * sizeof(float)))
            << "row " << r;
      }
      uint32_t tail;  // nothing written past the rows
      std::memcpy(&tail, &got[n_rows * n_in], 4);
      EXPECT_EQ(tail, 0xffffffffu);
    }
  }
}

TEST(CudaDequant, F16IsReferenceRoundedToNearestEven) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  for (const TypeCase& c : kCases) {
    SCOPED_TRACE(testing::Message() << quant::type_name(c.type) << " seed=" << seed);
    const int64_t n_in = row_elems(c.type, 1), n_rows = 5;
    HostWeight h = random_weight(c, n_rows + 2, n_in, seed);
    test::DeviceVec<uint8_t> dw(h.bytes);
    Weight w = h.w;
    w.data = dw.get();
    test::DeviceVec<uint16_t> out(static_cast<size_t>(n_rows * n_in));
    KILN_CUDA_OK(cudaMemset(out.get(), 0xff, n_rows * n_in * sizeof(uint16_t)));
    backend::cuda::dequantize_rows_f16(w, 2, n_rows, out.get(), nullptr);
    KILN_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint16_t> got = out.to_host();
    std::vector<float> ref(static_cast<size_t>(n_in));
    int64_t bad = 0;
    for (int64_t r = 0; r < n_rows; ++r) {
      ASSERT_TRUE(quant::dequantize_row(c.type, h.w.row(2 + r), ref.data(), n_in).ok());
      for (int64_t i = 0; i < n_in; ++i) {
        const uint16_t g = got[r * n_in + i];
        const bool g_nan = (g & 0x7c00) == 0x7c00 && (g & 0x3ff) != 0;
        if (std::isnan(ref[i])) {
          bad += !g_nan;
        } else {
          bad += g != quant::fp32_to_fp16(ref[i]);
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

// The CTA-per-row kernel (KILN_CUDA_DEQUANT_ROWS, rows of 2,048+ values) writes the flat
// kernel's values, fp32 and fp16, for rows of one chunk width and of a down projection's, a
// ragged row count, and gathered rows.
TEST(CudaDequant, RowCtasEqualTheFlatKernel) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  for (const TypeCase& c : kCases) {
    const auto& tr = quant::traits(c.type);
    for (int64_t n_in : {int64_t{4096}, int64_t{14336}, int64_t{512}}) {
      if (n_in % tr.block_elems != 0) continue;
      SCOPED_TRACE(testing::Message()
                   << quant::type_name(c.type) << " n_in=" << n_in << " seed=" << seed);
      const int64_t n_rows = 37;
      HostWeight h = random_weight(c, n_rows + 3, n_in, seed);
      test::DeviceVec<uint8_t> dw(h.bytes);
      Weight w = h.w;
      w.data = dw.get();
      const std::vector<int32_t> ids = {5, 0, 39, 5, 12};
      test::DeviceVec<int32_t> did(ids);
      std::vector<float> f32[2], gathered[2];
      std::vector<uint16_t> f16[2];
      for (int rows = 0; rows < 2; ++rows) {
        backend::cuda::dequant_set_row_ctas(rows == 1);
        test::DeviceVec<float> o32(static_cast<size_t>(n_rows * n_in));
        test::DeviceVec<uint16_t> o16(static_cast<size_t>(n_rows * n_in));
        test::DeviceVec<float> og(ids.size() * static_cast<size_t>(n_in));
        backend::cuda::dequantize_rows_f32(w, 3, n_rows, o32.get(), nullptr);
        backend::cuda::dequantize_rows_f16(w, 3, n_rows, o16.get(), nullptr);
        backend::cuda::embed(w, did.get(), static_cast<int64_t>(ids.size()), og.get(), nullptr);
        KILN_CUDA_OK(cudaDeviceSynchronize());
        f32[rows] = o32.to_host();
        f16[rows] = o16.to_host();
        gathered[rows] = og.to_host();
      }
      backend::cuda::dequant_set_row_ctas(false);
      EXPECT_EQ(0, std::memcmp(f32[0].data(), f32[1].data(), f32[0].size() * sizeof(float)));
      EXPECT_EQ(f16[0], f16[1]);
      EXPECT_EQ(0, std::memcmp(gathered[0].data(), gathered[1].data(),
                               gathered[0].size() * sizeof(float)));
    }
  }
}

TEST(CudaDequant, EmbedGathersRowsBitExact) {
  KILN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (const TypeCase& c : kCases) {
    SCOPED_TRACE(testing::Message() << quant::type_name(c.type) << " seed=" << seed);
    const int64_t n_in = row_elems(c.type, 0), vocab = 13, n_tokens = 9;
    HostWeight h = random_weight(c, vocab, n_in, seed);
    test::DeviceVec<uint8_t> dw(h.bytes);
    Weight w = h.w;
    w.data = dw.get();
    std::vector<int32_t> tokens(n_tokens);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % vocab);
    tokens[1] = tokens[0];  // a repeat
    tokens[2] = vocab - 1;  // the last row
    test::DeviceVec<int32_t> dt(tokens);
    test::DeviceVec<float> out(static_cast<size_t>(n_tokens * n_in));
    KILN_CUDA_OK(cudaMemset(out.get(), 0xff, n_tokens * n_in * sizeof(float)));
    backend::cuda::embed(w, dt.get(), n_tokens, out.get(), nullptr);
    KILN_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> got = out.to_host();
    std::vector<float> ref(static_cast<size_t>(n_in));
    for (int64_t t = 0; t < n_tokens; ++t) {
      ASSERT_TRUE(quant::dequantize_row(c.type, h.w.row(tokens[t]), ref.data(), n_in).ok());
      ASSERT_EQ(0, std::memcmp(ref.data(), got.data() + t * n_in, n_in * sizeof(float)))
          << "token " << t;
    }
  }
}

}  // namespace
}  // namespace kiln
