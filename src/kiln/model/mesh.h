// The shape of a device mesh (the multi-GPU issue) and what it asks of a model: tensor
// parallelism splits attention heads, FFN widths and experts across tp ranks; pipeline
// parallelism gives each of pp stages a run of whole layers. A mesh that does not divide the
// model is refused at load, naming the dimension (check_mesh), before any tensor is placed.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kiln/model/arch/arch.h"
#include "kiln/util/status.h"

namespace kiln::model {

struct MeshShape {
  int tp = 1;       // tensor-parallel ranks
  int pp = 1;       // pipeline stages
  bool ep = false;  // MoE experts distributed over the tp ranks (else each expert split)
  // --devices: the GPU of each rank, in rank order (empty: consecutive from --device's).
  std::vector<int> devices;

  int ranks() const { return tp * pp; }
};

// Where one rank of a mesh sits: its tensor-parallel rank within its pipeline stage, and the
// stage's layers. Rank number stage * tp + tp_rank.
struct MeshPlace {
  MeshShape mesh;
  int tp_rank = 0;
  int stage = 0;
  uint32_t first_layer = 0;  // the stage's main layers [first_layer, last_layer)
  uint32_t last_layer = 0;

  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == mesh.pp - 1; }
};

// Whether the mesh divides the model: query heads by tp; KV heads by tp, or tp by the KV
// heads (each KV head then replicated on tp / n_head_kv ranks, as vLLM does); the dense FFN
// width, the experts' width (or, with ep, the expert count) and the shared expert's width by
// tp; the linear-attention key and value heads by tp; at least one layer per pipeline stage.
// The error names the dimension, its size and the flag.
Status check_mesh(const HParams& hp, const MeshShape& mesh);

// The layers [first, last) of each of pp pipeline stages, in order: the main layers (the
// multi-token-prediction blocks are not run) split as evenly as they go, earlier stages taking
// the one-layer remainders. Assumes check_mesh passed.
std::vector<std::pair<uint32_t, uint32_t>> pipeline_stages(const HParams& hp, int pp);

}  // namespace kiln::model
