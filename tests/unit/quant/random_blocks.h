// Deterministic pseudo-random quant blocks for golden tests: random bytes everywhere, except
// that the f16 (and Q8_K's fp32) scale fields get random *finite* values so that decoded
// rows contain no NaN (whose payload rules differ between implementations). Plain C++ with
// no dependencies, so an out-of-tree program can build the very same bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace kiln::quant::testing {

// xorshift64*: fixed, portable.
struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1DULL;
  }
};

// A finite f16: exponent 0..30 (subnormals included), any sign and mantissa. The exponent is
// kept within 1..22 half the time to give moderate magnitudes.
inline uint16_t random_finite_f16(Rng& r) {
  const uint64_t v = r.next();
  const uint16_t sign = static_cast<uint16_t>((v >> 40) & 0x8000);
  const uint16_t mant = static_cast<uint16_t>(v & 0x3ff);
  const uint16_t exp = (v >> 20) & 1 ? static_cast<uint16_t>((v >> 10) % 31)
                                     : static_cast<uint16_t>(1 + (v >> 10) % 22);
  return static_cast<uint16_t>(sign | (exp << 10) | mant);
}

// block_bytes and the byte offsets of the f16 fields of one block; f32_at >= 0 for Q8_K.
struct RandomLayout {
  uint32_t block_bytes;
  int f16_at[2];  // -1: none
  int f32_at;     // -1: none
};

inline std::vector<uint8_t> random_blocks(const RandomLayout& l, int num_blocks, uint64_t seed) {
  Rng r{seed * 0x9E3779B97F4A7C15ULL + 1};
  std::vector<uint8_t> out(static_cast<size_t>(l.block_bytes) * num_blocks);
  for (auto& b : out) b = static_cast<uint8_t>(r.next() >> 56);
  for (int i = 0; i < num_blocks; ++i) {
    uint8_t* blk = out.data() + static_cast<size_t>(i) * l.block_bytes;
    for (int off : l.f16_at) {
      if (off < 0) continue;
      const uint16_t h = random_finite_f16(r);
      blk[off] = static_cast<uint8_t>(h & 0xff);
      blk[off + 1] = static_cast<uint8_t>(h >> 8);
    }
    if (l.f32_at >= 0) {
      const float f =
          static_cast<float>(static_cast<int64_t>(r.next() >> 40) - (1LL << 23)) / 65536.0f;
      std::memcpy(blk + l.f32_at, &f, 4);
    }
  }
  return out;
}

// FNV-1a 64 over the bit patterns of the floats.
inline uint64_t hash_floats(const float* y, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &y[i], 4);
    for (int k = 0; k < 4; ++k) {
      h ^= (bits >> (8 * k)) & 0xff;
      h *= 0x100000001b3ULL;
    }
  }
  return h;
}

}  // namespace kiln::quant::testing
