// The CUDA backend's switches from the environment (KILN_CUDA_*: comparisons and opt-in
// kernels), each read once where its launcher first asks. Header-only and without fmt, for the
// .cu files (nvcc's C++20 front end rejects fmt).
#pragma once

#include <cstdlib>
#include <string_view>

namespace kiln::backend::cuda {

// Whether the environment variable `name` is set to exactly `value` ("0": a default-on switch
// turned off; "1": an opt-in one turned on).
inline bool env_is(const char* name, std::string_view value) {
  const char* e = std::getenv(name);
  return e != nullptr && value == e;
}

}  // namespace kiln::backend::cuda
