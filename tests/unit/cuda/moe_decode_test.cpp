// The fused MoE decode kernels (moe_decode.cu, matvec_id_pair) against the kernels they
// replace, bit for bit:
//  - matvec_id_pair: each of its two outputs matvec_id's on that weight;
//  - moe_down_combine: matvec_id (pair p on row p) then moe_combine;
//  - moe_route, quantized router: its logits matvec_q8's and its routing moe_topk's on them;
//    F32 router: logits within 1e-5 of the row's |w| . |x| of the fp64 dot product (a warp's
//    fp32 sum in another order than the direct kernel's), the routing moe_topk's on them;
//    launched again (its ticket put back) with the same result.
// For every type the int8 matvec takes, rows of half a warp (<= 16 parts) and of a warp, 1-8
// tokens, k of 1 to 8, expert counts that do not fill a CTA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kiln/backend/cuda/kernels.h"
#include "kiln/quant/convert.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace cuda = backend::cuda;
using backend::Weight;
using quant::Type;
using test::DeviceVec;

constexpr Type kTypes[] = {Type::Q4_0, Type::Q8_0, Type::Q4_K, Type::Q5_K, Type::Q6_K};

// n_mats stacked matrices of n_out x n_in random weights quantized to type, on the device.
struct Stacked {
  Weight w;
  std::unique_ptr<DeviceVec<uint8_t>> bytes;
};
Stacked make_stacked(std::mt19937_64& rng, Type type, int64_t n_mats, int64_t n_out, int64_t n_in) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const uint64_t rb = *quant::row_bytes(type, static_cast<uint64_t>(n_in));
  std::vector<uint8_t> host(rb * n_mats * n_out);
  std::vector<float> f(static_cast<size_t>(n_in));
  for (int64_t r = 0; r < n_mats * n_out; ++r) {
    for (float& v : f) v = 0.05f * nd(rng);
    EXPECT_TRUE(quant::quantize_row(type, f.data(), host.data() + r * rb, n_in).ok());
  }
  Stacked s;
  s.bytes = std::make_unique<DeviceVec<uint8_t>>(host);
  s.w.type = type;
  s.w.n_in = n_in;
  s.w.n_out = n_out;
  s.w.row_bytes = rb;
  s.w.data = s.bytes->get();
  s.w.n_mats = n_mats;
  return s;
}

// x [n_rows, n_in] random, quantized on the device.
struct Act {
  std::vector<float> host;
  std::unique_ptr<DeviceVec<float>> x;
  std::unique_ptr<DeviceVec<int8_t>> xq;
  std::unique_ptr<DeviceVec<float2>> xds;
};
Act make_act(std::mt19937_64& rng, int64_t n_rows, int64_t n_in) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Act a;
  a.host.resize(static_cast<size_t>(n_rows * n_in));
  for (float& v : a.host) v = nd(rng);
  a.x = std::make_unique<DeviceVec<float>>(a.host);
  a.xq = std::make_unique<DeviceVec<int8_t>>(static_cast<size_t>(n_rows * n_in));
  a.xds = std::make_unique<DeviceVec<float2>>(static_cast<size_t>(n_rows * n_in / 32));
  cuda::quantize_q8_32(a.x->get(), n_rows, n_in, a.xq->get(), a.xds->get(), nullptr);
  return a;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
        << what << " [" << i << "]: " << got[i] << " vs " << want[i];
}

TEST(CudaMoeDecode, PairIsTwoMatvecIds) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(101);
  const int64_t n_expert = 5, n_out = 44, n_rows = 3;
  const std::vector<int32_t> ids = {4, 0, 2, 4, 1, 3, 0};
  const std::vector<int32_t> x_rows = {0, 1, 2, 2, 0, 1, 1};
  const int64_t pairs = static_cast<int64_t>(ids.size());
  for (Type type : kTypes) {
    for (int64_t n_in : {512, 4096}) {  // half-warp rows (Q4_K: 8 parts), whole-warp rows
      const std::string what =
          std::string(quant::type_name(type)) + " n_in " + std::to_string(n_in);
      const Stacked g = make_stacked(rng, type, n_expert, n_out, n_in);
      const Stacked u = make_stacked(rng, type, n_expert, n_out, n_in);
      const Act x = make_act(rng, n_rows, n_in);
      DeviceVec<int32_t> dids(ids), drows(x_rows);
      DeviceVec<float> yg(pairs * n_out), yu(pairs * n_out), wg(pairs * n_out), wu(pairs * n_out);
      ASSERT_TRUE(cuda::matvec_id_pair(g.w, u.w, n_expert, x.xq->get(), x.xds->get(), drows.get(),
                                       dids.get(), yg.get(), yu.get(), pairs, nullptr));
      ASSERT_TRUE(cuda::matvec_id(g.w, n_expert, x.xq->get(), x.xds->get(), drows.get(), dids.get(),
                                  wg.get(), pairs, nullptr));
      ASSERT_TRUE(cuda::matvec_id(u.w, n_expert, x.xq->get(), x.xds->get(), drows.get(), dids.get(),
                                  wu.get(), pairs, nullptr));
      KILN_CUDA_OK(cudaDeviceSynchronize());
      expect_same_bits(yg.to_host(), wg.to_host(), what + " gate");
      expect_same_bits(yu.to_host(), wu.to_host(), what + " up");
    }
  }
}

TEST(CudaMoeDecode, DownCombineIsMatvecIdThenCombine) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(102);
  struct Case {
    int64_t n_tokens;
    int32_t k;
    int64_t n_expert, n_out, n_in;
  };
  // Qwen3-30B-A3B's down (768 -> 2048, k 8) at a smaller width; k = 2 (several rows a CTA), 3
  // (rows that do not divide the workers), 1; whole-warp rows.
  for (const Case& c :
       {Case{1, 8, 16, 200, 768}, Case{5, 8, 16, 67, 768}, Case{3, 2, 8, 41, 512},
        Case{2, 3, 6, 35, 1024}, Case{8, 1, 4, 18, 256}, Case{2, 8, 12, 30, 4096}}) {
    for (Type type : kTypes) {
      if (c.n_in % quant::traits(type).block_elems != 0) continue;
      const std::string what = std::string(quant::type_name(type)) + " t" +
                               std::to_string(c.n_tokens) + " k" + std::to_string(c.k) + " n_in " +
                               std::to_string(c.n_in);
      const int64_t pairs = c.n_tokens * c.k;
      const Stacked d = make_stacked(rng, type, c.n_expert, c.n_out, c.n_in);
      const Act x = make_act(rng, pairs, c.n_in);
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.n_expert - 1));
      std::uniform_real_distribution<float> wd(0.0f, 1.0f);
      std::vector<int32_t> ids(pairs), iota(pairs);
      std::vector<float> weights(pairs);
      for (int64_t p = 0; p < pairs; ++p) {
        ids[p] = pick(rng);
        iota[p] = static_cast<int32_t>(p);
        weights[p] = wd(rng);
      }
      if (pairs > 2) ids[1] = -1;  // an id outside the experts adds 0
      DeviceVec<int32_t> dids(ids), drows(iota);
      DeviceVec<float> dw(weights), slots(pairs * c.n_out), want(c.n_tokens * c.n_out),
          got(c.n_tokens * c.n_out);
      ASSERT_TRUE(cuda::matvec_id(d.w, c.n_expert, x.xq->get(), x.xds->get(), drows.get(),
                                  dids.get(), slots.get(), pairs, nullptr));
      cuda::moe_combine(slots.get(), dw.get(), c.n_tokens, c.k, c.n_out, want.get(), nullptr);
      ASSERT_TRUE(cuda::moe_down_combine(d.w, c.n_expert, x.xq->get(), x.xds->get(), nullptr,
                                         dids.get(), dw.get(), c.n_tokens, c.k, got.get(),
                                         nullptr));
      KILN_CUDA_OK(cudaDeviceSynchronize());
      expect_same_bits(got.to_host(), want.to_host(), what);
      // The same with the rows given (x_rows).
      DeviceVec<float> got2(c.n_tokens * c.n_out);
      ASSERT_TRUE(cuda::moe_down_combine(d.w, c.n_expert, x.xq->get(), x.xds->get(), drows.get(),
                                         dids.get(), dw.get(), c.n_tokens, c.k, got2.get(),
                                         nullptr));
      KILN_CUDA_OK(cudaDeviceSynchronize());
      expect_same_bits(got2.to_host(), want.to_host(), what + " x_rows");
    }
  }
}

// Routing outputs of one launch.
struct Routed {
  std::vector<float> logits, weights;
  std::vector<int32_t> chosen, x_rows;
};

TEST(CudaMoeDecode, RouteIsRouterThenTopk) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(103);
  struct Case {
    int64_t n_tokens;
    int64_t n_expert;
    int32_t k;
    int64_t n_in;
  };
  DeviceVec<uint32_t> counter(1);
  for (const Case& c : {Case{1, 128, 8, 2048}, Case{3, 128, 8, 512}, Case{8, 60, 4, 1024},
                        Case{2, 7, 2, 256}, Case{1, 1, 1, 256}}) {
    for (Type type : {Type::F32, Type::Q4_0, Type::Q8_0, Type::Q4_K, Type::Q5_K, Type::Q6_K}) {
      if (c.n_in % quant::traits(type).block_elems != 0) continue;
      const std::string what = std::string(quant::type_name(type)) + " t" +
                               std::to_string(c.n_tokens) + " e" + std::to_string(c.n_expert) +
                               " k" + std::to_string(c.k);
      const int64_t pairs = c.n_tokens * c.k;
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> wf(static_cast<size_t>(c.n_expert * c.n_in));
      for (float& v : wf) v = 0.05f * nd(rng);
      const uint64_t rb = *quant::row_bytes(type, static_cast<uint64_t>(c.n_in));
      std::vector<uint8_t> wb(rb * c.n_expert);
      for (int64_t r = 0; r < c.n_expert; ++r)
        ASSERT_TRUE(
            quant::quantize_row(type, wf.data() + r * c.n_in, wb.data() + r * rb, c.n_in).ok());
      DeviceVec<uint8_t> dwb(wb);
      Weight router;
      router.type = type;
      router.n_in = c.n_in;
      router.n_out = c.n_expert;
      router.row_bytes = rb;
      router.data = dwb.get();
      const Act x = make_act(rng, c.n_tokens, c.n_in);

      auto route = [&]() {
        DeviceVec<float> logits(c.n_tokens * c.n_expert), w(pairs);
        DeviceVec<int32_t> chosen(pairs), rows(pairs);
        EXPECT_TRUE(cuda::moe_route(router, x.x->get(), x.xq->get(), x.xds->get(), c.n_tokens, c.k,
                                    logits.get(), chosen.get(), w.get(), rows.get(), counter.get(),
                                    nullptr));
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
        return Routed{logits.to_host(), w.to_host(), chosen.to_host(), rows.to_host()};
      };
      const Routed got = route();
      // The unfused routing on the fused logits: the same top-k bits.
      DeviceVec<float> dlogits(got.logits), tw(pairs);
      DeviceVec<int32_t> tchosen(pairs), trows(pairs);
      cuda::moe_topk(dlogits.get(), c.n_tokens, static_cast<int32_t>(c.n_expert), c.k,
                     tchosen.get(), tw.get(), trows.get(), nullptr);
      KILN_CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(got.chosen, tchosen.to_host()) << what;
      EXPECT_EQ(got.x_rows, trows.to_host()) << what;
      expect_same_bits(got.weights, tw.to_host(), what + " weights");
      if (type == Type::F32) {
        for (int64_t t = 0; t < c.n_tokens; ++t)
          for (int64_t e = 0; e < c.n_expert; ++e) {
            double dot = 0.0, mag = 0.0;
            for (int64_t i = 0; i < c.n_in; ++i) {
              const double a = wf[e * c.n_in + i], b = x.host[t * c.n_in + i];
              dot += a * b;
              mag += std::fabs(a * b);
            }
            EXPECT_NEAR(got.logits[t * c.n_expert + e], dot, 1e-5 * mag + 1e-30)
                << what << " token " << t << " expert " << e;
          }
      } else {
        // The unfused router: matvec_q8 on the same int8 rows.
        DeviceVec<float> want(c.n_tokens * c.n_expert);
        const Weight* ws[1] = {&router};
        float* ys[1] = {want.get()};
        cuda::matvec_q8(ws, ys, 1, x.xq->get(), x.xds->get(), c.n_tokens, nullptr);
        KILN_CUDA_OK(cudaDeviceSynchronize());
        expect_same_bits(got.logits, want.to_host(), what + " logits");
      }
      // Again: the last CTA put the ticket back.
      const Routed again = route();
      EXPECT_EQ(again.chosen, got.chosen) << what << " (second launch)";
      expect_same_bits(again.weights, got.weights, what + " weights (second launch)");
      EXPECT_EQ(counter.to_host()[0], 0u) << what;
    }
  }
}

}  // namespace
}  // namespace kiln
