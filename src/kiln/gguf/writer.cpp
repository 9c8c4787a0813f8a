#include "kiln/gguf/writer.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

namespace kiln::gguf {
namespace {

// Fields are copied with memcpy: GGUF here is little-endian and so must the host be.
static_assert(std::endian::native == std::endian::little, "kiln's GGUF code assumes little-endian");

constexpr size_t kMaxTensorNameBytes = 63;  // ggml: names are < GGML_MAX_NAME (64)

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian host, little-endian format
  out.insert(out.end(), b, b + sizeof(T));
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

uint64_t align_up(uint64_t n, uint64_t a) {
  return (n + a - 1) / a * a;
}

// Writes an unsigned payload as the on-disk width of `type`, checking it fits.
template <typename T>
Status put_uint(std::vector<uint8_t>& out, const Value& v, std::string_view key) {
  const auto* u = std::get_if<uint64_t>(&v.data);
  if (u == nullptr || *u > std::numeric_limits<T>::max()) {
    return err("gguf writer: key '{}': {} value does not hold a {} in range", key,
               value_type_name(v.type), value_type_name(v.type));
  }
  put<T>(out, static_cast<T>(*u));
  return {};
}

template <typename T>
Status put_int(std::vector<uint8_t>& out, const Value& v, std::string_view key) {
  const auto* i = std::get_if<int64_t>(&v.data);
  if (i == nullptr || *i < std::numeric_limits<T>::min() || *i > std::numeric_limits<T>::max()) {
    return err("gguf writer: key '{}': {} value does not hold a {} in range", key,
               value_type_name(v.type), value_type_name(v.type));
  }
  put<T>(out, static_cast<T>(*i));
  return {};
}

Status put_value(std::vector<uint8_t>& out, const Value& v, std::string_view key, int depth);

Status put_array(std::vector<uint8_t>& out, const Value& v, std::string_view key, int depth) {
  const Array* a = v.as_array();
  if (a == nullptr) return err("gguf writer: key '{}': array value holds no Array", key);
  if (depth >= kMaxArrayDepth) {
    return err("gguf writer: key '{}': arrays nested deeper than {}", key, kMaxArrayDepth);
  }
  if (!is_valid_value_type(static_cast<uint32_t>(a->elem_type))) {
    return err("gguf writer: key '{}': bad array element type {}", key,
               static_cast<uint32_t>(a->elem_type));
  }
  put<uint32_t>(out, static_cast<uint32_t>(a->elem_type));
  put<uint64_t>(out, a->items.size());
  for (size_t i = 0; i < a->items.size(); ++i) {
    if (a->items[i].type != a->elem_type) {
      return err("gguf writer: key '{}': element {} has type {} in an array of {}", key, i,
                 value_type_name(a->items[i].type), value_type_name(a->elem_type));
    }
    KILN_TRY_STATUS(put_value(out, a->items[i], key, depth + 1));
  }
  return {};
}

Status put_value(std::vector<uint8_t>& out, const Value& v, std::string_view key, int depth) {
  switch (v.type) {
    case ValueType::kUint8:
      return put_uint<uint8_t>(out, v, key);
    case ValueType::kUint16:
      return put_uint<uint16_t>(out, v, key);
    case ValueType::kUint32:
      return put_uint<uint32_t>(out, v, key);
    case ValueType::kUint64:
      return put_uint<uint64_t>(out, v, key);
    case ValueType::kInt8:
      return put_int<int8_t>(out, v, key);
    case ValueType::kInt16:
      return put_int<int16_t>(out, v, key);
    case ValueType::kInt32:
      return put_int<int32_t>(out, v, key);
    case ValueType::kInt64:
      return put_int<int64_t>(out, v, key);
    case ValueType::kFloat32:
    case ValueType::kFloat64: {
      const auto* d = std::get_if<double>(&v.data);
      if (d == nullptr) return err("gguf writer: key '{}': float value holds no double", key);
      if (v.type == ValueType::kFloat32) {
        put<float>(out, static_cast<float>(*d));
      } else {
        put<double>(out, *d);
      }
      return {};
    }
    case ValueType::kBool: {
      const auto* b = std::get_if<bool>(&v.data);
      if (b == nullptr) return err("gguf writer: key '{}': bool value holds no bool", key);
      put<uint8_t>(out, *b ? 1 : 0);
      return {};
    }
    case ValueType::kString: {
      const std::string* s = v.as_string();
      if (s == nullptr) return err("gguf writer: key '{}': string value holds no string", key);
      put_string(out, *s);
      return {};
    }
    case ValueType::kArray:
      return put_array(out, v, key, depth);
  }
  return err("gguf writer: key '{}': unknown value type {}", key, static_cast<uint32_t>(v.type));
}

template <typename T>
std::vector<Value> to_values(std::span<const T> v, Value (*make)(T)) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (const T& x : v) items.push_back(make(x));
  return items;
}

}  // namespace

void Writer::set(std::string_view key, Value value) {
  for (KeyValue& kv : metadata_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  metadata_.push_back(KeyValue{std::string(key), std::move(value)});
}

void Writer::set_string_array(std::string_view key, std::span<const std::string> v) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (const std::string& s : v) items.push_back(Value::string(s));
  set_array(key, ValueType::kString, std::move(items));
}
void Writer::set_float_array(std::string_view key, std::span<const float> v) {
  set_array(key, ValueType::kFloat32, to_values<float>(v, &Value::float32));
}
void Writer::set_int32_array(std::string_view key, std::span<const int32_t> v) {
  set_array(key, ValueType::kInt32, to_values<int32_t>(v, &Value::int32));
}
void Writer::set_uint32_array(std::string_view key, std::span<const uint32_t> v) {
  set_array(key, ValueType::kUint32, to_values<uint32_t>(v, &Value::uint32));
}
void Writer::set_int64_array(std::string_view key, std::span<const int64_t> v) {
  set_array(key, ValueType::kInt64, to_values<int64_t>(v, &Value::int64));
}

bool Writer::remove(std::string_view key) {
  for (auto it = metadata_.begin(); it != metadata_.end(); ++it) {
    if (it->key == key) {
      metadata_.erase(it);
      return true;
    }
  }
  return false;
}

const Value* Writer::find(std::string_view key) const {
  for (const KeyValue& kv : metadata_) {
    if (kv.key == key) return &kv.value;
  }
  return nullptr;
}

Status Writer::add_tensor(std::string name, quant::Type type, std::vector<int64_t> ne,
                          std::span<const uint8_t> data) {
  if (name.empty() || name.size() > kMaxTensorNameBytes) {
    return err("gguf writer: tensor name '{}' must be 1..{} bytes", name, kMaxTensorNameBytes);
  }
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) return err("gguf writer: duplicate tensor '{}'", name);
  }
  if (ne.empty() || ne.size() > static_cast<size_t>(kMaxDims)) {
    return err("gguf writer: tensor '{}': {} dims, expected 1..{}", name, ne.size(), kMaxDims);
  }
  uint64_t num_rows = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] < 1) return err("gguf writer: tensor '{}': ne[{}] = {} < 1", name, d, ne[d]);
    if (d > 0 && __builtin_mul_overflow(num_rows, static_cast<uint64_t>(ne[d]), &num_rows)) {
      return err("gguf writer: tensor '{}': shape overflows", name);
    }
  }
  const quant::TypeTraits& tr = quant::traits(type);
  const auto row_len = static_cast<uint64_t>(ne[0]);
  if (row_len % tr.block_elems != 0) {
    return err("gguf writer: tensor '{}': ne[0] = {} is not a multiple of the {} block size {}",
               name, ne[0], tr.name, tr.block_elems);
  }
  // quant::row_bytes does not check for overflow; shapes here come from callers, so do.
  uint64_t row_bytes = 0;
  uint64_t size_bytes = 0;
  if (__builtin_mul_overflow(row_len / tr.block_elems, uint64_t{tr.block_bytes}, &row_bytes) ||
      __builtin_mul_overflow(row_bytes, num_rows, &size_bytes)) {
    return err("gguf writer: tensor '{}': byte size overflows", name);
  }
  if (size_bytes != data.size()) {
    return err("gguf writer: tensor '{}': {} data is {} bytes, the shape needs {}", name,
               quant::type_name(type), data.size(), size_bytes);
  }
  tensors_.push_back(PendingTensor{std::move(name), type, std::move(ne),
                                   std::vector<uint8_t>(data.begin(), data.end())});
  return {};
}

Expected<Writer::Layout> Writer::layout() const {
  Layout lay;
  if (const Value* a = find(kKeyAlignment)) {
    const std::optional<uint64_t> n = a->as_uint();
    if (!n || *n == 0 || (*n & (*n - 1)) != 0 || *n > (uint64_t{1} << 30)) {
      return err("gguf writer: {} = {} is not a power of two in 1..2^30", kKeyAlignment,
                 to_string(*a));
    }
    lay.alignment = *n;
  }
  std::vector<uint8_t>& out = lay.header;
  put<uint32_t>(out, kMagic);
  put<uint32_t>(out, 3);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, metadata_.size());
  for (const KeyValue& kv : metadata_) {
    put_string(out, kv.key);
    put<uint32_t>(out, static_cast<uint32_t>(kv.value.type));
    KILN_TRY_STATUS(put_value(out, kv.value, kv.key, 0));
  }
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    offset = align_up(offset, lay.alignment);
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put<uint64_t>(out, static_cast<uint64_t>(d));
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put<uint64_t>(out, offset);
    lay.tensor_offsets.push_back(offset);
    offset += t.data.size();
  }
  out.resize(align_up(out.size(), lay.alignment), 0);
  return lay;
}

Expected<std::vector<uint8_t>> Writer::to_bytes() const {
  KILN_TRY(Layout lay, layout());
  std::vector<uint8_t> out = std::move(lay.header);
  const size_t data_start = out.size();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    out.resize(data_start + lay.tensor_offsets[i], 0);  // zero padding up to the aligned offset
    out.insert(out.end(), tensors_[i].data.begin(), tensors_[i].data.end());
  }
  return out;
}

// Writes to `path`.tmp and renames it over `path`, so a failed write never leaves a truncated
// model under the real name.
Status Writer::write_file(const std::string& path) const {
  KILN_TRY(Layout lay, layout());
  const std::string tmp_path = path + ".tmp";
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(tmp_path.c_str(), "wb"), &std::fclose);
  if (!f) return err("gguf writer: cannot create '{}': {}", tmp_path, std::strerror(errno));
  auto fail = [&](const char* what) -> Error {
    Error e = err("gguf writer: cannot {} '{}': {}", what, tmp_path, std::strerror(errno));
    f.reset();
    std::remove(tmp_path.c_str());
    return e;
  };
  auto write = [&](const uint8_t* p, size_t n) {
    return n == 0 || std::fwrite(p, 1, n, f.get()) == n;
  };
  if (!write(lay.header.data(), lay.header.size())) return fail("write");
  const std::vector<uint8_t> zeros(lay.alignment, 0);
  uint64_t written = 0;  // bytes of the data section so far
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!write(zeros.data(), lay.tensor_offsets[i] - written) ||
        !write(tensors_[i].data.data(), tensors_[i].data.size())) {
      return fail("write");
    }
    written = lay.tensor_offsets[i] + tensors_[i].data.size();
  }
  if (std::fflush(f.get()) != 0) return fail("write");
  if (std::fclose(f.release()) != 0) {
    const Error e = err("gguf writer: cannot close '{}': {}", tmp_path, std::strerror(errno));
    std::remove(tmp_path.c_str());
    return e;
  }
  if (std::rename(tmp_path.c_str(), path.c_str()) != 0) {
    const Error e =
        err("gguf writer: cannot rename '{}' to '{}': {}", tmp_path, path, std::strerror(errno));
    std::remove(tmp_path.c_str());
    return e;
  }
  return {};
}

}  // namespace kiln::gguf
