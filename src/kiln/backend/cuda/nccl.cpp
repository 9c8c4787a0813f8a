#include "kiln/backend/cuda/nccl.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

#include <cuda_runtime_api.h>
#include <nccl.h>

namespace kiln::backend::cuda {
namespace {

// The NCCL functions kiln calls, from libnccl.so.2 opened once.
struct Api {
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclCommGetAsyncError) comm_async_error = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  std::string error;  // why it could not be opened
};

const Api& api() {
  static const Api a = [] {
    Api r;
    void* lib = ::dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      r.error = fmt::format("NCCL is not installed (libnccl.so.2: {})", ::dlerror());
      return r;
    }
    bool ok = true;
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
      ok = ok && fn != nullptr;
    };
    get(r.comm_init_all, "ncclCommInitAll");
    get(r.comm_destroy, "ncclCommDestroy");
    get(r.comm_abort, "ncclCommAbort");
    get(r.comm_async_error, "ncclCommGetAsyncError");
    get(r.error_string, "ncclGetErrorString");
    get(r.all_reduce, "ncclAllReduce");
    get(r.all_gather, "ncclAllGather");
    get(r.send, "ncclSend");
    get(r.recv, "ncclRecv");
    if (!ok) r.error = "libnccl.so.2 lacks a function kiln calls (NCCL older than 2.7?)";
    return r;
  }();
  return a;
}

Status check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return {};
  return err("nccl: {}: {}", what, api().error_string(r));
}

// One rank's end of a group's communicator.
class NcclEnd final : public Collective {
 public:
  NcclEnd(ncclComm_t comm, int rank, int size, int device)
      : comm_(comm), rank_(rank), size_(size), device_(device) {}
  ~NcclEnd() override {
    cudaSetDevice(device_);
    if (!aborted_) api().comm_destroy(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (one_ != nullptr) cudaFree(one_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Device pointers; each waits for NCCL on the end's own stream.
  Status all_reduce_sum(float* data, int64_t n) override {
    return host_call([&](cudaStream_t s) { return issue_all_reduce(data, n, s); });
  }
  Status all_gather(const float* in, int64_t n, float* out) override {
    return host_call([&](cudaStream_t s) { return issue_all_gather(in, n, out, s); });
  }
  Status send(const void* data, uint64_t bytes, int peer) override {
    return host_call([&](cudaStream_t s) { return issue_send(data, bytes, peer, s); });
  }
  Status recv(void* data, uint64_t bytes, int peer) override {
    return host_call([&](cudaStream_t s) { return issue_recv(data, bytes, peer, s); });
  }
  Status barrier() override {
    return host_call([&](cudaStream_t s) { return issue_all_reduce(one_, 1, s); });
  }
  void abort(const std::string& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    why_ = why;
    aborted_ = true;
    api().comm_abort(comm_);  // pending NCCL work of this rank returns; its peers time out
  }

  // Queued on `s` (the rank backend's stream).
  Status issue_all_reduce(float* data, int64_t n, cudaStream_t s) {
    KILN_TRY_STATUS(alive());
    return check(api().all_reduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum, comm_, s),
                 "all_reduce");
  }
  Status issue_all_gather(const float* in, int64_t n, float* out, cudaStream_t s) {
    KILN_TRY_STATUS(alive());
    return check(api().all_gather(in, out, static_cast<size_t>(n), ncclFloat, comm_, s),
                 "all_gather");
  }
  Status issue_send(const void* data, uint64_t bytes, int peer, cudaStream_t s) {
    KILN_TRY_STATUS(alive());
    return check(api().send(data, bytes, ncclChar, peer, comm_, s), "send");
  }
  Status issue_recv(void* data, uint64_t bytes, int peer, cudaStream_t s) {
    KILN_TRY_STATUS(alive());
    return check(api().recv(data, bytes, ncclChar, peer, comm_, s), "recv");
  }

  Status init() {
    if (cudaSetDevice(device_) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc(&one_, sizeof(float)) != cudaSuccess)
      return err("nccl: cuda:{}: {}", device_, cudaGetErrorString(cudaGetLastError()));
    return {};
  }

 private:
  Status alive() {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return err("the mesh gave up: {}", why_);
    ncclResult_t async = ncclSuccess;
    api().comm_async_error(comm_, &async);
    return check(async, "a previous call");
  }
  template <typename Issue>
  Status host_call(Issue&& issue) {
    cudaSetDevice(device_);
    KILN_TRY_STATUS(issue(stream_));
    if (cudaStreamSynchronize(stream_) != cudaSuccess)
      return err("nccl: cuda:{}: {}", device_, cudaGetErrorString(cudaGetLastError()));
    return alive();
  }

  ncclComm_t comm_;
  const int rank_, size_, device_;
  cudaStream_t stream_ = nullptr;
  float* one_ = nullptr;  // barrier's value
  std::mutex mu_;
  bool aborted_ = false;
  std::string why_;
};

Expected<NcclEnd*> end_of(Collective* c) {
  auto* e = dynamic_cast<NcclEnd*>(c);
  if (e == nullptr) return err("nccl: a GPU mesh op on a communicator NCCL did not make");
  return e;
}

}  // namespace

Expected<std::vector<std::unique_ptr<Collective>>> nccl_group(const std::vector<int>& devices) {
  if (!api().error.empty()) return err("a mesh of GPUs needs NCCL: {}", api().error);
  std::vector<ncclComm_t> comms(devices.size());
  KILN_TRY_STATUS(
      check(api().comm_init_all(comms.data(), static_cast<int>(devices.size()), devices.data()),
            "creating the communicator"));
  std::vector<std::unique_ptr<Collective>> ends;
  for (size_t r = 0; r < devices.size(); ++r) {
    auto e = std::make_unique<NcclEnd>(comms[r], static_cast<int>(r),
                                       static_cast<int>(devices.size()), devices[r]);
    KILN_TRY_STATUS(e->init());
    ends.push_back(std::move(e));
  }
  return ends;
}

Status nccl_all_reduce_sum(Collective* end, float* data, int64_t n, void* stream) {
  KILN_TRY(NcclEnd * e, end_of(end));
  return e->issue_all_reduce(data, n, static_cast<cudaStream_t>(stream));
}
Status nccl_all_gather(Collective* end, const float* in, int64_t n, float* out, void* stream) {
  KILN_TRY(NcclEnd * e, end_of(end));
  return e->issue_all_gather(in, n, out, static_cast<cudaStream_t>(stream));
}
Status nccl_send(Collective* end, const void* data, uint64_t bytes, int peer, void* stream) {
  KILN_TRY(NcclEnd * e, end_of(end));
  return e->issue_send(data, bytes, peer, static_cast<cudaStream_t>(stream));
}
Status nccl_recv(Collective* end, void* data, uint64_t bytes, int peer, void* stream) {
  KILN_TRY(NcclEnd * e, end_of(end));
  return e->issue_recv(data, bytes, peer, static_cast<cudaStream_t>(stream));
}

}  // namespace kiln::backend::cuda
