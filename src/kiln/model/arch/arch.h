// Architectures as data. Each architecture file declares the switches the forward needs and
// a tensor manifest derived from hyperparameters alone (names and shapes exactly as
// llama.cpp's converter writes them). The loader checks a GGUF file against the manifest and
// fails naming the tensor, so a wrong file never becomes a wrong logit.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/model/pooling.h"
#include "kiln/model/weights.h"

namespace kiln::model {

// Rope scaling (`<arch>.rope.scaling.type`). Llama 3's scaling is not a type of its own: it
// comes as per-dimension divisors in the rope_freqs.weight tensor.
enum class RopeScaling : uint8_t {
  kNone,
  kLinear,  // every frequency divided by rope_scale_factor
  kYarn,    // YaRN (arXiv:2309.00071): interpolation ramped by dimension, cos/sin scaled
};

// Hyperparameters read from `<arch>.*` GGUF keys (see hparams.h for the key names).
struct HParams {
  std::string arch;
  uint32_t n_vocab = 0;
  uint32_t n_ctx_train = 0;
  uint32_t n_embd = 0;
  uint32_t n_layer = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  uint32_t n_ff = 0;        // dense FFN width
  uint32_t head_dim_k = 0;  // attention.key_length (defaults to n_embd / n_head)
  uint32_t head_dim_v = 0;  // attention.value_length
  uint32_t n_rot = 0;       // rope.dimension_count (defaults to head_dim_k)
  uint32_t n_expert = 0;    // MoE: experts per layer (0 = dense)
  uint32_t n_expert_used = 0;
  uint32_t n_ff_expert = 0;  // MoE: expert_feed_forward_length
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  bool tied_embeddings = false;  // no output.weight: logits use token_embd.weight
  // Sliding-window attention: a query at position p sees keys p - sliding_window + 1 .. p on
  // the layers where swa_layer(il) holds. 0 = every layer attends to the whole context.
  uint32_t sliding_window = 0;
  // attention.sliding_window_pattern n: layer il slides when il % n < n - 1 (gemma: every
  // n-th layer is global). 0 with a window: every layer slides (Mistral).
  uint32_t swa_pattern = 0;
  float rope_freq_base_swa = 10000.0f;  // rope base of sliding layers (gemma3's local base)
  float attn_scale = 0.0f;              // attention.scale: score scale; 0 = 1 / sqrt(head_dim_k)
  float attn_softcap = 0.0f;            // attn_logit_softcapping: s = c * tanh(s / c); 0 = off
  float final_softcap = 0.0f;           // final_logit_softcapping on the logits; 0 = off

  // Rope scaling (see rope.h for the formulas). Sliding layers use it too unless
  // rope_scaling_swa is false (gemma3: its local layers keep the plain rope).
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_scale_factor = 1.0f;  // rope.scaling.factor: context extension factor
  uint32_t rope_orig_ctx = 0;      // rope.scaling.original_context_length (0 = n_ctx_train)
  bool rope_scaling_swa = true;
  // The cos/sin multiplier ("attention factor"): rope.scaling.yarn_attn_factor or
  // rope.scaling.attn_factor when the file has one, else derived (YaRN: 0.1 ln(factor) + 1,
  // or with rope.scaling.yarn_log_multiplier the DeepSeek mscale ratio); 0 = derive.
  float rope_attn_factor = 0.0f;
  float yarn_log_multiplier = 0.0f;  // 0.1 * mscale_all_dim (DeepSeek-style yarn), 0 = none
  float yarn_ext_factor = 1.0f;      // weight of the extrapolation ramp (1 in transformers)
  float yarn_beta_fast = 32.0f;      // rotations that bound the ramp (the paper's alpha, beta)
  float yarn_beta_slow = 1.0f;
  // attention.temperature_scale (mistral3, Llama 4 style): q *= 1 + attn_temp_scale *
  // ln(1 + floor(pos / orig_ctx)), as transformers' Ministral3 (llama.cpp uses pos + 1). 0 = off.
  float attn_temp_scale = 0.0f;
  // `<arch>.pooling_type`: how an embedding model pools its final hidden states (none for
  // generation models; a server flag may override it).
  Pooling pooling = Pooling::kNone;
  // Encoders (bert): the LayerNorm epsilon (attention.layer_norm_epsilon) and the rows of the
  // token type table.
  float norm_eps = 1e-12f;
  uint32_t n_token_types = 0;
  // Hybrid linear attention (qwen35, qwen35moe, qwen3next): Gated DeltaNet layers with n_k
  // key heads and n_v value heads (ssm.group_count, ssm.time_step_rank), key head dim
  // ssm.state_size, value head dim ssm.inner_size / n_v, a causal conv of ssm.conv_kernel taps;
  // every full_attention_interval-th layer is full attention. The last nextn_predict_layers
  // blocks are multi-token-prediction layers, loaded and not run by the forward.
  uint32_t linear_n_k_heads = 0;
  uint32_t linear_n_v_heads = 0;
  uint32_t linear_head_k_dim = 0;
  uint32_t linear_head_v_dim = 0;
  uint32_t linear_conv_kernel = 0;
  uint32_t full_attn_interval = 0;  // 0: no linear layers
  uint32_t n_nextn_layers = 0;
  uint32_t n_ff_shared = 0;  // MoE shared expert width (expert_shared_feed_forward_length)
  // rope.dimension_sections (qwen35's multimodal rope): kept to write the file back; text
  // tokens have equal positions in every section, which makes it the plain neox rope.
  std::array<int32_t, 4> rope_sections{};

  bool swa_layer(uint32_t il) const {
    if (sliding_window == 0) return false;
    return swa_pattern == 0 || il % swa_pattern < swa_pattern - 1;
  }
  // The layers the forward runs (the multi-token-prediction blocks come after them).
  uint32_t n_main_layers() const { return n_layer - n_nextn_layers; }
  // Whether layer il is a Gated DeltaNet (linear attention) layer.
  bool linear_layer(uint32_t il) const {
    return full_attn_interval > 0 && il < n_main_layers() && (il + 1) % full_attn_interval != 0;
  }
  // The layers that keep KV in the paged cache (all but the linear and the MTP layers of the
  // hybrid models), and the cache's index of attention layer il.
  uint32_t n_kv_layers() const {
    return full_attn_interval > 0 ? n_main_layers() / full_attn_interval : n_layer;
  }
  uint32_t kv_layer(uint32_t il) const {
    return full_attn_interval > 0 ? il / full_attn_interval : il;
  }
  // The linear layers, and the recurrent state's index of linear layer il.
  uint32_t n_linear_layers() const {
    return full_attn_interval > 0 ? n_main_layers() - n_kv_layers() : 0;
  }
  uint32_t linear_index(uint32_t il) const { return il - il / full_attn_interval; }
  // Channels of the conv: [q | k | v] of the linear layers.
  uint32_t linear_conv_dim() const {
    return 2 * linear_n_k_heads * linear_head_k_dim + linear_n_v_heads * linear_head_v_dim;
  }
};

// What a tensor of the manifest may be.
enum class TensorKind : uint8_t {
  kWeight,  // 2-D (or 3-D for experts) matmul weight: any supported quant type
  kNorm,    // 1-D norm weight or bias: F32 (F16/BF16 accepted)
};

// Where the loader puts a tensor: a field of its layer's weights or of the model's. The kind
// follows from the field (a backend::Weight is a matmul weight, a const float* a vector).
using WeightField =
    std::variant<std::monostate, backend::Weight LayerWeights::*, const float * LayerWeights::*,
                 backend::Weight ModelWeights::*, const float * ModelWeights::*>;

struct TensorSpec {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the contiguous row length
  TensorKind kind = TensorKind::kWeight;
  bool required = true;
  int32_t layer = -1;  // the block the tensor belongs to; -1: model-wide
  WeightField field;   // monostate: checked, not loaded
};

// What mixes a layer's tokens, and what kind of feed-forward follows. Each architecture says
// which layer is which (ArchDef::layer); the manifest lists each layer's tensors from it and
// the forward dispatches on it, one block file per kind (model/blocks/).
enum class Mixer : uint8_t {
  kAttention,         // softmax attention over the paged KV cache
  kEncoderAttention,  // bert: non-causal attention, biases, post-norm (blocks/encoder.cpp)
  // Gated DeltaNet linear attention (qwen35, qwen3next; blocks/delta_net.cpp): a causal conv
  // and the gated delta rule over a fixed-size recurrent state per sequence, no KV.
  kGatedDeltaNet,
  // A multi-token-prediction block (qwen35 nextn layers): loaded and described for
  // speculative decoding, not run by the forward.
  kNextN,
};

enum class FfnKind : uint8_t {
  kDense,    // gate/up -> activation -> down
  kMoe,      // routed experts
  kEncoder,  // bert: up -> GELU -> down with biases, post-norm
};

struct LayerDesc {
  Mixer mixer = Mixer::kAttention;
  FfnKind ffn = FfnKind::kDense;
  bool sliding = false;  // attention over a sliding window (HParams::sliding_window)
};

// Switches that distinguish the llama-family forwards.
struct ArchFeatures {
  bool qkv_bias = false;       // qwen2: biases on q/k/v projections
  bool qk_norm = false;        // qwen3: RMSNorm on q and k per head
  bool moe = false;            // qwen3moe: routed experts instead of a dense FFN
  bool rope_neox = false;      // rotate-half pairs (i, i+d/2) instead of adjacent pairs
  bool fused_qkv = false;      // phi3: one attn_qkv projection, [q | k | v] rows
  bool fused_gate_up = false;  // phi3: ffn_up holds [gate | up] rows
  bool gelu = false;           // gemma: GELU (tanh approximation) gate instead of SiLU
  bool embed_scale = false;    // gemma: embeddings times sqrt(n_embd)
  bool sandwich_norm = false;  // gemma2/3: RMSNorm after attention and after the FFN too
  // bert: an encoder. Embeddings only (no logits), every token of a sequence sees every other
  // (so a sequence's whole input is one step and no prefix is reused), post-norm layers.
  bool encoder = false;
  // qwen35/qwen3next full attention: attn_q holds each head's query and an output gate
  // ([q_h | gate_h] per head, twice the width); the attention output is scaled by
  // sigmoid(gate) before attn_output.
  bool attn_output_gate = false;
  // qwen35moe/qwen3next: a shared expert beside the routed ones, scaled by
  // sigmoid(ffn_gate_inp_shexp . x).
  bool shared_expert = false;
  // qwen35/qwen35moe/qwen3next: Gated DeltaNet layers (HParams::linear_layer) beside full
  // attention; each sequence has a recurrent state (a state slot) as well as KV blocks.
  bool linear_attention = false;
};

// An architecture's defaults for keys that files may omit (llama.cpp's defaults).
struct ArchDefaults {
  uint32_t swa_pattern = 0;         // attention.sliding_window_pattern
  float rope_freq_base_swa = 0.0f;  // rope.freq_base_swa; 0: rope.freq_base
  bool rope_scaling_swa = true;     // whether sliding layers use the rope scaling too
};

struct ArchDef {
  std::string_view name;
  ArchFeatures features;
  // Every tensor of a file of this architecture, and where it is loaded (tensor_manifest).
  std::vector<TensorSpec> (*manifest)(const ArchDef& arch, const HParams& hp);
  ArchDefaults defaults{};
  // The kind of layer il; null: attention, a MoE FFN when features.moe (else dense), sliding
  // where hp.swa_layer(il) says (describe_layer).
  LayerDesc (*layer)(const HParams& hp, uint32_t il) = nullptr;
};

// The architecture registered under `name` (general.architecture), or nullptr.
const ArchDef* find_arch(std::string_view name);
// Names of every registered architecture, for messages and --help.
std::vector<std::string_view> arch_names();

std::vector<TensorSpec> tensor_manifest(const ArchDef& arch, const HParams& hp);
LayerDesc describe_layer(const ArchDef& arch, const HParams& hp, uint32_t il);

// Shared manifest pieces (arch/common.cpp).
std::string blk(uint32_t layer, std::string_view suffix);
// A tensor of block il bound to a field of its LayerWeights (a Weight: a matmul weight; a
// const float*: a norm or bias vector).
TensorSpec layer_tensor(uint32_t il, std::string_view suffix, std::vector<int64_t> ne,
                        backend::Weight LayerWeights::*field, bool required = true);
TensorSpec layer_tensor(uint32_t il, std::string_view suffix, std::vector<int64_t> ne,
                        const float* LayerWeights::*field, bool required = true);
void add_embeddings(std::vector<TensorSpec>& out, const HParams& hp);
void add_attention(std::vector<TensorSpec>& out, const HParams& hp, uint32_t layer,
                   const ArchFeatures& f);
void add_dense_ffn(std::vector<TensorSpec>& out, const HParams& hp, uint32_t layer,
                   const ArchFeatures& f);
void add_moe_ffn(std::vector<TensorSpec>& out, const HParams& hp, uint32_t layer);
// The whole llama-family manifest: embeddings, then per layer its mixer's and its FFN's
// tensors by describe_layer (the decoder kinds; bert has a manifest of its own).
std::vector<TensorSpec> standard_manifest(const ArchDef& arch, const HParams& hp);
// Llama's manifest (arch/llama.cpp): the standard one plus the optional rope_freqs.weight of
// Llama 3.x files; mistral3 files have the same tensors.
std::vector<TensorSpec> llama_manifest(const ArchDef& arch, const HParams& hp);
// The hybrid family's manifest (arch/qwen35.cpp): qwen35, qwen35moe, qwen3next.
std::vector<TensorSpec> qwen35_manifest(const ArchDef& arch, const HParams& hp);

}  // namespace kiln::model
