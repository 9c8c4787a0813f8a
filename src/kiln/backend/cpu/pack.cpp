#include "kiln/backend/cpu/pack.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "kiln/backend/cpu/matmul.h"
#include "kiln/util/status.h"

namespace kiln::backend::cpu {

bool can_pack(const Weight& w) {
  if (w.empty() || w.n_out % kPackRows != 0) return false;
  if (best_kernel_path() == KernelPath::Scalar) return false;
  return w.type == quant::Type::Q8_0 && w.n_in % 32 == 0 && w.n_in > 0;
}

uint64_t packed_bytes(const Weight& w) {
  return static_cast<uint64_t>(w.n_out / kPackRows) * static_cast<uint64_t>(w.n_in / 32) *
         kPackedQ8BlockBytes;
}

void pack_weight(const Weight& w, uint8_t* dst) {
  KILN_ASSERT(w.type == quant::Type::Q8_0 && w.n_out % kPackRows == 0);
  const int64_t nb = w.n_in / 32;
  for (int64_t g = 0; g < w.n_out / kPackRows; ++g) {
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
