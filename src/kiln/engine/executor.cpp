#include "kiln/engine/executor.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "kiln/kv/kv_cache.h"

namespace kiln::engine {
namespace {

double mib(uint64_t b) {
  return static_cast<double>(b) / (1 << 20);
}

}  // namespace

bool ExecutorOptions::graphs_default() {
  const char* v = std::getenv("KILN_CUDA_GRAPHS");
  return v == nullptr || std::string_view(v) != "0";
}

std::string MemoryPlan::to_string() const {
  std::string s = fmt::format("memory plan on {}", device);
  if (device_total_bytes > 0) s += fmt::format(" ({:.0f} MiB)", mib(device_total_bytes));
  s += fmt::format(
      ": weights {:.1f} MiB (file {:.1f} MiB), activations {:.1f} MiB, KV {:.1f} KiB per token "
      "x {} tokens ({} blocks, {:.1f} MiB): {} sequence(s) of {} tokens at once",
      mib(weight_bytes), mib(file_bytes), mib(activation_bytes),
      static_cast<double>(kv_bytes_per_token) / 1024, kv_tokens, kv_blocks,
      mib(kv_bytes_per_token * static_cast<uint64_t>(kv_tokens)), max_seqs_at_context, max_context);
  if (state_slots > 0)
    s += fmt::format("; recurrent state {:.1f} MiB per sequence x {} ({:.1f} MiB)",
                     mib(state_bytes_per_seq), state_slots,
                     mib(state_bytes_per_seq * static_cast<uint64_t>(state_slots)));
  if (state_snapshots > 0)
    s += fmt::format(" + {} prefix snapshots ({:.1f} MiB)", state_snapshots,
                     mib(state_bytes_per_seq * static_cast<uint64_t>(state_snapshots)));
  return s;
}

Expected<std::unique_ptr<Executor>> Executor::create(const model::Model& model,
                                                     backend::Backend& be,
                                                     const ExecutorOptions& opts) {
  if (opts.max_tokens <= 0 || opts.max_seqs <= 0 || opts.max_context <= 0)
    return err("executor: max_tokens, max_seqs and max_context must be > 0 (got {}, {}, {})",
               opts.max_tokens, opts.max_seqs, opts.max_context);
  if (opts.state_snapshots < 0)
    return err("executor: state_snapshots must be >= 0, got {}", opts.state_snapshots);
  if (!(opts.gpu_memory_fraction > 0 && opts.gpu_memory_fraction <= 1))
    return err("gpu memory fraction {} is outside (0, 1]", opts.gpu_memory_fraction);
  std::unique_ptr<Executor> ex(new Executor(model, be, opts));
  model::ForwardOptions fo;
  fo.max_tokens = opts.max_tokens;
  fo.max_seqs = std::min(opts.max_seqs, opts.max_tokens);
  fo.max_context = opts.max_context;
  fo.max_logit_rows = opts.max_logit_rows > 0 ? opts.max_logit_rows : fo.max_seqs;
  fo.max_hidden_rows = std::min(opts.max_hidden_rows, opts.max_tokens);
  KILN_TRY(ex->forward_, model::Forward::create(model, be, fo));

  const backend::KvSpec spec = model::kv_spec(model.hparams(), opts.kv_type);
  const uint64_t per_block = be.kv_bytes_per_block(spec);
  if (per_block == 0)
    return err("kv: the {} KV cache cannot hold this model's heads (head dims {}/{})",
               quant::type_name(opts.kv_type), spec.head_dim_k, spec.head_dim_v);
  const uint64_t blocks_per_seq =
      (static_cast<uint64_t>(opts.max_context) + kv::kBlockTokens - 1) / kv::kBlockTokens;
  // The recurrent state before the KV pool: on a GPU the pool takes what the memory fraction
  // leaves, and the snapshots' slots can weigh as much as the sequences' own.
  if (model.hparams().n_linear_layers() > 0) {  // a recurrent-state slot per sequence
    const backend::StateSpec sspec = model::state_spec(model.hparams());
    // Slots: the sequences', the snapshots', and one no sequence uses, which the rows that pad
    // a graph-replayed decode step write.
    KILN_TRY(ex->state_, be.create_state(sspec, opts.max_seqs + opts.state_snapshots + 1));
    ex->plan_.state_bytes_per_seq = be.state_bytes_per_slot(sspec);
    ex->plan_.state_slots = opts.max_seqs;
    ex->plan_.state_snapshots = opts.state_snapshots;
  }
  uint64_t budget = opts.kv_memory_bytes;
  const backend::DeviceMemory mem = be.memory();
  const bool device = be.name() != "cpu";
  if (budget == 0 && device) {
    // What the fraction allows, minus what is already taken (weights, arena, libraries).
    const double allowed = opts.gpu_memory_fraction * static_cast<double>(mem.total_bytes);
    const double used = static_cast<double>(mem.total_bytes - mem.free_bytes);
    if (allowed <= used)
      return err(
          "out of memory on {}: weights, activations and recurrent state take {:.0f} MiB of "
          "{:.0f} MiB, more than --gpu-memory-fraction {} allows; nothing is left for the KV "
          "cache",
          be.name(), used / (1 << 20), mib(mem.total_bytes), opts.gpu_memory_fraction);
    budget = static_cast<uint64_t>(allowed - used);
  } else if (budget == 0) {
    budget = std::min<uint64_t>(uint64_t{2} << 30, per_block * blocks_per_seq * opts.max_seqs);
  }
  // The cache holds one block more than the budget gives the sequences: the null block that
  // pads graph-replayed steps.
  const uint64_t blocks = std::min<uint64_t>(budget / per_block, 1u << 30);
  if (blocks < static_cast<uint64_t>(std::max(1, opts.min_kv_blocks)))
    return err(
        "out of memory for the KV cache on {}: {} bytes hold {} blocks of {} bytes; {} are "
        "needed",
        be.name(), budget, blocks, per_block, std::max(1, opts.min_kv_blocks));
  KILN_TRY(ex->kv_, be.create_kv(spec, static_cast<int32_t>(blocks) + 1));
  ex->num_blocks_ = static_cast<int32_t>(blocks);
  if (opts.graphs)
    ex->forward_->enable_graphs(static_cast<int32_t>(blocks),
                                ex->state_ != nullptr ? ex->state_->num_slots() - 1 : -1);

  MemoryPlan& p = ex->plan_;
  p.device = be.name();
  p.device_total_bytes = mem.total_bytes;
  p.weight_bytes = be.prepared_bytes();
  p.file_bytes = model.file().size_bytes();
  p.activation_bytes = ex->forward_->arena_bytes();
  p.kv_bytes_per_token = per_block / kv::kBlockTokens;
  p.kv_blocks = static_cast<int32_t>(blocks);
  p.kv_tokens = static_cast<int64_t>(blocks) * kv::kBlockTokens;
  p.max_context = opts.max_context;
  p.max_seqs_at_context = static_cast<int32_t>(blocks / blocks_per_seq);
  ex->logits_capacity_ = static_cast<size_t>(fo.max_logit_rows) * model.hparams().n_vocab;
  KILN_TRY(ex->logits_, be.alloc_host(ex->logits_capacity_ * sizeof(float)));
  KILN_TRY(ex->ids_, be.alloc_host(static_cast<uint64_t>(fo.max_logit_rows) * sizeof(int32_t)));
  if (fo.max_hidden_rows > 0) {
    KILN_TRY(ex->hidden_buf_, be.alloc_host(static_cast<uint64_t>(fo.max_hidden_rows) *
                                            model.hparams().n_embd * sizeof(float)));
  }
  return ex;
}

Status Executor::launch(const model::StepInput& in, bool argmax) {
  const size_t n = in.logit_rows.size() * model_.hparams().n_vocab;
  if (n > logits_capacity_)
    return err("executor: {} logit rows exceed the step capacity", in.logit_rows.size());
  auto* logits = static_cast<float*>(logits_->data());
  auto* ids = static_cast<int32_t*>(ids_->data());
  auto* hidden = hidden_buf_ != nullptr ? static_cast<float*>(hidden_buf_->data()) : nullptr;
  logits_out_ = {};
  ids_out_ = {};
  hidden_ = {};
  const Status st = forward_->launch(in, *kv_, logits, hidden, argmax ? ids : nullptr);
  if (!st.ok()) {
    be_.sync();  // whatever was queued before the error
    return st;
  }
  if (argmax) {
    ids_out_ = std::span<const int32_t>(ids, in.logit_rows.size());
  } else {
    logits_out_ = std::span<const float>(logits, n);
  }
  if (!in.hidden_rows.empty())
    hidden_ = std::span<const float>(hidden, in.hidden_rows.size() * model_.hparams().n_embd);
  return {};
}

void Executor::wait() {
  be_.sync();
}

Status Executor::run(const model::StepInput& in, bool argmax) {
  KILN_TRY_STATUS(launch(in, argmax));
  wait();
  return {};
}

}  // namespace kiln::engine
