// The backend factory: the one place that knows which backends this build has.
#include "kiln/backend/backend.h"

#include <charconv>

#include "kiln/backend/cpu/cpu_backend.h"
#ifdef KILN_HAVE_CUDA
#include "kiln/backend/cuda/cuda_backend.h"
#include "kiln/backend/cuda/device.h"
#endif

namespace kiln::backend {

// A backend without collective ops (no mesh support yet) fails every one: the forward over a
// mesh then returns the error instead of a wrong result.
void Backend::all_reduce_sum(Mat) {
  mesh_failed(err("{}: no collective ops on this backend (all_reduce_sum)", name()));
}
void Backend::all_gather_cols(Mat, Mat, Mat) {
  mesh_failed(err("{}: no collective ops on this backend (all_gather)", name()));
}
void Backend::send(Mat, int) {
  mesh_failed(err("{}: no collective ops on this backend (send)", name()));
}
void Backend::recv(Mat, int) {
  mesh_failed(err("{}: no collective ops on this backend (recv)", name()));
}

Status check_kv_spec(const KvSpec& s) {
  if (s.n_layer <= 0 || s.n_kv_heads <= 0 || s.head_dim_k <= 0 || s.head_dim_v <= 0 ||
      s.block_tokens <= 0)
    return err("kv: invalid cache shape (layers {}, kv heads {}, head dims {}/{})", s.n_layer,
               s.n_kv_heads, s.head_dim_k, s.head_dim_v);
  if (s.type != quant::Type::F32 && s.type != quant::Type::F16 && s.type != quant::Type::Q8_0)
    return err("kv: the KV cache cannot store {} (choose f16, f32 or q8_0)",
               quant::type_name(s.type));
  const uint32_t be = quant::traits(s.type).block_elems;
  if (s.head_dim_k % be != 0 || s.head_dim_v % be != 0)
    return err("kv: a {} KV cache needs head dims that are multiples of {}; this model has {}/{}",
               quant::type_name(s.type), be, s.head_dim_k, s.head_dim_v);
  return {};
}

Status check_state_spec(const StateSpec& s) {
  if (s.n_layer <= 0 || s.conv_dim <= 0 || s.conv_k <= 0 || s.n_k_heads <= 0 || s.n_v_heads <= 0 ||
      s.head_k_dim <= 0 || s.head_v_dim <= 0)
    return err(
        "state: invalid recurrent state shape (layers {}, conv {}x{}, heads {}/{}, head dims "
        "{}/{})",
        s.n_layer, s.conv_dim, s.conv_k, s.n_k_heads, s.n_v_heads, s.head_k_dim, s.head_v_dim);
  if (s.n_v_heads % s.n_k_heads != 0)
    return err("state: {} value heads are not a multiple of {} key heads", s.n_v_heads,
               s.n_k_heads);
  const int64_t qkv = 2 * int64_t{s.n_k_heads} * s.head_k_dim + int64_t{s.n_v_heads} * s.head_v_dim;
  if (s.conv_dim != qkv) return err("state: conv width {} is not q + k + v ({})", s.conv_dim, qkv);
  return {};
}

bool cuda_compiled() {
#ifdef KILN_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef KILN_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

bool device_is_gpu(const std::string& device) {
  return device == "auto" ? cuda_device_count() > 0 : device.rfind("cuda", 0) == 0;
}

CudaInfo cuda_info() {
  CudaInfo info;
#ifdef KILN_HAVE_CUDA
  info.compiled = true;
  info.driver_version = cuda::driver_version();
  info.runtime_version = cuda::runtime_version();
  for (const cuda::GpuProps& g : cuda::gpus(&info.error))
    info.gpus.push_back(
        {g.index, g.name, g.cc_major, g.cc_minor, g.sm_count, g.total_bytes, g.free_bytes});
#else
  info.error = "this build of kiln has no CUDA backend";
#endif
  return info;
}

namespace {

Expected<std::unique_ptr<Backend>> create_device(const BackendOptions& opts) {
  const std::string& d = opts.device;
  if (d == "cpu") return std::unique_ptr<Backend>(new cpu::CpuBackend(opts.threads));
  if (d == "auto" && !device_is_gpu(d))
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
#ifdef KILN_HAVE_CUDA
  return cuda::create_cuda_backend(index);
#else
  return err("device '{}': this build of kiln has no CUDA backend", d);
#endif
}

}  // namespace

Expected<std::unique_ptr<Backend>> create_backend(const BackendOptions& opts) {
  KILN_TRY(std::unique_ptr<Backend> be, create_device(opts));
  be->set_deterministic(opts.deterministic);
  return be;
}

}  // namespace kiln::backend
