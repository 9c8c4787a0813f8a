// matvec_id (matmul_id's few-pair decode form) against matvec_q8 of each pair's expert matrix
// on its activation row: bit for bit (the same dot products and reduction), for every type the
// int8 matvec takes; pairs with an id outside the experts leave their output rows untouched.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kiln/backend/cuda/kernels.h"
#include "kiln/quant/convert.h"
#include "test_util.h"

namespace kiln {
namespace {

using backend::Weight;
using quant::Type;

TEST(CudaMatvecId, EachPairIsTheMatvecOfItsExpert) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(91);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n_expert = 6, n_out = 42, n_in = 512, n_rows = 3;
  // Pairs: rows shared by several experts, an expert used twice, two invalid ids.
  const std::vector<int32_t> ids = {4, 0, 5, 4, -1, 2, 6, 1, 3};
  const std::vector<int32_t> x_rows = {0, 0, 1, 2, 1, 2, 0, 1, 2};
  const int64_t n_pairs = static_cast<int64_t>(ids.size());
  for (Type type : {Type::Q4_0, Type::Q8_0, Type::Q4_K, Type::Q5_K, Type::Q6_K}) {
    SCOPED_TRACE(quant::type_name(type));
    const uint64_t rb = *quant::row_bytes(type, static_cast<uint64_t>(n_in));
    std::vector<uint8_t> wb(rb * n_expert * n_out);
    std::vector<float> f(static_cast<size_t>(n_in));
    for (int64_t r = 0; r < n_expert * n_out; ++r) {
      for (float& v : f) v = 0.05f * nd(rng);
      ASSERT_TRUE(quant::quantize_row(type, f.data(), wb.data() + r * rb, n_in).ok());
    }
    std::vector<float> x(static_cast<size_t>(n_rows * n_in));
    for (float& v : x) v = nd(rng);
    test::DeviceVec<uint8_t> dw(wb);
    test::DeviceVec<float> dx(x);
    test::DeviceVec<int8_t> xq(static_cast<size_t>(n_rows * n_in));
    test::DeviceVec<float2> xds(static_cast<size_t>(n_rows * n_in / 32));
    test::DeviceVec<int32_t> dids(ids), drows(x_rows);
    const std::vector<float> sentinel(static_cast<size_t>(n_pairs * n_out), 1234.5f);
    test::DeviceVec<float> y(sentinel);
    Weight stacked;
    stacked.type = type;
    stacked.n_in = n_in;
    stacked.n_out = n_out;
    stacked.row_bytes = rb;
    stacked.data = dw.get();
    stacked.n_mats = n_expert;
    backend::cuda::quantize_q8_32(dx.get(), n_rows, n_in, xq.get(), xds.get(), nullptr);
    ASSERT_TRUE(backend::cuda::matvec_id(stacked, n_expert, xq.get(), xds.get(), drows.get(),
                                         dids.get(), y.get(), n_pairs, nullptr));
    KILN_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> got = y.to_host();
    for (int64_t p = 0; p < n_pairs; ++p) {
      const int32_t e = ids[p];
      std::vector<float> want(sentinel.begin(), sentinel.begin() + n_out);
      if (e >= 0 && e < n_expert) {
        const Weight w = backend::expert(stacked, e);
        test::DeviceVec<float> yr(static_cast<size_t>(n_out));
        const Weight* ws[1] = {&w};
        float* ys[1] = {yr.get()};
        backend::cuda::matvec_q8(ws, ys, 1, xq.get() + x_rows[p] * n_in,
                                 xds.get() + x_rows[p] * (n_in / 32), 1, nullptr);
        KILN_CUDA_OK(cudaDeviceSynchronize());
        want = yr.to_host();
      }
      for (int64_t o = 0; o < n_out; ++o)
        ASSERT_EQ(std::memcmp(&got[p * n_out + o], &want[o], sizeof(float)), 0)
            << "pair " << p << " (expert " << e << ") row " << o << ": " << got[p * n_out + o]
            << " vs " << want[o];
    }
  }
}

}  // namespace
}  // namespace kiln
