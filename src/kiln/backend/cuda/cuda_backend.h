// The CUDA backend: the ops interface (backend.h) over the kernels of kernels.h on one GPU
// and one stream. Weights are uploaded as the GGUF rows at preparation; activations, the KV
// cache and the step's input buffers live in device memory allocated before the first step.
#pragma once

#include <memory>

#include "kiln/backend/backend.h"

namespace kiln::backend::cuda {

Expected<std::unique_ptr<Backend>> create_cuda_backend(int device_index);

}  // namespace kiln::backend::cuda
