#include "kiln/model/shard.h"

#include <cstring>

#include "kiln/model/arch/with_field.h"
#include "kiln/model/model.h"

namespace kiln::model {
namespace {

using Runs = std::vector<std::pair<int64_t, int64_t>>;
using L = LayerWeights;

// Rank r's share of `units` units of `unit` rows each, starting at row `base`: units / tp
// consecutive units, or, when there are fewer units than ranks (GQA's KV heads), the one unit
// that tp / units ranks share.
void heads(Runs& out, int64_t units, int64_t unit, int tp, int r, int64_t base = 0) {
  int64_t first = 0, count = 1;
  if (units >= tp) {
    count = units / tp;
    first = r * count;
  } else {
    first = r / (tp / units);
  }
  out.emplace_back(base + first * unit, base + (first + count) * unit);
}

// The value heads of a linear-attention layer (unit rows each) that go with rank r's key heads.
// Grouped heads (value head h reads key head h / (nv / nk)) are consecutive; tiled heads (h
// reads h % nk, as the qwen35 converter stores them) take the rank's key heads from each of
// the nv / nk tiles, which keeps them tiled on the rank.
void value_heads(Runs& out, const HParams& hp, bool tiled, int64_t unit, int tp, int r,
                 int64_t base = 0) {
  const int64_t nk = hp.linear_n_k_heads, nv = hp.linear_n_v_heads;
  if (!tiled) return heads(out, nv, unit, tp, r, base);
  const int64_t per = nk / tp;
  for (int64_t m = 0; m < nv / nk; ++m)
    out.emplace_back(base + (m * nk + r * per) * unit, base + (m * nk + (r + 1) * per) * unit);
}

template <typename T>
bool is(const TensorSpec& spec, T field) {
  return spec.field == WeightField{field};
}

Placement attention_place(const ArchFeatures& f, const HParams& hp, const TensorSpec& s, int tp,
                          int r) {
  const int64_t dk = hp.head_dim_k, dv = hp.head_dim_v, nh = hp.n_head, nkv = hp.n_head_kv;
  Placement p{Split::kRows, {}};
  if (is(s, &L::wq) || is(s, &L::bq)) {
    heads(p.runs, nh, f.attn_output_gate ? 2 * dk : dk, tp, r);  // [q_h | gate_h] per head
  } else if (is(s, &L::wk) || is(s, &L::bk)) {
    heads(p.runs, nkv, dk, tp, r);
  } else if (is(s, &L::wv) || is(s, &L::bv)) {
    heads(p.runs, nkv, dv, tp, r);
  } else if (is(s, &L::wqkv)) {  // fused [q | k | v]
    heads(p.runs, nh, dk, tp, r);
    heads(p.runs, nkv, dk, tp, r, nh * dk);
    heads(p.runs, nkv, dv, tp, r, (nh + nkv) * dk);
  } else if (is(s, &L::wo)) {
    p.split = Split::kCols;
    heads(p.runs, nh, dv, tp, r);
  } else {
    p.split = Split::kReplicate;
  }
  return p;
}

Placement delta_net_place(const ArchDef& arch, const HParams& hp, const TensorSpec& s, int tp,
                          int r) {
  const bool tiled = arch.name != "qwen3next";  // as blocks/delta_net.cpp reads them
  const int64_t nk = hp.linear_n_k_heads, nv = hp.linear_n_v_heads;
  const int64_t dk = hp.linear_head_k_dim, dv = hp.linear_head_v_dim;
  Placement p{Split::kRows, {}};
  if (is(s, &L::wqkv) || is(s, &L::ssm_conv1d)) {  // [q | k | v] rows (conv taps: per row)
    heads(p.runs, nk, dk, tp, r);
    heads(p.runs, nk, dk, tp, r, nk * dk);
    value_heads(p.runs, hp, tiled, dv, tp, r, 2 * nk * dk);
  } else if (is(s, &L::w_z)) {
    value_heads(p.runs, hp, tiled, dv, tp, r);
  } else if (is(s, &L::w_beta) || is(s, &L::w_alpha) || is(s, &L::ssm_dt_bias) ||
             is(s, &L::ssm_a)) {
    value_heads(p.runs, hp, tiled, 1, tp, r);
  } else if (is(s, &L::w_ba)) {  // [b | a] of each key head's group of value heads
    heads(p.runs, nk, 2 * (nv / nk), tp, r);
  } else if (is(s, &L::ssm_out)) {
    p.split = Split::kCols;
    value_heads(p.runs, hp, tiled, dv, tp, r);
  } else {
    p.split = Split::kReplicate;
  }
  return p;
}

Placement ffn_place(const ArchFeatures& f, const HParams& hp, const LayerDesc& d,
                    const TensorSpec& s, const MeshShape& mesh, int r) {
  const int tp = mesh.tp;
  Placement p{Split::kRows, {}};
  if (d.ffn == FfnKind::kMoe) {
    const int64_t ff = hp.n_ff_expert, fs = hp.n_ff_shared;
    const bool exps = is(s, &L::w_gate_exps) || is(s, &L::w_up_exps) || is(s, &L::w_down_exps);
    if (exps && mesh.ep) {
      p.split = Split::kExperts;
      heads(p.runs, hp.n_expert, 1, tp, r);
    } else if (is(s, &L::w_gate_exps) || is(s, &L::w_up_exps)) {
      heads(p.runs, ff, 1, tp, r);  // of each expert
    } else if (is(s, &L::w_down_exps)) {
      p.split = Split::kCols;
      heads(p.runs, ff, 1, tp, r);
    } else if (is(s, &L::w_gate_shexp) || is(s, &L::w_up_shexp)) {
      heads(p.runs, fs, 1, tp, r);
    } else if (is(s, &L::w_down_shexp)) {
      p.split = Split::kCols;
      heads(p.runs, fs, 1, tp, r);
    } else {
      p.split = Split::kReplicate;  // the router, the shared expert's gate, the norm
    }
    return p;
  }
  const int64_t ff = hp.n_ff;
  if (is(s, &L::w_up) && f.fused_gate_up) {  // [gate | up]
    heads(p.runs, ff, 1, tp, r);
    heads(p.runs, ff, 1, tp, r, ff);
  } else if (is(s, &L::w_gate) || is(s, &L::w_up) || is(s, &L::b_up)) {
    heads(p.runs, ff, 1, tp, r);
  } else if (is(s, &L::w_down)) {
    p.split = Split::kCols;
    heads(p.runs, ff, 1, tp, r);
  } else {
    p.split = Split::kReplicate;
  }
  return p;
}

// The fields of a layer's mixer (everything else in a layer is its FFN's or a norm).
bool mixer_field(const TensorSpec& s) {
  for (auto w : {&L::wq, &L::wk, &L::wv, &L::wo, &L::wqkv, &L::w_z, &L::w_beta, &L::w_alpha,
                 &L::w_ba, &L::ssm_out})
    if (is(s, w)) return true;
  for (auto v : {&L::bq, &L::bk, &L::bv, &L::ssm_conv1d, &L::ssm_dt_bias, &L::ssm_a})
    if (is(s, v)) return true;
  return false;
}

}  // namespace

Placement place_tensor(const ArchDef& arch, const HParams& hp, const TensorSpec& spec,
                       const MeshShape& mesh, int tp_rank) {
  if (mesh.tp <= 1 || std::holds_alternative<std::monostate>(spec.field)) return {};
  if (spec.layer < 0) {
    // The logits by vocabulary (gathered after), when it divides; else every rank has them all.
    if (is(spec, &ModelWeights::output) && hp.n_vocab % static_cast<uint32_t>(mesh.tp) == 0) {
      Placement p{Split::kRows, {}};
      heads(p.runs, hp.n_vocab, 1, mesh.tp, tp_rank);
      return p;
    }
    return {};
  }
  const LayerDesc d = describe_layer(arch, hp, static_cast<uint32_t>(spec.layer));
  if (mixer_field(spec)) {
    if (d.mixer == Mixer::kGatedDeltaNet) return delta_net_place(arch, hp, spec, mesh.tp, tp_rank);
    return attention_place(arch.features, hp, spec, mesh.tp, tp_rank);
  }
  return ffn_place(arch.features, hp, d, spec, mesh, tp_rank);
}

HParams shard_hparams(const HParams& hp, const MeshShape& mesh) {
  HParams h = hp;
  const uint32_t tp = static_cast<uint32_t>(std::max(1, mesh.tp));
  h.n_head /= tp;
  h.n_head_kv = std::max(1u, hp.n_head_kv / tp);
  h.n_ff /= tp;
  if (!mesh.ep) h.n_ff_expert /= tp;
  h.n_ff_shared /= tp;
  h.linear_n_k_heads /= tp;
  h.linear_n_v_heads /= tp;
  return h;
}

namespace {

int64_t run_length(const Runs& runs) {
  int64_t n = 0;
  for (const auto& [b, e] : runs) n += e - b;
  return n;
}

}  // namespace

// A copy of the chosen rows (of each stacked matrix), a view when they are one run of one
// matrix.
Expected<backend::Weight> Model::slice_rows(const backend::Weight& w, const Placement& p) {
  backend::Weight s = w;
  s.n_out = run_length(p.runs);
  if (p.runs.size() == 1 && w.n_mats == 1) {
    s.data = w.row(p.runs[0].first);
    return s;
  }
  std::vector<uint8_t>& buf = owned_bytes_.emplace_back(s.total_bytes());
  uint8_t* dst = buf.data();
  for (int64_t m = 0; m < w.n_mats; ++m) {
    const uint8_t* mat = w.data + static_cast<uint64_t>(m * w.n_out) * w.row_bytes;
    for (const auto& [b, e] : p.runs) {
      const uint64_t bytes = static_cast<uint64_t>(e - b) * w.row_bytes;
      std::memcpy(dst, mat + static_cast<uint64_t>(b) * w.row_bytes, bytes);
      dst += bytes;
    }
  }
  s.data = buf.data();
  return s;
}

// A copy of the chosen input columns of every row: each run must start and end on a block of
// the weight's type.
Expected<backend::Weight> Model::slice_cols(const backend::Weight& w, const Placement& p,
                                            const std::string& name, int tp) {
  const quant::TypeTraits& t = quant::traits(w.type);
  for (const auto& [b, e] : p.runs)
    if (b % t.block_elems != 0 || e % t.block_elems != 0)
      return err(
          "--tp {}: {} splits its rows of {} values at {}, not a whole number of {}-value {} "
          "blocks",
          tp, name, w.n_in, e - b, t.block_elems, t.name);
  backend::Weight s = w;
  s.n_in = run_length(p.runs);
  s.row_bytes = *quant::row_bytes(w.type, static_cast<uint64_t>(s.n_in));
  std::vector<uint8_t>& buf = owned_bytes_.emplace_back(s.total_bytes());
  uint8_t* dst = buf.data();
  for (int64_t r = 0; r < w.n_mats * w.n_out; ++r) {
    const uint8_t* row = w.row(r);
    for (const auto& [b, e] : p.runs) {
      const uint64_t off = *quant::row_bytes(w.type, static_cast<uint64_t>(b));
      const uint64_t bytes = *quant::row_bytes(w.type, static_cast<uint64_t>(e - b));
      std::memcpy(dst, row + off, bytes);
      dst += bytes;
    }
  }
  s.data = buf.data();
  return s;
}

Expected<std::unique_ptr<Model>> Model::shard(const Model& full, const MeshPlace& place) {
  const HParams& hp = full.hp_;
  KILN_TRY_STATUS(check_mesh(hp, place.mesh));
  std::unique_ptr<Model> m(new Model());
  m->parent_ = &full;
  m->arch_ = full.arch_;
  m->hp_ = shard_hparams(hp, place.mesh);
  m->layer_descs_ = full.layer_descs_;
  m->place_ = place;
  m->layers_.resize(full.layers_.size());
  m->weights_ = full.weights_;
  // with_field hands out its fields to write: the whole model's are read from copies.
  std::vector<LayerWeights> whole_layers = full.layers_;
  ModelWeights whole_model = full.weights_;
  for (const TensorSpec& spec : tensor_manifest(*full.arch_, hp)) {
    // A stage holds its own layers only (the model-wide tensors: the embeddings, the output).
    if (spec.layer >= 0 && (static_cast<uint32_t>(spec.layer) < place.first_layer ||
                            static_cast<uint32_t>(spec.layer) >= place.last_layer))
      continue;
    const Placement p = place_tensor(*full.arch_, hp, spec, place.mesh, place.tp_rank);
    // The whole model's value of this field (a tied model's output is the embedding table),
    // then the rank's part of it into m's field.
    backend::Weight whole_w;
    const float* whole_v = nullptr;
    KILN_TRY_STATUS(with_field(
        spec, whole_layers, whole_model,
        [&](backend::Weight& w) -> Status {
          whole_w = w;
          return {};
        },
        [&](const float*& v) -> Status {
          whole_v = v;
          return {};
        }));
    KILN_TRY_STATUS(with_field(
        spec, m->layers_, m->weights_,
        [&](backend::Weight& w) -> Status {
          if (whole_w.empty() || p.split == Split::kReplicate) {
            w = whole_w;
          } else if (p.split == Split::kRows) {
            KILN_TRY(w, m->slice_rows(whole_w, p));
          } else if (p.split == Split::kCols) {
            KILN_TRY(w, m->slice_cols(whole_w, p, spec.name, place.mesh.tp));
          } else {  // whole experts: one run of them
            w = whole_w;
            w.data = whole_w.data +
                     static_cast<uint64_t>(p.runs[0].first * whole_w.n_out) * whole_w.row_bytes;
            w.n_mats = p.runs[0].second - p.runs[0].first;
          }
          return {};
        },
        [&](const float*& v) -> Status {
          if (whole_v == nullptr || p.split == Split::kReplicate) {
            v = whole_v;
            return {};
          }
          const int64_t row = spec.ne.size() > 1 ? spec.ne[0] : 1;
          std::vector<float>& part = m->f32_vectors_.emplace_back();
          for (const auto& [b, e] : p.runs)
            part.insert(part.end(), whole_v + b * row, whole_v + e * row);
          v = part.data();
          return {};
        }));
  }
  return m;
}

}  // namespace kiln::model
