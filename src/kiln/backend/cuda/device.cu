// Device discovery for the CUDA backend (kiln doctor, --device selection).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <utility>

#include "kiln/backend/cuda/device.h"

namespace kiln::backend::cuda {

bool allow_dynamic_smem(const void* fn, size_t bytes) {
  static std::mutex mu;
  static std::vector<std::pair<const void*, int>> done;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  std::lock_guard<std::mutex> lock(mu);
  if (std::find(done.begin(), done.end(), std::make_pair(fn, dev)) != done.end()) return true;
  if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess)
    return false;
  done.emplace_back(fn, dev);
  return true;
}

namespace {
// Per device: multiprocessor count and compute capability major, read on first use.
struct DeviceAttrs {
  int dev = -1;
  int sms = 0;
  int cc_major = 0;
};
DeviceAttrs current_attrs() {
  static std::mutex mu;
  static std::vector<DeviceAttrs> known;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return {};
  std::lock_guard<std::mutex> lock(mu);
  for (const DeviceAttrs& a : known)
    if (a.dev == dev) return a;
  DeviceAttrs a;
  a.dev = dev;
  if (cudaDeviceGetAttribute(&a.sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&a.cc_major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  known.push_back(a);
  return a;
}
}  // namespace

int current_sm_count() { return current_attrs().sms; }
int current_cc_major() { return current_attrs().cc_major; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

int driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) cudaGetLastError();
  return v;
}

int runtime_version() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) cudaGetLastError();
  return v;
}

std::vector<GpuProps> gpus(std::string* error) {
  std::vector<GpuProps> out;
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (error != nullptr) *error = cudaGetErrorString(e);
    cudaGetLastError();
    return out;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    GpuProps g;
    g.index = i;
    g.name = p.name;
    g.cc_major = p.major;
    g.cc_minor = p.minor;
    g.sm_count = p.multiProcessorCount;
    g.total_bytes = p.totalGlobalMem;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      g.free_bytes = free_b;
    } else {
      cudaGetLastError();
    }
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace kiln::backend::cuda
