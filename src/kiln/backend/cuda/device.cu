// Device discovery for the CUDA backend (kiln doctor, --device selection).
#include <cuda_runtime_api.h>

#include "kiln/backend/cuda/device.h"

namespace kiln::backend::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

}  // namespace kiln::backend::cuda
