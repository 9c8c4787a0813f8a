#include "kiln/backend/cpu/pack.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "kiln/backend/cpu/matmul.h"
#include "kiln/quant/blocks.h"
#include "kiln/util/status.h"

namespace kiln::backend::cpu {

namespace {

// One row's block of each packed type, written into its R-row packed block: row i of the
// group, blk the row's block as the file stores it. The packed block starts zeroed.

void pack_q8_0_block(uint8_t* out, int64_t R, int64_t i, const uint8_t* blk) {
  std::memcpy(out + 2 * i, blk, 2);
  for (int64_t j = 0; j < 8; ++j) {
    for (int64_t k = 0; k < 4; ++k) {
      out[2 * R + 4 * R * j + 4 * i + k] = static_cast<uint8_t>(blk[2 + 4 * j + k] ^ 0x80);
    }
  }
}

void pack_q4_k_block(uint8_t* out, int64_t R, int64_t i, const uint8_t* blk) {
  std::memcpy(out + 2 * i, blk, 2);
  std::memcpy(out + 2 * R + 2 * i, blk + 2, 2);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc = 0, mn = 0;
    quant::unpack_scale_min_k4(j, blk + 4, &sc, &mn);
    out[4 * R + R * j + i] = sc;
    out[12 * R + 2 * R * (j / 2) + 2 * i + j % 2] = mn;
  }
  // Element l of sub-block j: chunk c = j / 2 of 64, low nibble when j is even.
  const auto q = [&](int j, int l) -> uint8_t {
    const uint8_t byte = blk[16 + 32 * (j / 2) + l];
    return j % 2 == 0 ? byte & 0x0f : byte >> 4;
  };
  for (int j = 0; j < 8; ++j) {
    for (int v = 0; v < 4; ++v) {
      for (int e = 0; e < 4; ++e) {
        out[20 * R + 16 * R * j + 4 * R * v + 4 * i + e] =
            static_cast<uint8_t>(q(j, 4 * v + e) | (q(j, 16 + 4 * v + e) << 4));
      }
    }
  }
}

// The 6-bit value of element e (0..255) of a Q6_K block (ggml's dequantize_row_q6_K order:
// halves of 128, each four quarters of 32 from ql's nibbles and qh's 2-bit fields).
uint8_t q6_k_value(const uint8_t* blk, int e) {
  const int n = e / 128, j = (e % 128) / 32, l = e % 32;
  const uint8_t lo = blk[64 * n + l + 32 * (j & 1)];
  const uint8_t hi = blk[128 + 32 * n + l];
  return static_cast<uint8_t>(((j >= 2 ? lo >> 4 : lo) & 0x0f) | (((hi >> (2 * j)) & 3) << 4));
}

void pack_q6_k_block(uint8_t* out, int64_t R, int64_t i, const uint8_t* blk) {
  std::memcpy(out + 2 * i, blk + 208, 2);
  for (int64_t k = 0; k < 16; ++k) out[2 * R + R * k + i] = blk[192 + k];
  for (int e = 0; e < 256; ++e) {
    const uint8_t q = q6_k_value(blk, e);
    const int64_t v = e / 4, k = v / 4, c = v % 4, at = 4 * i + e % 4;
    uint8_t* sub = out + 18 * R + 12 * R * k;  // sub-block k: low bits, then high bits
    sub[4 * R * (c / 2) + at] |= static_cast<uint8_t>((q & 0x0f) << (4 * (c % 2)));
    sub[8 * R + at] |= static_cast<uint8_t>((q >> 4) << (2 * c));
  }
}

// A packed type: elements and bytes of a block as stored, packed bytes per row and block.
struct PackedFormat {
  int64_t block_elems;
  int64_t block_bytes;
  int64_t packed_row_bytes;
  void (*pack_block)(uint8_t* out, int64_t R, int64_t i, const uint8_t* blk);
};

const PackedFormat* packed_format(quant::Type t) {
  static constexpr PackedFormat kQ8_0{32, 34, kPackedQ8RowBytes, pack_q8_0_block};
  static constexpr PackedFormat kQ4_K{256, 144, kPackedQ4KRowBytes, pack_q4_k_block};
  static constexpr PackedFormat kQ6_K{256, 210, kPackedQ6KRowBytes, pack_q6_k_block};
  switch (t) {
    case quant::Type::Q8_0:
      return &kQ8_0;
    case quant::Type::Q4_K:
      return &kQ4_K;
    case quant::Type::Q6_K:
      return &kQ6_K;
    default:
      return nullptr;
  }
}

// Groups [g0, g1) of R rows of w into dst.
void pack_groups(const Weight& w, const PackedFormat& f, int64_t R, uint8_t* dst, int64_t g0,
                 int64_t g1) {
  const int64_t nb = w.n_in / f.block_elems;
  const int64_t bytes = f.packed_row_bytes * R;
  for (int64_t g = g0; g < g1; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* out = dst + static_cast<uint64_t>(g * nb + b) * bytes;
      std::memset(out, 0, static_cast<size_t>(bytes));
      for (int64_t i = 0; i < R; ++i) {
        f.pack_block(out, R, i, w.row(g * R + i) + b * f.block_bytes);
      }
    }
  }
}

}  // namespace

bool can_pack(const Weight& w, int64_t rows) {
  if (rows != 8 && rows != 16) return false;
  if (w.empty() || w.n_out % rows != 0 || w.n_in <= 0) return false;
  const PackedFormat* f = packed_format(w.type);
  return f != nullptr && w.n_in % f->block_elems == 0;
}

uint64_t packed_bytes(const Weight& w, int64_t rows) {
  const PackedFormat* f = packed_format(w.type);
  KILN_ASSERT(f != nullptr && can_pack(w, rows));
  return static_cast<uint64_t>(w.n_out) * static_cast<uint64_t>(w.n_in / f->block_elems) *
         static_cast<uint64_t>(f->packed_row_bytes);
}

void pack_weight(const Weight& w, int64_t rows, uint8_t* dst) {
  const PackedFormat* f = packed_format(w.type);
  KILN_ASSERT(f != nullptr && can_pack(w, rows));
  // Groups split over the machine's threads (a model load is otherwise single-threaded;
  // packing a 1 GB model on one thread took ~1.5 s).
  const int64_t groups = w.n_out / rows;
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t n = std::min<int64_t>(hw, (groups + 255) / 256);
  if (n <= 1) {
    pack_groups(w, *f, rows, dst, 0, groups);
    return;
  }
  std::vector<std::thread> threads;
  for (int64_t i = 0; i < n; ++i) {
    threads.emplace_back(pack_groups, std::cref(w), std::cref(*f), rows, dst, groups * i / n,
                         groups * (i + 1) / n);
  }
  for (std::thread& t : threads) t.join();
}

void PackedStore::Free::operator()(uint8_t* p) const {
  std::free(p);
}

void PackedStore::pack(Weight* w) {
  const int64_t rows = pack_rows(best_kernel_path());
  if (!can_pack(*w, rows)) return;
  const uint64_t n = packed_bytes(*w, rows);
  constexpr uint64_t kAlign = 2u << 20;  // 2 MiB: transparent huge pages where allowed
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(kAlign, (n + kAlign - 1) / kAlign * kAlign));
  if (p == nullptr) return;  // no memory for the copy: the weight stays as stored
  ::madvise(p, (n + kAlign - 1) / kAlign * kAlign, MADV_HUGEPAGE);
  pack_weight(*w, rows, p);
  buffers_.emplace_back(p);
  copies_.push_back(std::make_unique<PackedCopy>(PackedCopy{p, static_cast<int32_t>(rows)}));
  w->prepared = copies_.back().get();
  bytes_ += n;
}

bool packing_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_PACK");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

}  // namespace kiln::backend::cpu
