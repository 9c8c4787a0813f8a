// The batched int8 tensor-core matmul (mmq.cu) and the matmul context's switch for it: a
// header of its own beside kernels.h, which matmul.cu, mmq.cu and their tests include.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kiln/backend/cuda/kernels.h"

namespace kiln::backend::cuda {

// The largest token count the context's int8 activations (and so the mmq path) can hold.
constexpr int kMmqMaxTokens = 256;
// Whether mmq takes w: Q4_0 or Q8_0 with n_in % 32 == 0, Q4_K, Q5_K or Q6_K with n_in % 256 ==
// 0 (any 2-byte aligned rows).
bool mmq_supports(const Weight& w);
// Device scratch for mmq's split-K (partial sums and one counter per output tile, zero between
// launches: each launch leaves them so). tile_tokens (16, 32, 64) and splits force a tiling
// (for benchmarks and tests); 0 lets mmq choose from the shape.
struct MmqScratch {
  float* partials = nullptr;
  int64_t partial_floats = 0;
  int32_t* counters = nullptr;
  int64_t n_counters = 0;
  int tile_tokens = 0;
  int splits = 0;
  // mmh: each weight's split count fixed by its shape and this scratch's size alone, never by
  // the token count (the deterministic mode: a token's sums in one order whatever the batch);
  // the tokens then go in runs whose partial sums the scratch holds.
  bool by_shape = false;
};
// y = w x for n_tokens of x quantized by quantize_q8_32 (xq [n_tokens, w.n_in], xds [n_tokens,
// w.n_in / 32]), with int8 MMA on the weights as stored (mmq.cu says how): the exact weights'
// dot with the rounded activations up to fp32 summation, as matvec_q8. Meant for 9..~256
// tokens; any count works.
void mmq(const Weight& w, float* y, const int8_t* xq, const float2* xds, int64_t n_tokens,
         const MmqScratch& scratch, cudaStream_t s);

// The grouped mmq of matmul_id (many pairs): pairs grouped by expert into tiles of at most
// tile_pairs (16, 32 or 64) pairs of one expert, planned on the device (matmul.cu's
// moe_plan_kernel). Tile slot i: expert tiles[3i], pairs perm[tiles[3i + 1] + j] for j <
// tiles[3i + 2]; slots at and past *num_tiles are empty, tile_slots bounds it on the host.
struct MmqIdTiles {
  const int32_t* tiles = nullptr;      // device [3 * tile_slots]
  const int32_t* num_tiles = nullptr;  // device [1]
  const int32_t* perm = nullptr;       // device [n_pairs]: pair indices grouped by expert
  const int32_t* x_rows = nullptr;     // device [n_pairs]: pair p reads row x_rows[p] of xq
  int64_t tile_slots = 0;              // <= 65535
  int tile_pairs = 16;
};
// y[p] = W_{e(p)} x[x_rows[p]] for the pairs of the tiles, with x quantized by quantize_q8_32
// (xq [rows, n_in], xds [rows, n_in / 32]) and W_e expert e of stacked (stacked.n_out rows
// each, back to back): mmq's kernel, its weight base per tile and its activation and output
// rows through the pair indices, no split-K; the same arithmetic as mmq, and a pair's result
// depends neither on the tile width nor on the other pairs. y [n_pairs, stacked.n_out]; rows of
// pairs in no tile are left unwritten.
void mmq_id(const Weight& stacked, float* y, const int8_t* xq, const float2* xds,
            const MmqIdTiles& tiles, cudaStream_t s);
// The tile width for n_pairs spread over n_expert experts: 16 below 24 pairs per expert on
// average, 32 below 48, else 64 (the padding of a part-filled tile costs the epilogue as much
// as a real pair; wider tiles read each expert's weights fewer times).
int mmq_id_tile_pairs(int64_t n_pairs, int64_t n_expert);

// For benchmarks and tests: the context's matmul sends 9..max_tokens tokens to mmq for weights
// of every size (at most what its int8 activations hold; 0: none, everything above 8 tokens goes
// to dequantize + cuBLAS), with the tiling forced when tile_tokens / splits are nonzero
// (MmqScratch). By default mmq takes 9..64 tokens for weights of 4096 x 4096 values or more,
// 9..16 for smaller ones (matmul.cu).
void matmul_set_mmq(MatmulContext* ctx, int64_t max_tokens, int tile_tokens = 0, int splits = 0);

// For benchmarks and tests: matmul_id takes the grouped mmq for calls of more than min_pairs
// pairs (default kMmqIdMinPairs; a huge value: never), tiles of tile_pairs pairs when nonzero
// (else mmq_id_tile_pairs).
void matmul_set_mmq_id(MatmulContext* ctx, int64_t min_pairs, int tile_pairs = 0);
// matmul_id's default: the grouped mmq above this many pairs (matmul.cu says why).
constexpr int64_t kMmqIdMinPairs = 64;

}  // namespace kiln::backend::cuda
