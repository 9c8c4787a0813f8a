// CUDA device discovery (kiln doctor, --device selection).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::backend::cuda {

// Usable CUDA devices (0 when there is no driver or no GPU).
int device_count();

struct GpuProps {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  uint64_t total_bytes = 0, free_bytes = 0;
};
// Driver and runtime versions (1000 * major + 10 * minor; 0 when unknown), the devices, and
// the error that hid them when there are none.
int driver_version();
int runtime_version();
std::vector<GpuProps> gpus(std::string* error);

// The current device's multiprocessor count and compute capability major, read once per
// device (the launchers size their grids by them); 0 when no device can be read.
int current_sm_count();
int current_cc_major();

// Raises kernel fn's dynamic shared memory limit to `bytes`, once per (kernel, current device):
// the attribute belongs to the device's context. False when the device or the driver refuses.
bool allow_dynamic_smem(const void* fn, size_t bytes);

}  // namespace kiln::backend::cuda
