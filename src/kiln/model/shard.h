// How a model lies over the tensor-parallel ranks of a device mesh (the multi-GPU issue),
// derived from the manifest for every architecture alike: which field of the weights a tensor
// is bound to (TensorSpec::field) and the kind of its layer (LayerDesc) decide its placement.
//   - column-parallel (Split::kRows, the output rows split): Q/K/V by heads (KV heads split, or
//     one replicated on each rank when there are fewer KV heads than ranks), gate/up by the
//     FFN width, fused [q | k | v] and [gate | up] part by part, the linear-attention
//     projections by key and value heads, the output projection by vocabulary; their biases
//     and the conv taps alike;
//   - row-parallel (Split::kCols, the input split): attn_output, ffn_down, ssm_out, the
//     experts' and the shared expert's down. Each rank's output is a partial sum: the forward
//     adds them over the ranks (Backend::all_reduce_sum) where the block ends;
//   - expert-parallel (Split::kExperts, --ep): whole experts per rank; the router stays whole
//     and each rank adds the tokens' outputs of its own experts;
//   - everything else replicated: norms, the router, the embedding table.
// Model::shard (model.h) cuts a rank's part of a loaded model by these placements.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kiln/model/arch/arch.h"
#include "kiln/model/mesh.h"

namespace kiln::model {

enum class Split : uint8_t { kReplicate, kRows, kCols, kExperts };

struct Placement {
  Split split = Split::kReplicate;
  // The rank's part along the split dimension as [begin, end) runs, in order: output rows,
  // input columns or experts. For a vector, rows of spec.ne[0] values when it is 2-D (the conv
  // taps), else single values.
  std::vector<std::pair<int64_t, int64_t>> runs;
};

// The placement of manifest tensor `spec` (of the whole model, hyperparameters hp) on
// tensor-parallel rank tp_rank. Assumes check_mesh passed.
Placement place_tensor(const ArchDef& arch, const HParams& hp, const TensorSpec& spec,
                       const MeshShape& mesh, int tp_rank);

// The hyperparameters a tensor-parallel rank computes with: heads, KV heads (at least one),
// FFN widths, linear-attention heads divided by tp; with --ep the expert FFN width stays
// whole (the rank holds n_expert / tp whole experts; routing is over all n_expert). The
// vocabulary stays whole (the logits are gathered).
HParams shard_hparams(const HParams& hp, const MeshShape& mesh);

}  // namespace kiln::model
