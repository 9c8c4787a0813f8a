// GGUF v3 writer (little-endian), for tests and tools. Keys keep their insertion order; setting
// an existing key replaces its value in place. Tensor data is aligned to general.alignment
// (default 32) with zero padding between tensors; the file ends right after the last tensor.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/gguf/gguf.h"
#include "kiln/quant/types.h"
#include "kiln/util/status.h"

namespace kiln::gguf {

class Writer {
 public:
  // Any value, including arrays and nested arrays. Checked when the file is written.
  void set(std::string_view key, Value value);

  void set_uint8(std::string_view key, uint8_t v) { set(key, Value::uint8(v)); }
  void set_int8(std::string_view key, int8_t v) { set(key, Value::int8(v)); }
  void set_uint16(std::string_view key, uint16_t v) { set(key, Value::uint16(v)); }
  void set_int16(std::string_view key, int16_t v) { set(key, Value::int16(v)); }
  void set_uint32(std::string_view key, uint32_t v) { set(key, Value::uint32(v)); }
  void set_int32(std::string_view key, int32_t v) { set(key, Value::int32(v)); }
  void set_uint64(std::string_view key, uint64_t v) { set(key, Value::uint64(v)); }
  void set_int64(std::string_view key, int64_t v) { set(key, Value::int64(v)); }
  void set_float32(std::string_view key, float v) { set(key, Value::float32(v)); }
  void set_float64(std::string_view key, double v) { set(key, Value::float64(v)); }
  void set_bool(std::string_view key, bool v) { set(key, Value::boolean(v)); }
  void set_string(std::string_view key, std::string v) { set(key, Value::string(std::move(v))); }

  void set_string_array(std::string_view key, std::span<const std::string> v);
  void set_float_array(std::string_view key, std::span<const float> v);  // array[float32]
  void set_int32_array(std::string_view key, std::span<const int32_t> v);
  void set_uint32_array(std::string_view key, std::span<const uint32_t> v);
  void set_int64_array(std::string_view key, std::span<const int64_t> v);
  void set_array(std::string_view key, ValueType elem_type, std::vector<Value> items) {
    set(key, Value::array(elem_type, std::move(items)));
  }
  // general.alignment as uint32; must be a nonzero power of two (checked when written).
  void set_alignment(uint32_t alignment) { set_uint32(kKeyAlignment, alignment); }

  bool remove(std::string_view key);
  const Value* find(std::string_view key) const;
  const std::vector<KeyValue>& metadata() const { return metadata_; }

  // Copies `data`. Checks: a new name shorter than 64 bytes (ggml's limit), 1..4 dims each
  // >= 1, ne[0] a multiple of the type's block size, data.size() equal to the tensor's bytes.
  Status add_tensor(std::string name, quant::Type type, std::vector<int64_t> ne,
                    std::span<const uint8_t> data);

  Expected<std::vector<uint8_t>> to_bytes() const;
  // Writes `path`.tmp, then renames it to `path` (no half-written file under the real name).
  Status write_file(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    quant::Type type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;
  };
  struct Layout {
    std::vector<uint8_t> header;           // everything before the data section, padded
    std::vector<uint64_t> tensor_offsets;  // relative to the data section
    uint64_t alignment = kDefaultAlignment;
  };
  Expected<Layout> layout() const;

  std::vector<KeyValue> metadata_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace kiln::gguf
