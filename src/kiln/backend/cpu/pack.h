// Interleaved ("packed") weight layouts for the CPU kernels, made once at load.
//
// A GGUF matrix stores each output row's blocks one after another, so a SIMD dot works on
// one row at a time and pays its per-block fp32 work (scale conversion, multiply-add,
// final horizontal sum) once per row. Packed, the blocks of R consecutive rows sit side by
// side: one vector holds 4 consecutive weights of each of the R rows, a VNNI `vpdpbusd`
// against 4 activation bytes broadcast to all lanes yields R rows' partial dots, and the
// block's fp32 work is one vector operation for R rows. Each lane is one output row,
// accumulated over its blocks in order: the result no longer needs a horizontal sum, and
// every token count (decode or prefill) runs the same per-(row, token) operations.
//
// R (pack_rows) is the kernel path's vector width in int32 lanes: 16 on AVX-512 (one zmm:
// half the instructions, loads and broadcasts per product of 8-row ymm; 1.34x in L1 on
// Zen 4), 8 on AVX2. Every offset below scales with R; "a vector" is 4R bytes.
//
// Q8_0, per block b of group g (rows Rg .. Rg+R-1), 34R bytes at (g * n_blocks + b) * 34R:
//   [0, 2R)      the R rows' f16 scales d, row order
//   [2R, 34R)    8 vectors; vector j holds bytes 4j..4j+3 of each row's 32 qs (row i at
//                bytes 4i..4i+3), each stored as q + 128 (unsigned, as vpdpbusd's first
//                operand wants; the activations' offs term removes the 128 x sum)
//
// Q4_K, per super-block b of group g, 148R bytes at (g * n_blocks + b) * 148R:
//   [0, 2R)      the R rows' f16 d;  [2R, 4R) the R rows' f16 dmin
//   [4R, 12R)    6-bit scales: byte 4R + Rj + i = scale of sub-block j of row i
//   [12R, 20R)   6-bit mins in pairs: 2R bytes per k, bytes 2i and 2i + 1 = mins of
//                sub-blocks 2k and 2k + 1 of row i (widened to int16 pairs for vpdpwssd)
//   [20R, 148R)  nibbles: sub-block j at 20R + 16R j, 4 vectors; byte 4i + e of vector v
//                holds element 4v + e of row i's sub-block j (low nibble) and element
//                16 + 4v + e (high nibble)
//
// Q6_K, per super-block b of group g, 210R bytes at (g * n_blocks + b) * 210R, the 6-bit
// values q (0..63; the weight is d * scale * (q - 32)) as 64 "element vectors", vector v
// holding elements 4v..4v+3 of each row (row i at bytes 4i..4i+3):
//   [0, 2R)       the R rows' f16 d
//   [2R, 18R)     int8 scales: byte 2R + Rk + i = scale of 16-element sub-block k of row i
//   [18R, 210R)   16-element sub-block k at 18R + 12R k, 3 vectors: vector h (0, 1) holds
//                 the low 4 bits of element vectors 4k + 2h (low nibbles) and 4k + 2h + 1
//                 (high nibbles); vector 2 the high 2 bits of element vector 4k + c in bits
//                 2c..2c+1. One sequential stream: a layout with the high bits in a
//                 separate region read 30% slower from DRAM (two interleaved streams
//                 defeat the hardware prefetcher).
// Only matrices with n_out a multiple of R are packed; the values are exactly the file's.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/backend/cpu/matmul.h"
#include "kiln/backend/weight.h"

namespace kiln::backend::cpu {

// Packed bytes per row and block: a packed block of R rows is R times this.
inline constexpr int64_t kPackedQ8RowBytes = 34;
inline constexpr int64_t kPackedQ4KRowBytes = 148;  // the file's 144, mins widened to int16
inline constexpr int64_t kPackedQ6KRowBytes = 210;

// Rows per packed group for a kernel path's packed kernels (0: the path has none): the
// path's int32 lanes per vector. kernels_avx2.cpp / kernels_avx512.cpp assert that their
// packed kernels' vector has this many.
constexpr int64_t pack_rows(KernelPath path) {
  switch (path) {
    case KernelPath::Scalar:
      return 0;
    case KernelPath::Avx2:
      return 8;
    case KernelPath::Avx512:
      return 16;
  }
  return 0;
}
// Whether there is a packed layout of R = rows rows for this weight.
bool can_pack(const Weight& w, int64_t rows);
// Bytes of the packed copy of w (can_pack(w, rows) must hold).
uint64_t packed_bytes(const Weight& w, int64_t rows);
// Writes the packed copy of w to dst (packed_bytes(w, rows) bytes).
void pack_weight(const Weight& w, int64_t rows, uint8_t* dst);

// A weight's packed copy: what Weight::prepared points to for the CPU backend.
struct PackedCopy {
  const uint8_t* data = nullptr;
  int32_t rows = 0;  // rows per group (pack_rows of the path it was made for)
};
inline const PackedCopy* packed_copy(const Weight& w) {
  return static_cast<const PackedCopy*>(w.prepared);
}

// Owns the packed copies of a model's weights.
class PackedStore {
 public:
  // Packs *w for the best kernel path when can_pack holds and points w->prepared at the
  // copy; otherwise (or when the copy cannot be allocated) leaves it unchanged.
  void pack(Weight* w);
  uint64_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::vector<std::unique_ptr<uint8_t, Free>> buffers_;
  std::vector<std::unique_ptr<PackedCopy>> copies_;
  uint64_t bytes_ = 0;
};

// Whether weights get packed at load (default on; KILN_PACK=0 in the environment turns it
// off, for side-by-side measurements).
bool packing_enabled();

}  // namespace kiln::backend::cpu
