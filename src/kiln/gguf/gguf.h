// GGUF reader: metadata key/values and tensor infos of a GGUF v2 or v3 file (little-endian),
// with zero-copy views of the tensor data. Format: ggml docs/gguf.md.
//
//   magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
//   n_kv x      { key: string, value_type u32, value }
//   n_tensors x { name: string, n_dims u32, ne[n_dims] u64, type u32, offset u64 }
//   zero padding to general.alignment (default 32)
//   tensor data: each tensor at data_start + offset (offset a multiple of the alignment)
//
// string = u64 length + bytes (no NUL). array = elem_type u32 + count u64 + elements.
//
// Everything read from the file is checked before use: counts and lengths against the bytes
// remaining, tensor ranges against the file end and each other. A bad file gives an Error that
// names the field and the byte offset, never a crash or a huge allocation.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/quant/types.h"
#include "kiln/util/mmap.h"
#include "kiln/util/status.h"

namespace kiln::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr int kMaxDims = 4;
inline constexpr int kMaxArrayDepth = 8;  // arrays nested deeper than this are rejected
// Bounds on what one file may ask the reader to hold, far above any real model (the largest
// vocabularies are ~260k tokens; the largest models ~50k tensors). They keep a hostile header
// in a large file from costing memory out of proportion: each metadata value is one Value
// (~48 bytes) however small its encoding (1 byte for a uint8 array element).
inline constexpr uint64_t kMaxMetadataValues = uint64_t{1} << 23;  // keys + all array elements
inline constexpr uint64_t kMaxTensors = uint64_t{1} << 20;
inline constexpr const char* kKeyAlignment = "general.alignment";

// Metadata value type ids as written on disk (append-only).
enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint8", "int32", "float32", "bool", "string", "array", ...; "type#N" for an unknown id.
std::string value_type_name(ValueType t);
bool is_valid_value_type(uint32_t id);

struct Value;

struct Array {
  ValueType elem_type = ValueType::kUint8;
  std::vector<Value> items;  // every item has type == elem_type
};

// One metadata value. `type` is the on-disk type; the payload is widened:
// unsigned types -> uint64_t, signed -> int64_t, float32/64 -> double.
struct Value {
  ValueType type = ValueType::kUint8;
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> data;

  static Value uint8(uint8_t v) { return {ValueType::kUint8, uint64_t{v}}; }
  static Value uint16(uint16_t v) { return {ValueType::kUint16, uint64_t{v}}; }
  static Value uint32(uint32_t v) { return {ValueType::kUint32, uint64_t{v}}; }
  static Value uint64(uint64_t v) { return {ValueType::kUint64, v}; }
  static Value int8(int8_t v) { return {ValueType::kInt8, int64_t{v}}; }
  static Value int16(int16_t v) { return {ValueType::kInt16, int64_t{v}}; }
  static Value int32(int32_t v) { return {ValueType::kInt32, int64_t{v}}; }
  static Value int64(int64_t v) { return {ValueType::kInt64, v}; }
  static Value float32(float v) { return {ValueType::kFloat32, double{v}}; }
  static Value float64(double v) { return {ValueType::kFloat64, v}; }
  static Value boolean(bool v) { return {ValueType::kBool, v}; }
  static Value string(std::string v) { return {ValueType::kString, std::move(v)}; }
  static Value array(ValueType elem_type, std::vector<Value> items) {
    return {ValueType::kArray, Array{elem_type, std::move(items)}};
  }

  bool is_integer() const;
  bool is_float() const { return type == ValueType::kFloat32 || type == ValueType::kFloat64; }

  // Any integer type whose value fits; nullopt otherwise (negative, too big, not an integer).
  std::optional<uint64_t> as_uint() const;
  std::optional<int64_t> as_int() const;
  // A float type, or any integer type converted.
  std::optional<double> as_float() const;
  std::optional<bool> as_bool() const;
  const std::string* as_string() const { return std::get_if<std::string>(&data); }
  const Array* as_array() const { return std::get_if<Array>(&data); }

  // "uint32", "string", "array[string]", "array[array]" (for messages).
  std::string type_description() const;
};

// Debug print for `kiln inspect`: 42, 1.5, true, "text" (escaped, long strings cut),
// [1, 2, 3, ... (+N more)].
struct PrintLimits {
  size_t max_array_items = 16;
  size_t max_string_bytes = 120;
};
std::string to_string(const Value& v, const PrintLimits& limits = {});

struct KeyValue {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  quant::Type type = quant::Type::F32;
  std::vector<int64_t> ne;        // ggml order: ne[0] is the contiguous row length; 1..4 dims
  uint64_t offset = 0;            // relative to the data section start
  uint64_t size_bytes = 0;        // exact bytes of the data (no padding)
  const uint8_t* data = nullptr;  // points into the file's memory

  int64_t num_elements() const;
  std::span<const uint8_t> bytes() const { return {data, static_cast<size_t>(size_bytes)}; }
};

class File {
 public:
  // Maps the file at `path` and parses it. Errors start with "gguf: '<path>': ".
  static Expected<std::unique_ptr<File>> open(const std::string& path);
  // Parses `bytes` in place. The memory is borrowed: it must outlive the File and its views.
  static Expected<std::unique_ptr<File>> parse(std::span<const uint8_t> bytes);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section
  uint64_t size_bytes() const { return bytes_.size(); }
  const std::string& path() const { return mapping_.path(); }  // empty for parse()

  const std::vector<KeyValue>& metadata() const { return metadata_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed getters. A missing key is an error ("gguf: missing key 'x'"); a wrong type names the
  // key, the expected and the actual type. Integer getters accept any integer type and check
  // the range; get_float accepts floats and integers.
  Expected<uint64_t> get_uint(std::string_view key) const;
  Expected<int64_t> get_int(std::string_view key) const;
  Expected<double> get_float(std::string_view key) const;
  Expected<bool> get_bool(std::string_view key) const;
  Expected<std::string> get_string(std::string_view key) const;
  // Same, but a missing key gives `fallback` (a present key of the wrong type is still an error).
  Expected<uint64_t> get_uint_or(std::string_view key, uint64_t fallback) const;
  Expected<int64_t> get_int_or(std::string_view key, int64_t fallback) const;
  Expected<double> get_float_or(std::string_view key, double fallback) const;
  Expected<bool> get_bool_or(std::string_view key, bool fallback) const;
  Expected<std::string> get_string_or(std::string_view key, std::string fallback) const;

  // Arrays: every element must convert (the error names the key and the element index).
  Expected<std::vector<std::string>> get_string_array(std::string_view key) const;
  Expected<std::vector<float>> get_float_array(std::string_view key) const;
  Expected<std::vector<int64_t>> get_int_array(std::string_view key) const;
  Expected<std::vector<uint64_t>> get_uint_array(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

 private:
  File() = default;
  class Parser;
  friend class Parser;
  Expected<const Value*> require(std::string_view key) const;
  Expected<const Array*> require_array(std::string_view key, std::string_view expected) const;

  util::MappedFile mapping_;  // empty when parsing borrowed memory
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> metadata_;
  std::map<std::string, size_t, std::less<>> key_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace kiln::gguf
