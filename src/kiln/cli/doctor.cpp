// kiln doctor: what this machine and this build can run on. Prints the CPU (features, cores,
// kernel path), the CUDA build and driver, each GPU (compute capability, memory), and with
// -m a model file's check and its memory plan on the chosen device. With --nnodes, the
// machines of a multi-node mesh meet first (backend/rendezvous.h) and each prints every node's
// line: whether they can reach each other, before a mesh needs them to.
#include <fmt/format.h>

#include <unistd.h>

#include "kiln/backend/backend.h"
#include "kiln/backend/rendezvous.h"
#include "kiln/cli/commands.h"
#include "kiln/cli/flags.h"
#include "kiln/engine/executor.h"
#include "kiln/kv/kv_cache.h"
#include "kiln/model/model.h"
#include "kiln/util/cpu.h"

namespace kiln::cli {
namespace {

struct DoctorOptions {
  std::string model;
  std::string device = "auto";
  int32_t n_ctx = 4096;
  int32_t max_seqs = 16;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1:29500";
  int timeout_s = 60;
};

// The multi-node check: this node's line to the others, every node's line back.
int meet(const DoctorOptions& o) {
  backend::RendezvousOptions r;
  r.nnodes = o.nnodes;
  r.node_rank = o.node_rank;
  r.timeout = std::chrono::seconds(o.timeout_s);
  if (Status st = backend::parse_master_addr(o.master_addr, &r); !st.ok()) {
    fmt::print(stderr, "kiln doctor: {}\n", st.error().message);
    return 2;
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string mine = fmt::format("host {}, {} GPU(s), {} cores", host,
                                       backend::cuda_device_count(), util::num_physical_cores());
  // Node 0 says where it listens (port 0 in --master-addr: any free one).
  auto all = backend::rendezvous(r, mine, [&](int port) {
    fmt::print(stderr, "rendezvous: node 0 listening on {}:{}\n", r.master_addr, port);
  });
  if (!all.ok()) {
    fmt::print("rendezvous: {}\n", all.error().message);
    return 1;
  }
  for (size_t i = 0; i < all->size(); ++i)
    fmt::print("rendezvous: node {} of {}: {}\n", i, all->size(), (*all)[i]);
  return 0;
}

std::string version(int v) {
  return v == 0 ? "none" : fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}

int run_doctor(const DoctorOptions& o) {
  if (o.nnodes > 1) return meet(o);
  const util::CpuFeatures& f = util::cpu_features();
  fmt::print("cpu: {} logical, {} physical cores available; features: {}\n",
             util::num_logical_cores(), util::num_physical_cores(), util::to_string(f));
  const backend::CudaInfo cuda = backend::cuda_info();
  fmt::print("cuda: compiled in: {}; driver {}, runtime {}\n", cuda.compiled ? "yes" : "no",
             version(cuda.driver_version), version(cuda.runtime_version));
  if (cuda.gpus.empty())
    fmt::print("gpus: none ({})\n", cuda.error.empty() ? "none found" : cuda.error);
  for (const backend::GpuInfo& g : cuda.gpus)
    fmt::print("gpu {}: {}, compute capability {}.{}, {} SMs, {:.0f} MiB ({:.0f} MiB free)\n",
               g.index, g.name, g.cc_major, g.cc_minor, g.sm_count,
               static_cast<double>(g.total_bytes) / (1 << 20),
               static_cast<double>(g.free_bytes) / (1 << 20));
  auto be = backend::create_backend({o.device, 0});
  if (!be.ok()) {
    fmt::print("device {}: {}\n", o.device, be.error().message);
    return 1;
  }
  fmt::print("device {} -> {}\n", o.device, (*be)->description());
  if (o.model.empty()) return 0;
  auto m = model::Model::load(o.model);
  if (!m.ok()) {
    fmt::print("model: {}\n", m.error().message);
    return 1;
  }
  fmt::print("model: {} ({}), checked against its manifest\n", o.model, (*m)->hparams().arch);
  engine::ExecutorOptions eo;
  eo.max_context = o.n_ctx > 0 ? o.n_ctx : static_cast<int32_t>((*m)->hparams().n_ctx_train);
  eo.max_seqs = o.max_seqs;
  eo.state_snapshots = 2 * o.max_seqs;  // kiln serve's default (hybrid models' prefix reuse)
  auto ex = engine::Executor::create(**m, **be, eo);
  if (!ex.ok()) {
    fmt::print("model on {}: {}\n", (*be)->name(), ex.error().message);
    return 1;
  }
  fmt::print("{}\n", (*ex)->plan().to_string());
  return 0;
}

}  // namespace

RunFn add_doctor(CLI::App& app) {
  auto o = std::make_shared<DoctorOptions>();
  CLI::App* cmd = app.add_subcommand("doctor", "Check this machine, its GPUs and a model file");
  cmd->add_option("-m,--model", o->model, "GGUF file to check and plan (optional)");
  cmd->add_option("--device", o->device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  add_ranged(cmd, "-c,--ctx", o->n_ctx, 1, kMaxContext, "context for the memory plan");
  add_ranged(cmd, "--max-seqs", o->max_seqs, 1, 1 << 16, "sequences for the memory plan");
  add_ranged(cmd, "--nnodes", o->nnodes, 1, 1024,
             "machines of a multi-node mesh: meet them (node 0 at --master-addr) and list them");
  add_ranged(cmd, "--node-rank", o->node_rank, 0, 1023, "this machine's node (0: the master)");
  cmd->add_option("--master-addr", o->master_addr, "HOST:PORT where node 0 listens")
      ->capture_default_str();
  add_ranged(cmd, "--rendezvous-timeout", o->timeout_s, 1, 3600, "seconds to wait for every node");
  return [o] { return run_doctor(*o); };
}

}  // namespace kiln::cli
