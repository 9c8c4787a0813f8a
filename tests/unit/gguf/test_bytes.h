// Hand-built GGUF bytes for tests: append fields one by one, remember where each was written,
// patch them later with hostile values.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace kiln::gguf::testing {

class Bytes {
 public:
  size_t pos() const { return b_.size(); }
  const std::vector<uint8_t>& data() const { return b_; }

  size_t u8(uint8_t v) { return put(v); }
  size_t u32(uint32_t v) { return put(v); }
  size_t u64(uint64_t v) { return put(v); }
  size_t f32(float v) { return put(v); }
  // Returns the offset of the u64 length.
  size_t str(std::string_view s) {
    const size_t at = u64(s.size());
    b_.insert(b_.end(), s.begin(), s.end());
    return at;
  }
  void pad_to(size_t alignment) {
    while (b_.size() % alignment != 0) b_.push_back(0);
  }
  void fill(size_t n, uint8_t v) { b_.insert(b_.end(), n, v); }

  void patch_u32(size_t at, uint32_t v) { std::memcpy(&b_[at], &v, 4); }
  void patch_u64(size_t at, uint64_t v) { std::memcpy(&b_[at], &v, 8); }
  void patch_u8(size_t at, uint8_t v) { b_[at] = v; }

 private:
  template <typename T>
  size_t put(T v) {
    const size_t at = b_.size();
    b_.resize(at + sizeof(T));
    std::memcpy(&b_[at], &v, sizeof(T));
    return at;
  }
  std::vector<uint8_t> b_;
};

}  // namespace kiln::gguf::testing
