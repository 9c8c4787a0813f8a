// Interleaved ("packed") weight layouts for the CPU kernels, made once at load.
//
// A GGUF matrix stores each output row's blocks one after another, so a SIMD dot works on
// one row at a time and pays its per-block fp32 work (scale conversion, multiply-add,
// final horizontal sum) once per row. Packed, the blocks of 8 consecutive rows sit side by
// side: one 256-bit vector holds 4 consecutive weights of each of the 8 rows, a VNNI
// `vpdpbusd` against 4 activation bytes broadcast to all lanes yields 8 rows' partial dots,
// and the block's fp32 work is one vector operation for 8 rows. Each lane is one output
// row, accumulated over its blocks in order: the result no longer needs a horizontal sum,
// and every token count (decode or prefill) runs the same per-(row, token) operations.
//
// Q8_0 x 8 rows (kPackRows), per block b of group g (rows 8g .. 8g+7), 272 bytes at
// (g * n_blocks + b) * 272:
//   [0, 16)    the 8 rows' f16 scales d, row order
//   [16, 272)  8 vectors of 32 bytes; vector j holds bytes 4j..4j+3 of each row's 32 qs
//              (row i at bytes 4i..4i+3), each stored as q + 128 (unsigned, as vpdpbusd's
//              first operand wants; the activations' offs term removes the 128 x sum)
//
// Q4_K x 8 rows, per super-block b of group g, 1184 bytes at (g * n_blocks + b) * 1184:
//   [0, 16)      the 8 rows' f16 d;  [16, 32) the 8 rows' f16 dmin
//   [32, 96)     6-bit scales: byte 8j + i = scale of sub-block j of row i
//   [96, 160)    6-bit mins in pairs: 16 bytes per k, bytes 2i and 2i + 1 = mins of
//                sub-blocks 2k and 2k + 1 of row i (widened to int16 pairs for vpdpwssd)
//   [160, 1184)  nibbles: sub-block j at 160 + 128 j, 4 vectors of 32 bytes; byte 4i + e of
//                vector v holds element 4v + e of row i's sub-block j (low nibble) and element
//                16 + 4v + e (high nibble)
//
// Q6_K x 8 rows, per super-block b of group g, 1680 bytes at (g * n_blocks + b) * 1680, the
// 6-bit values q (0..63; the weight is d * scale * (q - 32)) as 64 "element vectors" of 32
// bytes, vector v holding elements 4v..4v+3 of each row (row i at bytes 4i..4i+3):
//   [0, 16)       the 8 rows' f16 d
//   [16, 144)     int8 scales: byte 8k + i = scale of 16-element sub-block k of row i
//   [144, 1680)   16-element sub-block k at 144 + 96 k, 3 vectors of 32 bytes: vector h
//                 (0, 1) holds the low 4 bits of element vectors 4k + 2h (low nibbles) and
//                 4k + 2h + 1 (high nibbles); vector 2 the high 2 bits of element vector
//                 4k + c in bits 2c..2c+1. One sequential stream: a layout with the high
//                 bits in a separate region read 30% slower from DRAM (two interleaved
//                 streams defeat the hardware prefetcher).
// Only matrices with n_out a multiple of 8 are packed; the values are exactly the file's.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/backend/weight.h"

namespace kiln::backend::cpu {

inline constexpr int64_t kPackRows = 8;
inline constexpr int64_t kPackedQ8BlockBytes = 272;
inline constexpr int64_t kPackedQ4KBlockBytes = 1184;  // 8 x 144 + 32
inline constexpr int64_t kPackedQ6KBlockBytes = 1680;

// Whether the CPU backend has a packed layout and kernel for this weight on this machine.
bool can_pack(const Weight& w);
// Bytes of the packed copy of w (can_pack(w) must hold).
uint64_t packed_bytes(const Weight& w);
// Writes the packed copy of w to dst (packed_bytes(w) bytes).
void pack_weight(const Weight& w, uint8_t* dst);

// Owns the packed copies of a model's weights.
class PackedStore {
 public:
  // Packs *w when can_pack(*w) and sets w->packed; otherwise (or when the copy cannot be
  // allocated) leaves it unchanged.
  void pack(Weight* w);
  uint64_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::vector<std::unique_ptr<uint8_t, Free>> buffers_;
  uint64_t bytes_ = 0;
};

// Whether weights get packed at load (default on; KILN_PACK=0 in the environment turns it
// off, for side-by-side measurements).
bool packing_enabled();

}  // namespace kiln::backend::cpu
