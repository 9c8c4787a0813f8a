// The backend factory: the one place that knows which backends this build has.
#include "kiln/backend/backend.h"

#include <charconv>

#include "kiln/backend/cpu/cpu_backend.h"

namespace kiln::backend {

bool cuda_compiled() {
  return false;
}

int cuda_device_count() {
  return 0;
}

CudaInfo cuda_info() {
  CudaInfo info;
  info.error = "this build of kiln has no CUDA backend";
  return info;
}

Expected<std::unique_ptr<Backend>> create_backend(const BackendOptions& opts) {
  const std::string& d = opts.device;
  if (d == "cpu") return std::unique_ptr<Backend>(new cpu::CpuBackend(opts.threads));
  if (d == "auto" && cuda_device_count() == 0)
    return std::unique_ptr<Backend>(new cpu::CpuBackend(opts.threads));
  int index = 0;
  if (d != "auto" && d != "cuda") {
    const std::string_view prefix = "cuda:";
    if (d.rfind(prefix, 0) != 0) return err("unknown device '{}' (choose cpu, cuda or cuda:N)", d);
    const char* first = d.data() + prefix.size();
    const char* last = d.data() + d.size();
    auto [ptr, ec] = std::from_chars(first, last, index);
    if (ec != std::errc() || ptr != last || index < 0)
      return err("unknown device '{}' (choose cpu, cuda or cuda:N)", d);
  }
  if (!cuda_compiled())
    return err("device '{}': this build of kiln has no CUDA backend (rebuild with nvcc present)",
               d);
  const int count = cuda_device_count();
  if (count == 0) return err("device '{}': no CUDA GPU found", d);
  if (index >= count) return err("device '{}': only {} CUDA GPU(s) found", d, count);
  return err("device '{}': this build of kiln has no CUDA backend", d);
}

}  // namespace kiln::backend
