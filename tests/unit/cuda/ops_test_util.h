// Helpers of the elementwise, rope and MoE kernel tests: fresh random inputs, poisoned outputs,
// and a comparison that checks a per-element bound and counts the elements that are not
// bit-identical (printed, so the figures land in the test log).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "test_util.h"

namespace kiln::test {

inline std::vector<float> random_floats(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Fills a device buffer with 0xFF bytes (NaN as fp32, -1 as int32), so an element the kernel
// failed to write cannot pass a comparison.
template <typename T>
void poison(const DeviceVec<T>& v, size_t n) {
  ASSERT_EQ(cudaSuccess, cudaMemset(v.get(), 0xFF, std::max<size_t>(1, n) * sizeof(T)));
}

// Launch errors and then execution errors of the last launch(es).
#define KILN_CUDA_SYNC_OK()                \
  do {                                     \
    KILN_CUDA_OK(cudaGetLastError());      \
    KILN_CUDA_OK(cudaDeviceSynchronize()); \
  } while (0)

// got[i] must lie within bound(i) of want[i] (NaN never passes). Prints the largest error over
// its bound and the number of elements whose bits differ.
template <typename Bound>
void expect_close(const std::vector<float>& got, const std::vector<float>& want, Bound bound,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0.0;
  size_t bit_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) ++bit_diff;
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double b = bound(i);
    ASSERT_TRUE(err <= b) << what << ": element " << i << " got " << got[i] << " want " << want[i]
                          << " (bound " << b << ")";
    if (b > 0) worst = std::max(worst, err / b);
  }
  std::printf("  %-48s %9zu elements, %7zu not bit-identical, worst error %.3f of bound\n",
              what.c_str(), got.size(), bit_diff, worst);
}

// Bit-identical outputs.
inline void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want,
                           const std::string& what) {
  expect_close(
      got, want, [](size_t) { return 0.0; }, what);
}

}  // namespace kiln::test
