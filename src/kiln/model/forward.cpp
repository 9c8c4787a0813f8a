#include "kiln/model/forward.h"

#include <algorithm>
#include <cmath>

#include "kiln/model/arch/with_field.h"
#include "kiln/quant/convert.h"

namespace kiln::model {

using backend::Mat;

Forward::Forward(const Model& model, backend::Backend& be, const ForwardOptions& opts)
    : model_(model), be_(be), opts_(opts), place_(model.place()) {
  for (uint32_t il = 0; il < place_.first_layer; ++il)
    ++(model.hparams().linear_layer(il) ? linear_base_ : kv_base_);
  for (uint32_t il = place_.first_layer; il < place_.last_layer; ++il)
    linear_layers_ = linear_layers_ || model.hparams().linear_layer(il);
}

Expected<std::unique_ptr<Forward>> Forward::create(const Model& model, backend::Backend& be,
                                                   const ForwardOptions& opts) {
  ForwardOptions o = opts;
  if (o.max_tokens <= 0) return err("forward: max_tokens must be > 0 (got {})", o.max_tokens);
  if (o.max_seqs <= 0) o.max_seqs = o.max_tokens;
  if (o.max_logit_rows <= 0) o.max_logit_rows = o.max_seqs;
  o.max_logit_rows = std::min(o.max_logit_rows, o.max_tokens);
  o.max_hidden_rows = std::clamp(o.max_hidden_rows, 0, o.max_tokens);
  if (o.max_context <= 0)
    o.max_context = static_cast<int32_t>(std::min<uint32_t>(model.hparams().n_ctx_train, 1u << 20));
  std::unique_ptr<Forward> f(new Forward(model, be, o));
  KILN_TRY_STATUS(f->prepare());
  KILN_TRY_STATUS(f->carve_arena());
  backend::StepCapacity cap;
  cap.max_tokens = o.max_tokens;
  const int64_t blocks_per_seq = (int64_t{o.max_context} + kv::kBlockTokens - 1) / kv::kBlockTokens;
  cap.max_kv_indices = int64_t{o.max_seqs} * blocks_per_seq;
  cap.n_heads = static_cast<int32_t>(model.hparams().n_head);
  cap.head_dim_v = static_cast<int32_t>(model.hparams().head_dim_v);
  KILN_TRY_STATUS(be.reserve_step(cap));
  return f;
}

// The model's weights and vectors as the backend's ops take them (uploaded, repacked): every
// field the manifest binds, the embedding table as rows to gather, the rest as matmul weights
// (the output weight too when it is the tied embedding table).
Status Forward::prepare() {
  using Use = backend::Backend::WeightUse;
  const HParams& hp = model_.hparams();
  weights_ = model_.weights();
  layers_ = model_.layers();
  vocab_split_ = weights_.output.n_out < hp.n_vocab;
  if ((place_.mesh.tp > 1 || place_.mesh.pp > 1) && !be_.supports_mesh())
    return err("{}: no collective ops for a mesh of --tp {} --pp {} yet", be_.name(),
               place_.mesh.tp, place_.mesh.pp);
  auto weight = [&](backend::Weight& w, Use use) -> Status {
    if (w.empty()) return {};
    KILN_TRY(w, be_.prepare_weight(w, use));
    return {};
  };
  auto vec = [&](const float*& v, const std::vector<int64_t>& ne) -> Status {
    if (v == nullptr) return {};
    int64_t n = 1;
    for (int64_t e : ne) n *= e;
    KILN_TRY(v, be_.prepare_vector(v, n));
    return {};
  };
  for (const TensorSpec& spec : tensor_manifest(model_.arch(), hp)) {
    KILN_TRY_STATUS(with_field(
        spec, layers_, weights_,
        [&](backend::Weight& w) {
          return weight(w, &w == &weights_.tok_embd ? Use::kRows : Use::kMatmul);
        },
        [&](const float*& v) -> Status {
          // rope_freqs stays on the host: it only feeds the rope tables below.
          if (&v == &weights_.rope_freqs) return {};
          return vec(v, spec.ne);
        }));
  }
  if (!weights_.token_types.empty()) {  // host copy of row 0 (the table is F32 as converted)
    token_type0_host_.resize(hp.n_embd);
    KILN_TRY_STATUS(quant::dequantize_row(model_.weights().token_types.type,
                                          model_.weights().token_types.data,
                                          token_type0_host_.data(), hp.n_embd));
    KILN_TRY(token_type0_, be_.prepare_vector(token_type0_host_.data(), hp.n_embd));
  }
  rope_[0] = rope_freqs(hp, false, model_.weights().rope_freqs);
  rope_[1] = rope_freqs(hp, true, model_.weights().rope_freqs);
  rope_swa_differs_ = hp.sliding_window > 0 && (rope_[1].inv_freq != rope_[0].inv_freq ||
                                                rope_[1].attn_factor != rope_[0].attn_factor);
  for (int i = 0; i < 2; ++i) {
    rope_table_[i].n_pairs = static_cast<int32_t>(hp.n_rot / 2);
    rope_table_[i].attn_factor = rope_[i].attn_factor;
    KILN_TRY(rope_table_[i].inv_freq,
             be_.prepare_doubles(rope_[i].inv_freq.data(),
                                 static_cast<int64_t>(rope_[i].inv_freq.size())));
  }
  return {};
}

// One allocation for every activation of a step of max_tokens rows.
Status Forward::carve_arena() {
  const HParams& hp = model_.hparams();
  const ArchFeatures& f = model_.arch().features;
  const int64_t t = opts_.max_tokens;
  const int64_t q_width = int64_t{hp.n_head} * hp.head_dim_k;
  const int64_t qkv = q_width + int64_t{hp.n_head_kv} * (int64_t{hp.head_dim_k} + hp.head_dim_v);
  struct Part {
    Mat* m;
    int64_t rows, cols;
  };
  std::vector<Part> parts = {
      {&x_, t, hp.n_embd},
      {&xn_, t,
       std::max<int64_t>(hp.n_embd, int64_t{hp.n_head} * std::max(hp.head_dim_k, hp.head_dim_v))},
      {&q_, t, q_width},
      {&k_, t, int64_t{hp.n_head_kv} * hp.head_dim_k},
      {&v_, t, int64_t{hp.n_head_kv} * hp.head_dim_v},
      {&attn_, t, int64_t{hp.n_head} * hp.head_dim_v},
      // Fused projections (phi3) need room for [q | k | v] and [gate | up] rows.
      {&gate_, t, std::max<int64_t>({hp.n_ff, qkv, hp.n_ff_shared})},
      {&up_, t, std::max(hp.n_ff, hp.n_ff_shared)},
      {&shexp_out_, f.shared_expert ? t : 0, hp.n_embd},
      {&shexp_gate_, f.shared_expert ? t : 0, 1},
      {&tmp2_, f.fused_gate_up ? t : 0, 2 * int64_t{hp.n_ff}},
      {&tmp_, t, hp.n_embd},
      // Rows gathered for the final norm: the logit rows, then the hidden rows.
      {&out_rows_, std::min<int64_t>(t, int64_t{opts_.max_logit_rows} + opts_.max_hidden_rows),
       hp.n_embd},
      {&logits_, opts_.max_logit_rows, hp.n_vocab},
      {&ids_, opts_.max_logit_rows, 1},
      {&logits_part_, vocab_split_ ? opts_.max_logit_rows : 0, weights_.output.n_out},
      {&logits_gathered_, vocab_split_ ? int64_t{opts_.max_logit_rows} * place_.mesh.tp : 0,
       weights_.output.n_out},
      {&row_scale_, hp.attn_temp_scale != 0 ? t : 0, 1},
      {&q_gate_, f.attn_output_gate ? t : 0, 2 * q_width},
      {&attn_gate_, f.attn_output_gate ? t : 0, q_width},
  };
  if (hp.n_linear_layers() > 0) {
    const int64_t value_dim = int64_t{hp.linear_n_v_heads} * hp.linear_head_v_dim;
    const int64_t nv = hp.linear_n_v_heads;
    parts.push_back({&lin_mixed_, t, hp.linear_conv_dim()});
    parts.push_back({&lin_conv_, t, hp.linear_conv_dim()});
    parts.push_back({&lin_z_, t, value_dim});
    parts.push_back({&lin_core_, t, value_dim});
    parts.push_back({&lin_beta_, t, nv});
    parts.push_back({&lin_alpha_, t, nv});
    parts.push_back({&lin_ba_, t, 2 * nv});
  }
  const int64_t n_pairs = hp.n_rot / 2;
  for (int i = 0; i < 2; ++i) {
    const int64_t rows = i == 0 || rope_swa_differs_ ? t : 0;
    parts.push_back({&rope_cos_[i], rows, n_pairs});
    parts.push_back({&rope_sin_[i], rows, n_pairs});
  }
  Mat chosen, x_rows;
  if (hp.n_expert > 0) {
    const int64_t pairs = t * hp.n_expert_used;
    parts.push_back({&moe_.router, t, hp.n_expert});
    parts.push_back({&moe_.weights, t, hp.n_expert_used});
    parts.push_back({&chosen, pairs, 1});  // int32, the same size as a float
    parts.push_back({&x_rows, pairs, 1});
    parts.push_back({&moe_.in, pairs, hp.n_embd});
    parts.push_back({&moe_.gate, pairs, hp.n_ff_expert});
    parts.push_back({&moe_.up, pairs, hp.n_ff_expert});
    parts.push_back({&moe_.out, pairs, hp.n_embd});
    parts.push_back({&moe_.slots, pairs, hp.n_embd});
  }
  constexpr uint64_t kAlign = 256;  // every part starts on a 256-byte boundary
  uint64_t total = 0;
  for (const Part& p : parts)
    total +=
        (static_cast<uint64_t>(p.rows * p.cols) * sizeof(float) + kAlign - 1) / kAlign * kAlign;
  KILN_TRY(arena_, be_.alloc(std::max<uint64_t>(total, kAlign)));
  auto* base = static_cast<uint8_t*>(arena_->data());
  uint64_t off = 0;
  for (const Part& p : parts) {
    *p.m = Mat{reinterpret_cast<float*>(base + off), p.rows, p.cols};
    off += (static_cast<uint64_t>(p.rows * p.cols) * sizeof(float) + kAlign - 1) / kAlign * kAlign;
  }
  moe_.chosen = reinterpret_cast<int32_t*>(chosen.data);
  moe_.x_rows = reinterpret_cast<int32_t*>(x_rows.data);
  if (hp.attn_temp_scale != 0) row_scale_host_.resize(static_cast<size_t>(t));
  if (opts_.max_hidden_rows > 0) out_rows_host_.reserve(static_cast<size_t>(out_rows_.rows));
  return {};
}

void Forward::enable_graphs(int32_t null_kv_block, int32_t null_state_slot) {
  opts_.null_kv_block = null_kv_block;
  opts_.null_state_slot = null_state_slot;
  buckets_.clear();
  graph_of_bucket_.clear();
  // Graph buckets: decode batches of 1, 2, 4, 8, then steps of 8 up to 64 and of 32 beyond,
  // up to the step's sequence and logit-row capacity.
  const int32_t max_rows = std::min({opts_.max_seqs, opts_.max_logit_rows, opts_.max_tokens});
  // A hybrid model's padding rows need a state slot of their own.
  if (opts_.graphs && opts_.null_kv_block >= 0 && be_.supports_graphs() &&
      (model_.hparams().n_linear_layers() == 0 || opts_.null_state_slot >= 0)) {
    for (int32_t b = 1; b <= max_rows; b = b < 8 ? 2 * b : b < 64 ? b + 8 : b + 32)
      buckets_.push_back(b);
    if (buckets_.empty() || buckets_.back() != max_rows) buckets_.push_back(max_rows);
    graph_of_bucket_.assign(buckets_.size(), -1);
  }
}

void Forward::reduce(Mat y) {
  if (place_.mesh.tp > 1) be_.all_reduce_sum(y);
}

void Forward::dump(std::string_view name, int layer, Mat m) {
  if (!dump_) return;
  dump_host_.resize(static_cast<size_t>(m.size()));
  be_.download(dump_host_.data(), m.data, static_cast<uint64_t>(m.size()) * sizeof(float));
  dump_(name, layer, dump_host_.data(), m.rows, m.cols);
}

std::span<const float> Forward::row_scales(const int32_t* positions, int64_t n) {
  const HParams& hp = model_.hparams();
  if (hp.attn_temp_scale == 0) return {};
  // mistral3: Llama 4 temperature tuning of q past orig_ctx
  const double orig = hp.rope_orig_ctx != 0 ? hp.rope_orig_ctx : hp.n_ctx_train;
  for (int64_t t = 0; t < n; ++t) {
    const double pos = positions[t];
    row_scale_host_[t] =
        static_cast<float>(1.0 + hp.attn_temp_scale * std::log(1.0 + std::floor(pos / orig)));
  }
  return std::span<const float>(row_scale_host_.data(), static_cast<size_t>(n));
}

void Forward::body(const backend::StepArgs& step, backend::KvCache& cache,
                   backend::StateCache* state, int64_t n, int64_t n_out, int64_t n_hidden) {
  const HParams& hp = model_.hparams();
  const Mat x = x_.first_rows(n);
  const bool encoder = model_.arch().features.encoder;
  if (!place_.first_stage()) {
    be_.recv(x, place_.stage - 1);  // the previous stage's x, whole
  } else if (encoder) {
    encoder_embeddings(step, n);
  } else {
    be_.embed(weights_.tok_embd, step.tokens, x);
    if (model_.arch().features.embed_scale) be_.scale(x, std::sqrt(static_cast<float>(hp.n_embd)));
    dump("embed", -1, x);
  }
  // The step's cos/sin tables, once for all layers (and the sliding layers' own when they
  // differ); an encoder with a position table has none.
  const int tables = encoder ? (weights_.position_embd.empty() ? 1 : 0) : rope_swa_differs_ ? 2 : 1;
  for (int i = 0; i < tables; ++i)
    be_.rope_angles(rope_table_[i], step.attn.positions, rope_cos_[i].first_rows(n),
                    rope_sin_[i].first_rows(n));
  // Each layer: its mixer, then its FFN, by the architecture's description of the layer. A
  // block leaves its output in tmp_ for the next block to add to x_ (fused with its norm).
  const std::vector<LayerDesc>& descs = model_.layer_descs();
  // The stage's layers (all the main ones but on a pipeline; the multi-token-prediction blocks
  // after them are not run here).
  const int n_layers = static_cast<int>(place_.last_layer);
  for (int il = static_cast<int>(place_.first_layer); il < n_layers; ++il) {
    const LayerDesc& d = descs[static_cast<size_t>(il)];
    switch (d.mixer) {
      case Mixer::kAttention:
        attention_block(il, d, step, cache, n);
        break;
      case Mixer::kEncoderAttention:
        encoder_attention_block(il, step, cache, n);
        break;
      case Mixer::kGatedDeltaNet:
        delta_net_block(il, step, *state, n);  // launch checked there is a state
        break;
      case Mixer::kNextN:
        break;
    }
    switch (d.ffn) {
      case FfnKind::kDense:
        dense_ffn_block(il, n);
        break;
      case FfnKind::kMoe:
        moe_ffn_block(il, n);
        break;
      case FfnKind::kEncoder:
        encoder_ffn_block(il, n);
        break;
    }
  }
  if (!place_.last_stage()) {  // x, whole, to the next stage
    if (!encoder) be_.add(x, tmp_.first_rows(n));
    be_.send(x, place_.stage + 1);
    return;
  }
  if (encoder) {  // post-norm layers leave x whole; no final norm, no logits (launch checks)
    if (n_hidden > 0) be_.gather_rows(x, step.logit_rows, xn_.as(n_out + n_hidden, hp.n_embd));
    return;
  }
  be_.add(x, tmp_.first_rows(n));  // the last layer's FFN output
  dump("layer_out", n_layers - 1, x);
  if (n_out + n_hidden == 0) return;
  // Final norm only for the rows that need it (logits, then hidden states), logits only for
  // the first n_out.
  const Mat rows = out_rows_.first_rows(n_out + n_hidden), xn = xn_.as(n_out + n_hidden, hp.n_embd);
  be_.gather_rows(x, step.logit_rows, rows);
  be_.rmsnorm(rows, weights_.output_norm, xn, hp.rms_eps);
  dump("output_norm", -1, xn);
  if (n_out == 0) return;
  const Mat lg = logits_.first_rows(n_out);
  if (vocab_split_) {  // this rank's columns, then every rank's
    const Mat part = logits_part_.first_rows(n_out);
    be_.matmul(weights_.output, xn.first_rows(n_out), part);
    be_.all_gather_cols(part, logits_gathered_.first_rows(n_out * place_.mesh.tp), lg);
  } else {
    be_.matmul(weights_.output, xn.first_rows(n_out), lg);
  }
  if (hp.final_softcap > 0) be_.softcap(lg, hp.final_softcap);
}

void Forward::download_logits(int64_t n_out, float* logits, int32_t* ids) {
  // Ranks of a mesh other than the one that returns the logits pass no outputs.
  if (n_out <= 0 || (logits == nullptr && ids == nullptr)) return;
  const Mat lg = logits_.first_rows(n_out);
  if (ids != nullptr) {
    int32_t* dev = reinterpret_cast<int32_t*>(ids_.data);
    be_.argmax_rows(lg, dev);
    be_.download_async(ids, dev, static_cast<uint64_t>(n_out) * sizeof(int32_t));
    return;
  }
  be_.download_async(logits, lg.data, static_cast<uint64_t>(lg.size()) * sizeof(float));
}

Status Forward::run(const StepInput& in, backend::KvCache& cache, float* logits, float* hidden,
                    int32_t* ids) {
  const Status st = launch(in, cache, logits, hidden, ids);
  be_.sync();
  KILN_TRY_STATUS(st);
  return be_.take_mesh_error();  // a device that failed in the step (a mesh's rank)
}

Status Forward::check(const StepInput& in) const {
  const HParams& hp = model_.hparams();
  const int64_t n = static_cast<int64_t>(in.tokens.size());
  if (n == 0) return {};
  if (n > opts_.max_tokens)
    return err("forward: {} tokens exceed the step capacity {}", n, opts_.max_tokens);
  if (in.attn.num_seqs > opts_.max_seqs)
    return err("forward: {} sequences exceed the step capacity {}", in.attn.num_seqs,
               opts_.max_seqs);
  for (int32_t tok : in.tokens) {
    if (tok < 0 || static_cast<uint32_t>(tok) >= hp.n_vocab)
      return err("forward: token id {} is outside the vocabulary (0..{})", tok, hp.n_vocab - 1);
  }
  const int64_t n_out = static_cast<int64_t>(in.logit_rows.size());
  if (n_out > opts_.max_logit_rows)
    return err("forward: {} logit rows exceed the step capacity {}", n_out, opts_.max_logit_rows);
  for (int32_t r : in.logit_rows)
    if (r < 0 || r >= n) return err("forward: logit row {} is outside the step (0..{})", r, n - 1);
  const int64_t n_hidden = static_cast<int64_t>(in.hidden_rows.size());
  if (n_hidden > opts_.max_hidden_rows || n_out + n_hidden > out_rows_.rows)
    return err("forward: {} hidden rows exceed the step capacity {}", n_hidden,
               std::min<int64_t>(opts_.max_hidden_rows, out_rows_.rows - n_out));
  if (model_.arch().features.encoder) {
    // Every token sees every other token of its sequence: the whole input is in this step.
    if (n_out > 0) return err("forward: an encoder ({}) has no logits", hp.arch);
    for (int64_t t = 0; t < n; ++t)  // rows of the position table
      if (in.attn.positions[t] < 0 || static_cast<uint32_t>(in.attn.positions[t]) >= hp.n_ctx_train)
        return err("forward: position {} is outside the encoder's {} positions",
                   in.attn.positions[t], hp.n_ctx_train);
    for (int32_t s = 0; s < in.attn.num_seqs; ++s) {
      const int32_t len = in.attn.qo_indptr[s + 1] - in.attn.qo_indptr[s];
      if (in.attn.kv_len[s] != len)
        return err("forward: an encoder's sequence must be whole in one step ({} of {} tokens)",
                   len, in.attn.kv_len[s]);
    }
  }
  for (int32_t r : in.hidden_rows)
    if (r < 0 || r >= n) return err("forward: hidden row {} is outside the step (0..{})", r, n - 1);
  if (linear_layers_) {
    if (in.state == nullptr || in.state_slots.size() != static_cast<size_t>(in.attn.num_seqs))
      return err("forward: a {} step needs a recurrent state slot for each of its {} sequences",
                 hp.arch, in.attn.num_seqs);
    for (int32_t slot : in.state_slots)
      if (slot < 0 || slot >= in.state->num_slots())
        return err("forward: state slot {} is outside the state (0..{})", slot,
                   in.state->num_slots() - 1);
  }
  return {};
}

Status Forward::launch(const StepInput& in, backend::KvCache& cache, float* logits, float* hidden,
                       int32_t* ids) {
  KILN_TRY_STATUS(check(in));
  const HParams& hp = model_.hparams();
  const int64_t n = static_cast<int64_t>(in.tokens.size());
  if (n == 0) return {};
  const int64_t n_out = static_cast<int64_t>(in.logit_rows.size());
  const int64_t n_hidden = static_cast<int64_t>(in.hidden_rows.size());
  // The rank of a mesh that returns the outputs must have somewhere to put the hidden rows.
  if (n_hidden > 0 && hidden == nullptr && place_.tp_rank == 0 && place_.last_stage())
    return err("forward: hidden rows without an output");
  // Decode steps whose logit rows are 0..n_out-1 run from a graph.
  bool decode = !buckets_.empty() && !eager_ && !dump_ && n_hidden == 0 && in.attn.num_seqs == n &&
                n <= buckets_.back();
  for (int64_t i = 0; decode && i < n_out; ++i) decode = in.logit_rows[i] == i;
  // The graphs are captured on one recurrent state (the executor's): another runs eagerly.
  decode = decode && (graph_state_ == nullptr || in.state == graph_state_);
  if (decode) return run_graph(in, cache, logits, ids);

  // One row list for the final norm: the logit rows, then the hidden rows.
  std::span<const int32_t> out_rows = in.logit_rows;
  if (n_hidden > 0) {
    out_rows_host_.assign(in.logit_rows.begin(), in.logit_rows.end());
    out_rows_host_.insert(out_rows_host_.end(), in.hidden_rows.begin(), in.hidden_rows.end());
    out_rows = out_rows_host_;
  }
  backend::HostStep hs{in.tokens, in.attn, out_rows, row_scales(in.attn.positions, n)};
  hs.state_slots = in.state_slots;
  KILN_TRY(const backend::StepArgs step, be_.upload_step(hs));
  body(step, cache, in.state, n, n_out, n_hidden);
  KILN_TRY_STATUS(be_.take_mesh_error());
  if (!place_.last_stage()) return {};
  download_logits(n_out, logits, ids);
  if (n_hidden > 0 &&
      hidden != nullptr) {  // rows [n_out, n_out + n_hidden) of the final norm's output
    const int64_t width = hp.n_embd;
    be_.download_async(hidden, xn_.data + n_out * width,
                       static_cast<uint64_t>(n_hidden * width) * sizeof(float));
  }
  return {};
}

Status Forward::run_graph(const StepInput& in, backend::KvCache& cache, float* logits,
                          int32_t* ids) {
  const int64_t n = static_cast<int64_t>(in.tokens.size());
  const int64_t n_out = static_cast<int64_t>(in.logit_rows.size());
  const size_t b = static_cast<size_t>(
      std::lower_bound(buckets_.begin(), buckets_.end(), static_cast<int32_t>(n)) -
      buckets_.begin());
  const int32_t rows = buckets_[b];
  // The step padded to `rows` sequences of one token: the padding rows are token 0 at
  // position 0 of their own one-block sequence on the null block, and ask for logits (so the
  // graph's shapes are the bucket's); only the first n_out come back.
  const backend::AttnBatch& a = in.attn;
  pad_tokens_.assign(in.tokens.begin(), in.tokens.end());
  pad_tokens_.resize(rows, 0);
  pad_positions_.assign(a.positions, a.positions + n);
  pad_positions_.resize(rows, 0);
  pad_qo_.resize(rows + 1);
  for (int32_t i = 0; i <= rows; ++i) pad_qo_[i] = i;
  pad_kv_ptr_.assign(a.kv_indptr, a.kv_indptr + n + 1);
  pad_kv_idx_.assign(a.kv_indices, a.kv_indices + a.kv_indptr[n]);
  pad_kv_len_.assign(a.kv_len, a.kv_len + n);
  for (int32_t i = static_cast<int32_t>(n); i < rows; ++i) {
    pad_kv_idx_.push_back(opts_.null_kv_block);
    pad_kv_ptr_.push_back(static_cast<int32_t>(pad_kv_idx_.size()));
    pad_kv_len_.push_back(1);
  }
  pad_rows_.resize(rows);
  for (int32_t i = 0; i < rows; ++i) pad_rows_[i] = i;
  if (in.state != nullptr) {  // padding rows: fresh sequences on the null slot
    pad_state_slots_.assign(in.state_slots.begin(), in.state_slots.end());
    pad_state_slots_.resize(rows, opts_.null_state_slot);
  }
  backend::HostStep hs;
  hs.tokens = pad_tokens_;
  hs.attn = {rows,
             pad_qo_.data(),
             pad_kv_ptr_.data(),
             pad_kv_idx_.data(),
             pad_kv_len_.data(),
             pad_positions_.data()};
  hs.logit_rows = pad_rows_;
  hs.row_scale = row_scales(pad_positions_.data(), rows);
  if (in.state != nullptr) hs.state_slots = pad_state_slots_;
  KILN_TRY(const backend::StepArgs step, be_.upload_step(hs));
  if (graph_of_bucket_[b] < 0) {
    graph_state_ = in.state;
    KILN_TRY_STATUS(be_.begin_capture());
    body(step, cache, in.state, rows, rows);
    KILN_TRY(graph_of_bucket_[b], be_.end_capture());
    ++num_graph_captures_;
  }
  be_.replay(graph_of_bucket_[b]);
  ++num_graph_replays_;
  download_logits(n_out, logits, ids);
  return {};
}

}  // namespace kiln::model
