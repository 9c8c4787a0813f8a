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

// One row's block of each packed type, written into its 8-row packed block: row i of the
// group, blk the row's block as the file stores it. The packed block starts zeroed.

void pack_q8_0_block(uint8_t* out, int i, const uint8_t* blk) {
  std::memcpy(out + 2 * i, blk, 2);
  for (int j = 0; j < 8; ++j) {
    for (int k = 0; k < 4; ++k) {
      out[16 + 32 * j + 4 * i + k] = static_cast<uint8_t>(blk[2 + 4 * j + k] ^ 0x80);
    }
  }
}

void pack_q4_k_block(uint8_t* out, int i, const uint8_t* blk) {
  std::memcpy(out + 2 * i, blk, 2);
  std::memcpy(out + 16 + 2 * i, blk + 2, 2);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc = 0, mn = 0;
    quant::unpack_scale_min_k4(j, blk + 4, &sc, &mn);
    out[32 + 8 * j + i] = sc;
    out[96 + 16 * (j / 2) + 2 * i + j % 2] = mn;
  }
  // Element l of sub-block j: chunk c = j / 2 of 64, low nibble when j is even.
  const auto q = [&](int j, int l) -> uint8_t {
    const uint8_t byte = blk[16 + 32 * (j / 2) + l];
    return j % 2 == 0 ? byte & 0x0f : byte >> 4;
  };
  for (int j = 0; j < 8; ++j) {
    for (int v = 0; v < 4; ++v) {
      for (int e = 0; e < 4; ++e) {
        out[160 + 128 * j + 32 * v + 4 * i + e] =
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

void pack_q6_k_block(uint8_t* out, int i, const uint8_t* blk) {
  std::memcpy(out + 2 * i, blk + 208, 2);
  for (int k = 0; k < 16; ++k) out[16 + 8 * k + i] = blk[192 + k];
  for (int e = 0; e < 256; ++e) {
    const uint8_t q = q6_k_value(blk, e);
    const int v = e / 4, k = v / 4, c = v % 4, at = 4 * i + e % 4;
    uint8_t* sub = out + 144 + 96 * k;  // sub-block k: low bits, then high bits
    sub[32 * (c / 2) + at] |= static_cast<uint8_t>((q & 0x0f) << (4 * (c % 2)));
    sub[64 + at] |= static_cast<uint8_t>((q >> 4) << (2 * c));
  }
}

// A packed type: elements and bytes of a block as stored, bytes of the 8-row packed block.
struct PackedFormat {
  int64_t block_elems;
  int64_t block_bytes;
  int64_t packed_bytes;
  void (*pack_block)(uint8_t* out, int i, const uint8_t* blk);
};

const PackedFormat* packed_format(quant::Type t) {
  static constexpr PackedFormat kQ8_0{32, 34, kPackedQ8BlockBytes, pack_q8_0_block};
  static constexpr PackedFormat kQ4_K{256, 144, kPackedQ4KBlockBytes, pack_q4_k_block};
  static constexpr PackedFormat kQ6_K{256, 210, kPackedQ6KBlockBytes, pack_q6_k_block};
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

// Groups [g0, g1) of w into dst.
void pack_groups(const Weight& w, const PackedFormat& f, uint8_t* dst, int64_t g0, int64_t g1) {
  const int64_t nb = w.n_in / f.block_elems;
  for (int64_t g = g0; g < g1; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* out = dst + static_cast<uint64_t>(g * nb + b) * f.packed_bytes;
      std::memset(out, 0, static_cast<size_t>(f.packed_bytes));
      for (int i = 0; i < kPackRows; ++i) {
        f.pack_block(out, i, w.row(g * kPackRows + i) + b * f.block_bytes);
      }
    }
  }
}

}  // namespace

bool can_pack(const Weight& w) {
  if (w.empty() || w.n_out % kPackRows != 0 || w.n_in <= 0) return false;
  if (best_kernel_path() == KernelPath::Scalar) return false;
  const PackedFormat* f = packed_format(w.type);
  return f != nullptr && w.n_in % f->block_elems == 0;
}

uint64_t packed_bytes(const Weight& w) {
  const PackedFormat* f = packed_format(w.type);
  KILN_ASSERT(f != nullptr);
  return static_cast<uint64_t>(w.n_out / kPackRows) *
         static_cast<uint64_t>(w.n_in / f->block_elems) * static_cast<uint64_t>(f->packed_bytes);
}

void pack_weight(const Weight& w, uint8_t* dst) {
  const PackedFormat* f = packed_format(w.type);
  KILN_ASSERT(f != nullptr && w.n_out % kPackRows == 0);
  // Groups split over the machine's threads (a model load is otherwise single-threaded;
  // packing a 1 GB model on one thread took ~1.5 s).
  const int64_t groups = w.n_out / kPackRows;
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t n = std::min<int64_t>(hw, (groups + 255) / 256);
  if (n <= 1) {
    pack_groups(w, *f, dst, 0, groups);
    return;
  }
  std::vector<std::thread> threads;
  for (int64_t i = 0; i < n; ++i) {
    threads.emplace_back(pack_groups, std::cref(w), std::cref(*f), dst, groups * i / n,
                         groups * (i + 1) / n);
  }
  for (std::thread& t : threads) t.join();
}

void PackedStore::Free::operator()(uint8_t* p) const {
  std::free(p);
}

void PackedStore::pack(Weight* w) {
  if (!can_pack(*w)) return;
  const uint64_t n = packed_bytes(*w);
  constexpr uint64_t kAlign = 2u << 20;  // 2 MiB: transparent huge pages where allowed
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(kAlign, (n + kAlign - 1) / kAlign * kAlign));
  if (p == nullptr) return;  // no memory for the copy: the weight stays as stored
  ::madvise(p, (n + kAlign - 1) / kAlign * kAlign, MADV_HUGEPAGE);
  pack_weight(*w, p);
  w->packed = p;
  buffers_.emplace_back(p);
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
