// Helpers for the CUDA kernel tests: skip (reported as skipped, never passed) without a GPU,
// device buffers, and CUDA error checks.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "kiln/backend/cuda/device.h"

#define KILN_REQUIRE_GPU()                                                  \
  do {                                                                      \
    if (kiln::backend::cuda::device_count() == 0) GTEST_SKIP() << "no GPU"; \
  } while (0)

#define KILN_CUDA_OK(expr) ASSERT_EQ(cudaSuccess, (expr)) << cudaGetErrorString(cudaGetLastError())

namespace kiln::test {

// A device copy of a host vector, freed on scope exit.
template <typename T>
class DeviceVec {
 public:
  explicit DeviceVec(size_t n) : n_(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(1, n) * sizeof(T)) !=
        cudaSuccess)
      p_ = nullptr;
    else
      cudaMemset(p_, 0, std::max<size_t>(1, n) * sizeof(T));  // as a workspace must start
  }
  explicit DeviceVec(const std::vector<T>& host) : DeviceVec(host.size()) {
    if (p_ != nullptr && !host.empty())
      cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceVec() { cudaFree(p_); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  T* get() const { return p_; }
  std::vector<T> to_host() const {
    std::vector<T> h(n_);
    if (n_ > 0) cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace kiln::test
