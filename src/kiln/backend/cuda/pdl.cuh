// Programmatic dependent launch (Hopper): a kernel launched with launch_pdl may start while the
// kernel before it on the stream is still running; it calls pdl_wait() before it reads
// anything that kernel wrote (pdl_wait returns once the previous grid has completed and its
// memory is visible), and pdl_trigger() to let the next kernel start early. A decode step is a
// chain of ~20 short kernels per layer: this overlaps each one's launch and ramp-up (and the
// matvec's weight prefetch, which depends on nothing) with the end of the one before.
// Kernels launched with launch_pdl must call pdl_wait() (or pdl_start()) before their first
// dependent read and their first write; on cards before sm_90, and with KILN_CUDA_PDL=0,
// launches are plain and the calls no-ops.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

namespace kiln::backend::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// The decode kernels' opening: wait for the previous kernel, then let the next one launch
// (its CTAs take the SM room this one leaves and start their weight prefetch while this one
// runs). Triggering before the wait instead (the next kernel's CTAs resident, prefetching,
// while the previous one still runs) measured slower on the H200: tg128 1B Q4_K_M 692 tok/s
// against 704 with PDL off, where this order gains 7.5% (session 8, docs/performance.md).
__device__ __forceinline__ void pdl_start() {
  pdl_wait();
  pdl_trigger();
}
// Starts fetching [p, p + bytes) into L2 (lines of 128 bytes spread over the warp's lanes):
// for reads that depend on no earlier kernel, before pdl_wait.
__device__ __forceinline__ void prefetch_l2(const void* p, int bytes, int lane) {
  const char* c = static_cast<const char*>(p);
  for (int off = lane * 128; off < bytes; off += 32 * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(c + off));
}

inline bool pdl_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KILN_CUDA_PDL");
    if (e != nullptr && std::strcmp(e, "0") == 0) return false;
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           major >= 9;
  }();
  return on;
}

template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                Args&&... args) {
  if (!pdl_enabled()) {
    kernel<<<grid, block, smem, s>>>(std::forward<Args>(args)...);
    return;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace kiln::backend::cuda
