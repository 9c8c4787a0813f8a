// The CUDA rotary embedding (rope.cu) against cpu::rope_angles and cpu::rope_apply on fresh
// random inputs: head_dim 64/128/256, neox and adjacent pairs, n_rot < head_dim (the dims past
// it pass through), one token and ragged counts, positions up to 128K. Bounds:
//  - rope_angles: within 1e-6 absolute of the CPU's (both evaluate cos/sin in double and round
//    once to fp32: equal but where a double result lies within its error of an fp32 midpoint);
//  - rope_apply from the same tables: 1e-6 relative to the pair's magnitude |x0| + |x1| (each
//    product and sum rounds as on the CPU, so the values are expected bit-identical);
//  - both on the GPU against both on the CPU: 2e-6 relative to |x0| + |x1|.
#include <algorithm>
#include <cmath>
#include <cstdint>
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

// base^(-2i/n_rot) (model/rope.cpp's default table), optionally divided by llama3-style factors.
std::vector<double> inv_freq(double base, int32_t n_pairs, bool factors, std::mt19937& rng) {
  std::uniform_real_distribution<double> f(1.0, 8.0);
  std::vector<double> v(n_pairs);
  for (int32_t i = 0; i < n_pairs; ++i) {
    v[i] = std::pow(base, -2.0 * i / (2 * n_pairs));
    if (factors) v[i] /= f(rng);
  }
  return v;
}

std::vector<int32_t> positions(int64_t n_tokens, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> d(0, 131071);
  std::vector<int32_t> p(n_tokens);
  for (int64_t t = 0; t < n_tokens; ++t) p[t] = t == 0 ? 0 : d(rng);
  return p;
}

// The bound of element e of head row x (pairs as in rope_apply): rel * (|x0| + |x1|) of its pair.
std::vector<double> pair_scale(const std::vector<float>& x, int64_t n_rows, int32_t head_dim,
                               int32_t n_pairs, bool neox) {
  std::vector<double> s(x.size(), 0.0);
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* v = x.data() + r * head_dim;
    for (int32_t i = 0; i < n_pairs; ++i) {
      const int32_t a = neox ? i : 2 * i, b = neox ? i + n_pairs : 2 * i + 1;
      s[r * head_dim + a] = s[r * head_dim + b] = std::fabs(v[a]) + std::fabs(v[b]);
    }
  }
  return s;
}

struct Case {
  int64_t n_tokens;
  int32_t n_heads, head_dim, n_rot;
  bool neox;
  double base;
  float attn_factor;
  bool factors;
};

std::string name(const char* op, const Case& c) {
  return std::string(op) + " t" + std::to_string(c.n_tokens) + " h" + std::to_string(c.n_heads) +
         " d" + std::to_string(c.head_dim) + " rot" + std::to_string(c.n_rot) +
         (c.neox ? " neox" : " adjacent");
}

TEST(CudaRope, AnglesAndRotationMatchCpu) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(21);
  const std::vector<Case> cases = {
      {1, 1, 64, 64, false, 10000.0, 1.0f, false},
      {5, 8, 128, 128, false, 500000.0, 1.0f, true},
      {67, 3, 128, 128, true, 1000000.0, 1.0f, false},
      {7, 4, 256, 256, true, 10000.0, 1.0f, false},
      {3, 32, 128, 64, false, 10000.0, 1.0f, false},
      {9, 2, 64, 32, true, 10000.0, 1.2f, false},
      {33, 16, 256, 128, true, 1000000.0, 0.9f, false},
      {1, 40, 128, 128, true, 1000000.0, 1.0f, false},
  };
  for (const Case& c : cases) {
    const int32_t n_pairs = c.n_rot / 2;
    const std::vector<double> freq = inv_freq(c.base, n_pairs, c.factors, rng);
    const std::vector<int32_t> pos = positions(c.n_tokens, rng);
    const int64_t n_tab = c.n_tokens * n_pairs;
    const int64_t n_x = c.n_tokens * c.n_heads * c.head_dim;

    // Angles.
    std::vector<float> cos_want(n_tab), sin_want(n_tab);
    cpu::rope_angles(freq.data(), n_pairs, pos.data(), c.n_tokens, c.attn_factor, cos_want.data(),
                     sin_want.data());
    DeviceVec<double> dfreq(freq);
    DeviceVec<int32_t> dpos(pos);
    DeviceVec<float> dcos(n_tab), dsin(n_tab);
    poison(dcos, n_tab);
    poison(dsin, n_tab);
    cuda::rope_angles(dfreq.get(), n_pairs, dpos.get(), c.n_tokens, c.attn_factor, dcos.get(),
                      dsin.get(), nullptr);
    KILN_CUDA_SYNC_OK();
    expect_close(
        dcos.to_host(), cos_want, [](size_t) { return 1e-6; }, name("rope cos", c));
    expect_close(
        dsin.to_host(), sin_want, [](size_t) { return 1e-6; }, name("rope sin", c));

    // Rotation from the CPU's tables.
    const std::vector<float> x = random_floats(rng, n_x, -3, 3);
    std::vector<float> want = x;
    cpu::rope_apply(want.data(), c.n_tokens, c.n_heads, c.head_dim, n_pairs, c.neox,
                    cos_want.data(), sin_want.data());
    const std::vector<double> scale =
        pair_scale(x, c.n_tokens * c.n_heads, c.head_dim, n_pairs, c.neox);
    DeviceVec<float> dcos_cpu(cos_want), dsin_cpu(sin_want), dx(x);
    cuda::rope_apply(dx.get(), c.n_tokens, c.n_heads, c.head_dim, n_pairs, c.neox, dcos_cpu.get(),
                     dsin_cpu.get(), nullptr);
    KILN_CUDA_SYNC_OK();
    expect_close(
        dx.to_host(), want, [&](size_t i) { return 1e-6 * scale[i]; }, name("rope_apply", c));

    // Both steps on the GPU against both on the CPU.
    DeviceVec<float> dx2(x);
    cuda::rope_apply(dx2.get(), c.n_tokens, c.n_heads, c.head_dim, n_pairs, c.neox, dcos.get(),
                     dsin.get(), nullptr);
    KILN_CUDA_SYNC_OK();
    expect_close(
        dx2.to_host(), want, [&](size_t i) { return 2e-6 * scale[i]; },
        name("rope angles+apply", c));

    // q and k in one launch (rope_apply2): bit for bit two rope_apply calls; here "k" is the
    // first heads of another random tensor.
    const int32_t k_heads = std::max(1, c.n_heads / 2);
    const std::vector<float> xk = random_floats(rng, c.n_tokens * k_heads * c.head_dim, -3, 3);
    DeviceVec<float> q1(x), k1(xk), q2(x), k2(xk);
    cuda::rope_apply(q1.get(), c.n_tokens, c.n_heads, c.head_dim, n_pairs, c.neox, dcos.get(),
                     dsin.get(), nullptr);
    cuda::rope_apply(k1.get(), c.n_tokens, k_heads, c.head_dim, n_pairs, c.neox, dcos.get(),
                     dsin.get(), nullptr);
    cuda::rope_apply2(q2.get(), c.n_heads, k2.get(), k_heads, c.n_tokens, c.head_dim, n_pairs,
                      c.neox, dcos.get(), dsin.get(), nullptr);
    KILN_CUDA_SYNC_OK();
    test::expect_bitwise(q2.to_host(), q1.to_host(), name("rope_apply2 q", c));
    test::expect_bitwise(k2.to_host(), k1.to_host(), name("rope_apply2 k", c));
  }
}

}  // namespace
}  // namespace kiln
