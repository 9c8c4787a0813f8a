// The CUDA MoE routing and combination (moe.cu) against the CPU arithmetic of
// Forward::moe_block (model/forward.cpp), repeated here step by step, on fresh random router
// logits (continuous, and drawn from a few levels so that ties are everywhere). Bounds:
//  - moe_topk: chosen experts and x_rows equal (ties to the lower expert index); weights within
//    1e-6 relative (expected bit-identical: the count of differing bits is printed);
//  - moe_combine: within 1e-6 of sum_j |w_j * slot_j| (expected bit-identical: products and
//    sums round as on the CPU, in slot order from 0).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kiln/backend/cpu/ops.h"
#include "kiln/backend/cuda/kernels.h"
#include "ops_test_util.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace cuda = backend::cuda;
namespace cpu = backend::cpu;
using test::DeviceVec;
using test::expect_close;
using test::poison;
using test::random_floats;

// Forward::moe_block's routing, line for line.
void topk_reference(const std::vector<float>& router, int64_t n, int64_t n_exp, int64_t k,
                    std::vector<int32_t>& chosen, std::vector<float>& weights) {
  chosen.assign(n * k, 0);
  weights.assign(n * k, 0.0f);
  std::vector<float> probs(n_exp);
  std::vector<int32_t> order(n_exp);
  for (int64_t t = 0; t < n; ++t) {
    const float* r = router.data() + t * n_exp;
    const float mx = *std::max_element(r, r + n_exp);
    double sum = 0;
    for (int64_t e = 0; e < n_exp; ++e) sum += probs[e] = std::exp(r[e] - mx);
    for (int64_t e = 0; e < n_exp; ++e) probs[e] = static_cast<float>(probs[e] / sum);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return probs[a] != probs[b] ? probs[a] > probs[b] : a < b;
    });
    float wsum = 0;
    for (int64_t j = 0; j < k; ++j) wsum += probs[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      chosen[t * k + j] = order[j];
      weights[t * k + j] = probs[order[j]] / wsum;
    }
  }
}

TEST(CudaMoe, TopkMatchesForwardRouting) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(31);
  struct Case {
    int64_t n_tokens;
    int32_t n_expert, k;
  };
  // qwen3moe (128, 8), qwen2moe (60, 4), mixtral (8, 2), k == n_expert, one expert, 256 experts.
  for (const Case& c :
       {Case{1, 128, 8}, Case{5, 128, 8}, Case{129, 128, 8}, Case{7, 60, 4}, Case{33, 8, 2},
        Case{3, 7, 7}, Case{2, 1, 1}, Case{17, 256, 8}, Case{1000, 64, 6}}) {
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<float> logits;
      if (mode == 0) {
        std::normal_distribution<float> d(0.0f, 3.0f);
        logits.resize(c.n_tokens * c.n_expert);
        for (float& v : logits) v = d(rng);
      } else {  // few levels: equal probabilities within a token, ties to the lower index
        std::uniform_int_distribution<int> level(0, mode == 1 ? 4 : 1);
        logits.resize(c.n_tokens * c.n_expert);
        for (float& v : logits) v = 0.5f * static_cast<float>(level(rng));
      }
      std::vector<int32_t> want_chosen;
      std::vector<float> want_w;
      topk_reference(logits, c.n_tokens, c.n_expert, c.k, want_chosen, want_w);
      std::vector<int32_t> want_rows(c.n_tokens * c.k);
      for (int64_t i = 0; i < c.n_tokens * c.k; ++i) want_rows[i] = static_cast<int32_t>(i / c.k);

      const int64_t pairs = c.n_tokens * c.k;
      DeviceVec<float> dlogits(logits), dw(pairs);
      DeviceVec<int32_t> dchosen(pairs), drows(pairs);
      poison(dw, pairs);
      poison(dchosen, pairs);
      poison(drows, pairs);
      cuda::moe_topk(dlogits.get(), c.n_tokens, c.n_expert, c.k, dchosen.get(), dw.get(),
                     drows.get(), nullptr);
      KILN_CUDA_SYNC_OK();
      const std::string what = "moe_topk t" + std::to_string(c.n_tokens) + " e" +
                               std::to_string(c.n_expert) + " k" + std::to_string(c.k) + " mode " +
                               std::to_string(mode);
      EXPECT_EQ(dchosen.to_host(), want_chosen) << what;
      EXPECT_EQ(drows.to_host(), want_rows) << what;
      expect_close(
          dw.to_host(), want_w, [&](size_t i) { return 1e-6 * want_w[i]; }, what + " weights");
    }
  }
}

TEST(CudaMoe, CombineMatchesForwardSum) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(32);
  struct Case {
    int64_t n_tokens;
    int32_t k;
    int64_t n;
  };
  for (const Case& c : {Case{1, 1, 1}, Case{1, 8, 2048}, Case{5, 8, 7}, Case{33, 2, 4096},
                        Case{3, 4, 1027}, Case{129, 8, 64}}) {
    const int64_t pairs = c.n_tokens * c.k;
    const std::vector<float> slots = random_floats(rng, pairs * c.n, -4, 4);
    const std::vector<float> w = random_floats(rng, pairs, 0.0f, 1.0f);
    // The CPU: each slot scaled by its weight, then added to a zeroed row in slot order.
    std::vector<float> want(c.n_tokens * c.n, 0.0f), scaled(pairs * c.n), mag(c.n_tokens * c.n);
    for (int64_t p = 0; p < pairs; ++p)
      for (int64_t i = 0; i < c.n; ++i) scaled[p * c.n + i] = w[p] * slots[p * c.n + i];
    for (int64_t t = 0; t < c.n_tokens; ++t)
      for (int32_t j = 0; j < c.k; ++j) {
        cpu::add(want.data() + t * c.n, scaled.data() + (t * c.k + j) * c.n, c.n);
        for (int64_t i = 0; i < c.n; ++i)
          mag[t * c.n + i] += std::fabs(scaled[(t * c.k + j) * c.n + i]);
      }
    DeviceVec<float> dslots(slots), dw(w), dout(c.n_tokens * c.n);
    poison(dout, c.n_tokens * c.n);
    cuda::moe_combine(dslots.get(), dw.get(), c.n_tokens, c.k, c.n, dout.get(), nullptr);
    KILN_CUDA_SYNC_OK();
    expect_close(
        dout.to_host(), want, [&](size_t i) { return 1e-6 * mag[i] + 1e-30; },
        "moe_combine t" + std::to_string(c.n_tokens) + " k" + std::to_string(c.k) + " n" +
            std::to_string(c.n));
  }
}

}  // namespace
}  // namespace kiln
