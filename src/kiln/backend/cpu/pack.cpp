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

bool can_pack(const Weight& w) {
  if (w.empty() || w.n_out % kPackRows != 0) return false;
  if (best_kernel_path() == KernelPath::Scalar) return false;
  if (w.n_in <= 0) return false;
  if (w.type == quant::Type::Q8_0) return w.n_in % 32 == 0;
  if (w.type == quant::Type::Q4_K || w.type == quant::Type::Q6_K) return w.n_in % 256 == 0;
  return false;
}

uint64_t packed_bytes(const Weight& w) {
  const uint64_t groups = static_cast<uint64_t>(w.n_out / kPackRows);
  if (w.type == quant::Type::Q4_K) {
    return groups * static_cast<uint64_t>(w.n_in / 256) * kPackedQ4KBlockBytes;
  }
  if (w.type == quant::Type::Q6_K) {
    return groups * static_cast<uint64_t>(w.n_in / 256) * kPackedQ6KBlockBytes;
  }
  return groups * static_cast<uint64_t>(w.n_in / 32) * kPackedQ8BlockBytes;
}

namespace {

void pack_q4_k(const Weight& w, uint8_t* dst, int64_t g0, int64_t g1) {
  const int64_t nb = w.n_in / 256;
  for (int64_t g = g0; g < g1; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* out = dst + static_cast<uint64_t>(g * nb + b) * kPackedQ4KBlockBytes;
      for (int64_t i = 0; i < kPackRows; ++i) {
        const uint8_t* blk = w.row(g * kPackRows + i) + b * 144;
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

void pack_q6_k(const Weight& w, uint8_t* dst, int64_t g0, int64_t g1) {
  const int64_t nb = w.n_in / 256;
  for (int64_t g = g0; g < g1; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* out = dst + static_cast<uint64_t>(g * nb + b) * kPackedQ6KBlockBytes;
      std::memset(out, 0, kPackedQ6KBlockBytes);
      for (int64_t i = 0; i < kPackRows; ++i) {
        const uint8_t* blk = w.row(g * kPackRows + i) + b * 210;
        std::memcpy(out + 2 * i, blk + 208, 2);
        for (int k = 0; k < 16; ++k) out[16 + 8 * k + i] = blk[192 + k];
        for (int e = 0; e < 256; ++e) {
          const uint8_t q = q6_k_value(blk, e);
          const int v = e / 4, k = v / 4, c = v % 4, at = 4 * static_cast<int>(i) + e % 4;
          uint8_t* sub = out + 144 + 96 * k;  // sub-block k: low bits, then high bits
          sub[32 * (c / 2) + at] |= static_cast<uint8_t>((q & 0x0f) << (4 * (c % 2)));
          sub[64 + at] |= static_cast<uint8_t>((q >> 4) << (2 * c));
        }
      }
    }
  }
}

void pack_q8_0(const Weight& w, uint8_t* dst, int64_t g0, int64_t g1) {
  const int64_t nb = w.n_in / 32;
  for (int64_t g = g0; g < g1; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* out = dst + static_cast<uint64_t>(g * nb + b) * kPackedQ8BlockBytes;
      for (int64_t i = 0; i < kPackRows; ++i) {
        const uint8_t* blk = w.row(g * kPackRows + i) + b * 34;
        std::memcpy(out + 2 * i, blk, 2);
        for (int64_t j = 0; j < 8; ++j) {
          for (int64_t k = 0; k < 4; ++k) {
            out[16 + 32 * j + 4 * i + k] = static_cast<uint8_t>(blk[2 + 4 * j + k] ^ 0x80);
          }
        }
      }
    }
  }
}

}  // namespace

void pack_weight(const Weight& w, uint8_t* dst) {
  KILN_ASSERT(w.n_out % kPackRows == 0);
  void (*fn)(const Weight&, uint8_t*, int64_t, int64_t) = nullptr;
  switch (w.type) {
    case quant::Type::Q8_0:
      fn = pack_q8_0;
      break;
    case quant::Type::Q4_K:
      fn = pack_q4_k;
      break;
    case quant::Type::Q6_K:
      fn = pack_q6_k;
      break;
    default:
      KILN_ASSERT(false);
  }
  // Groups split over the machine's threads (a model load is otherwise single-threaded;
  // packing a 1 GB model on one thread took ~1.5 s).
  const int64_t groups = w.n_out / kPackRows;
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t n = std::min<int64_t>(hw, (groups + 255) / 256);
  if (n <= 1) {
    fn(w, dst, 0, groups);
    return;
  }
  std::vector<std::thread> threads;
  for (int64_t i = 0; i < n; ++i) {
    threads.emplace_back(fn, std::cref(w), dst, groups * i / n, groups * (i + 1) / n);
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
