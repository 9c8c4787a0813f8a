#include "kiln/backend/cpu/kernels.h"
namespace kiln::backend::cpu {
GemmFn gemm_avx512(quant::Type) {
  return nullptr;
}
}  // namespace kiln::backend::cpu
