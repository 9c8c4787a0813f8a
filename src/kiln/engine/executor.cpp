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
  if (!mesh.empty()) {
    s += fmt::format("; mesh {}, {} ranks:", mesh, ranks.size());
    for (size_t r = 0; r < ranks.size(); ++r)
      s += fmt::format(" [{}] weights {:.1f} MiB, KV {:.1f} KiB per token, activations {:.1f} MiB",
                       r, mib(ranks[r].weight_bytes),
                       static_cast<double>(ranks[r].kv_bytes_per_token) / 1024,
                       mib(ranks[r].activation_bytes));
  }
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
  const model::MeshShape& mesh = opts.mesh;
  if (mesh.ranks() > 1 || mesh.ep) {
    KILN_TRY_STATUS(model::check_mesh(model.hparams(), mesh));
    KILN_TRY(ex->mesh_, backend::Mesh::create(be, mesh.tp, mesh.pp, {be.name(), opts.mesh_threads},
                                              std::chrono::milliseconds(60000), mesh.devices));
    const auto stages = model::pipeline_stages(model.hparams(), mesh.pp);
    for (int r = 0; r < mesh.ranks(); ++r) {
      model::MeshPlace place;
      place.mesh = mesh;
      place.tp_rank = r % mesh.tp;
      place.stage = r / mesh.tp;
      place.first_layer = stages[static_cast<size_t>(place.stage)].first;
      place.last_layer = stages[static_cast<size_t>(place.stage)].second;
      Rank& rank = ex->ranks_.emplace_back();
      KILN_TRY(rank.shard, model::Model::shard(model, place));
      rank.model = rank.shard.get();
      rank.be = &ex->mesh_->rank(r);
    }
    ex->out_rank_ = static_cast<size_t>((mesh.pp - 1) * mesh.tp);
    ex->rank_threads_ = std::make_unique<util::ThreadPool>(mesh.ranks());
    ex->plan_.mesh = fmt::format("--tp {} --pp {}{}", mesh.tp, mesh.pp, mesh.ep ? " --ep" : "");
  } else {
    Rank& rank = ex->ranks_.emplace_back();
    rank.model = &model;
    rank.be = &be;
  }
  KILN_TRY_STATUS(ex->create_ranks());
  return ex;
}

// Bytes of one KV block on `be`, and *blocks lowered to what its share of memory holds.
Expected<uint64_t> Executor::kv_room(backend::Backend& be, const backend::KvSpec& spec,
                                     uint64_t blocks_per_seq, uint64_t* blocks) const {
  const ExecutorOptions& opts = opts_;
  const uint64_t per_block = be.kv_bytes_per_block(spec);
  if (per_block == 0)
    return err("kv: the {} KV cache cannot hold this model's heads (head dims {}/{})",
               quant::type_name(opts.kv_type), spec.head_dim_k, spec.head_dim_v);
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
  *blocks = std::min<uint64_t>(*blocks, budget / per_block);
  if (*blocks < static_cast<uint64_t>(std::max(1, opts.min_kv_blocks)))
    return err(
        "out of memory for the KV cache on {}: {} bytes hold {} blocks of {} bytes; {} are "
        "needed",
        be.name(), budget, budget / per_block, per_block, std::max(1, opts.min_kv_blocks));
  return per_block;
}

Status Executor::create_ranks() {
  const ExecutorOptions& opts = opts_;
  model::ForwardOptions fo;
  fo.max_tokens = opts.max_tokens;
  fo.max_seqs = std::min(opts.max_seqs, opts.max_tokens);
  fo.max_context = opts.max_context;
  fo.max_logit_rows = opts.max_logit_rows > 0 ? opts.max_logit_rows : fo.max_seqs;
  fo.max_hidden_rows = std::min(opts.max_hidden_rows, opts.max_tokens);
  const uint64_t blocks_per_seq =
      (static_cast<uint64_t>(opts.max_context) + kv::kBlockTokens - 1) / kv::kBlockTokens;
  // Every rank holds the same KV blocks (a sequence's block ids are the mesh's): as many as
  // the rank with the least room can.
  uint64_t blocks = uint64_t{1} << 30;
  for (Rank& rank : ranks_) {
    backend::Backend& be = *rank.be;
    const model::Model& model = *rank.model;
    KILN_TRY(rank.forward, model::Forward::create(model, be, fo));
    // The recurrent state before the KV pool: on a GPU the pool takes what the memory fraction
    // leaves, and the snapshots' slots can weigh as much as the sequences' own.
    if (model.hparams().n_linear_layers() > 0) {  // a recurrent-state slot per sequence
      const backend::StateSpec sspec = model::state_spec(model);
      // Slots: the sequences', the snapshots', and one no sequence uses, which the rows that
      // pad a graph-replayed decode step write.
      if (sspec.n_layer > 0) {  // (a pipeline stage of attention layers only has none)
        KILN_TRY(rank.state, be.create_state(sspec, opts.max_seqs + opts.state_snapshots + 1));
        plan_.state_bytes_per_seq += be.state_bytes_per_slot(sspec);
      }
      plan_.state_slots = opts.max_seqs;
      plan_.state_snapshots = opts.state_snapshots;
    }
    const backend::KvSpec spec = model::kv_spec(model, opts.kv_type);
    uint64_t per_block = 0;
    if (spec.n_layer > 0) {  // (a pipeline stage of linear-attention layers only has none)
      KILN_TRY(per_block, kv_room(be, spec, blocks_per_seq, &blocks));
      plan_.kv_bytes_per_token += per_block / kv::kBlockTokens;
    }
    if (mesh_ != nullptr)
      plan_.ranks.push_back(
          {be.prepared_bytes(), per_block / kv::kBlockTokens, rank.forward->arena_bytes()});
  }
  // The caches hold one block more than the budget gives the sequences: the null block that
  // pads graph-replayed steps.
  for (Rank& rank : ranks_) {
    backend::KvSpec spec = model::kv_spec(*rank.model, opts.kv_type);
    // A stage without attention layers never reads its cache: one block of one layer.
    const bool none = spec.n_layer == 0;
    if (none) spec.n_layer = 1;
    KILN_TRY(rank.kv, rank.be->create_kv(spec, none ? 1 : static_cast<int32_t>(blocks) + 1));
    if (opts.graphs)
      rank.forward->enable_graphs(static_cast<int32_t>(blocks),
                                  rank.state != nullptr ? rank.state->num_slots() - 1 : -1);
  }
  num_blocks_ = static_cast<int32_t>(blocks);

  MemoryPlan& p = plan_;
  backend::Backend& out = *ranks_[out_rank_].be;
  p.device = be_.name();
  p.device_total_bytes = be_.memory().total_bytes;
  for (const Rank& rank : ranks_) {
    p.weight_bytes += rank.be->prepared_bytes();
    p.activation_bytes += rank.forward->arena_bytes();
  }
  p.file_bytes = model_.file().size_bytes();
  p.kv_blocks = static_cast<int32_t>(blocks);
  p.kv_tokens = static_cast<int64_t>(blocks) * kv::kBlockTokens;
  p.max_context = opts.max_context;
  p.max_seqs_at_context = static_cast<int32_t>(blocks / blocks_per_seq);
  logits_capacity_ = static_cast<size_t>(fo.max_logit_rows) * model_.hparams().n_vocab;
  KILN_TRY(logits_, out.alloc_host(logits_capacity_ * sizeof(float)));
  KILN_TRY(ids_, out.alloc_host(static_cast<uint64_t>(fo.max_logit_rows) * sizeof(int32_t)));
  if (fo.max_hidden_rows > 0) {
    KILN_TRY(hidden_buf_, out.alloc_host(static_cast<uint64_t>(fo.max_hidden_rows) *
                                         model_.hparams().n_embd * sizeof(float)));
  }
  return {};
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
  const Status st = mesh_ != nullptr ? launch_mesh(in, logits, hidden, argmax ? ids : nullptr)
                                     : ranks_[0].forward->launch(in, *ranks_[0].kv, logits, hidden,
                                                                 argmax ? ids : nullptr);
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

namespace {

// A part of a step: a run of its sequences with their rows, KV blocks and state slots, and
// where its logit rows go in the step's output.
struct MicroBatch {
  std::vector<int32_t> tokens, positions, qo, kv_ptr, kv_idx, kv_len, logit_rows, slots;
  int64_t first_out = 0;  // index of its first logit row among the step's
  model::StepInput input(const model::StepInput& whole) const {
    model::StepInput in;
    in.tokens = tokens;
    in.attn = {static_cast<int32_t>(kv_len.size()),
               qo.data(),
               kv_ptr.data(),
               kv_idx.data(),
               kv_len.data(),
               positions.data()};
    in.logit_rows = logit_rows;
    in.state = whole.state;
    in.state_slots = slots;
    return in;
  }
};

// The step's sequences in m runs of about equal rows, for the pipeline's stages to overlap
// (stage s runs micro-batch i + 1 while stage s + 1 runs i); empty when the step cannot be cut
// so (one sequence, hidden rows, logit rows out of order).
std::vector<MicroBatch> micro_batches(const model::StepInput& in, int m) {
  const backend::AttnBatch& a = in.attn;
  if (m < 2 || a.num_seqs < 2 || !in.hidden_rows.empty() ||
      !std::is_sorted(in.logit_rows.begin(), in.logit_rows.end()))
    return {};
  m = std::min(m, a.num_seqs);
  const int32_t n = a.qo_indptr[a.num_seqs];
  std::vector<MicroBatch> out;
  int32_t s = 0;
  size_t next_out = 0;
  for (int i = 0; i < m; ++i) {
    MicroBatch& b = out.emplace_back();
    const int32_t row0 = a.qo_indptr[s];
    // Sequences until the parts so far hold their share of the rows: at least one, and one
    // left for each part after it.
    const int32_t goal = static_cast<int32_t>(int64_t{n} * (i + 1) / m);
    const int32_t end = a.num_seqs - (m - 1 - i);
    b.qo.push_back(0);
    b.kv_ptr.push_back(0);
    do {
      b.qo.push_back(a.qo_indptr[s + 1] - row0);
      b.kv_idx.insert(b.kv_idx.end(), a.kv_indices + a.kv_indptr[s],
                      a.kv_indices + a.kv_indptr[s + 1]);
      b.kv_ptr.push_back(static_cast<int32_t>(b.kv_idx.size()));
      b.kv_len.push_back(a.kv_len[s]);
      if (!in.state_slots.empty()) b.slots.push_back(in.state_slots[static_cast<size_t>(s)]);
      ++s;
    } while (s < end && a.qo_indptr[s + 1] <= goal);
    const int32_t row1 = a.qo_indptr[s];
    b.tokens.assign(in.tokens.begin() + row0, in.tokens.begin() + row1);
    b.positions.assign(a.positions + row0, a.positions + row1);
    b.first_out = static_cast<int64_t>(next_out);
    while (next_out < in.logit_rows.size() && in.logit_rows[next_out] < row1)
      b.logit_rows.push_back(in.logit_rows[next_out++] - row0);
  }
  return out;
}

}  // namespace

Status Executor::launch_mesh(const model::StepInput& in, float* logits, float* hidden,
                             int32_t* ids) {
  if (failed_) return err("the device mesh failed earlier: {}", failure_);
  // The step's checks once, before any rank runs it: an error here is the input's.
  KILN_TRY_STATUS(ranks_[0].forward->check(in));
  const std::vector<MicroBatch> parts = micro_batches(in, opts_.mesh.pp);
  const size_t vocab = model_.hparams().n_vocab;
  std::vector<Status> st(ranks_.size());
  auto run = [&](size_t r) {
    Rank& rank = ranks_[r];
    const bool out = r == out_rank_;
    auto step = [&](const model::StepInput& whole_or_part, int64_t first_out) {
      model::StepInput mine = whole_or_part;
      if (in.state != nullptr) mine.state = rank.state.get();
      return rank.forward->run(mine, *rank.kv, out ? logits + first_out * vocab : nullptr,
                               out ? hidden : nullptr, out && ids ? ids + first_out : nullptr);
    };
    try {
      rank.be->bind_thread();
      if (parts.empty()) {
        st[r] = step(in, 0);
      } else {
        for (const MicroBatch& b : parts) {
          st[r] = step(b.input(in), b.first_out);
          if (!st[r].ok()) break;
        }
      }
    } catch (const std::exception& e) {  // a rank thread must not throw (bad_alloc)
      st[r] = err("{}", e.what());
    }
    // The others may be waiting for this rank in a collective: they give up now.
    if (!st[r].ok()) mesh_->abort(fmt::format("rank {}: {}", r, st[r].error().message));
  };
  // Ranks as many as the pool's threads: each thread's static range is its one rank.
  rank_threads_->parallel_for(static_cast<int64_t>(ranks_.size()),
                              [&](int64_t r, int64_t, int) { run(static_cast<size_t>(r)); });
  for (const Status& s : st) {
    if (s.ok()) continue;
    failed_ = true;
    failure_ = s.error().message;
    return err("the device mesh failed: {}", failure_);
  }
  return {};
}

backend::StateCache* Executor::state() {
  for (Rank& rank : ranks_)  // a pipeline stage of attention layers only has none
    if (rank.state != nullptr) return rank.state.get();
  return nullptr;
}

void Executor::state_copy(int32_t src_slot, int32_t dst_slot) {
  for (Rank& rank : ranks_)
    if (rank.state != nullptr) rank.be->state_copy(*rank.state, src_slot, dst_slot);
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
