// CUDA device discovery.
#pragma once

namespace kiln::backend::cuda {

// Usable CUDA devices (0 when there is no driver or no GPU).
int device_count();

}  // namespace kiln::backend::cuda
