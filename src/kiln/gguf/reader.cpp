// GGUF parser. Every count, length, offset and size read from the file is checked against the
// bytes that remain before it is used to allocate or index; errors name the field and the byte
// offset where it was read.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>

#include <fmt/ranges.h>

#include "kiln/gguf/gguf.h"

namespace kiln::gguf {
namespace {

// Fields are copied with memcpy: GGUF here is little-endian and so must the host be.
static_assert(std::endian::native == std::endian::little, "kiln's GGUF code assumes little-endian");

// Smallest encoding of one element of a type (strings: the u64 length; arrays: type + count).
// Used to bound counts by the bytes remaining before anything is reserved.
uint64_t min_encoded_bytes(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUint16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
    case ValueType::kString:
      return 8;
    case ValueType::kArray:
      return 12;
  }
  return 1;
}

// Key/value: key length u64 + value type u32 + at least one value byte.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
// Tensor info: name length u64 + n_dims u32 + one dim u64 + type u32 + offset u64.
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

// A name from the file for a message, in single quotes: it may be any bytes, so control
// bytes are escaped and long names cut.
std::string quoted(std::string_view s) {
  constexpr size_t kMaxBytes = 64;
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMaxBytes; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || c == '\\' || c == '\'') {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '\'';
  if (s.size() > kMaxBytes) out += fmt::format("...(+{} bytes)", s.size() - kMaxBytes);
  return out;
}

std::string dims_text(const std::vector<int64_t>& ne) {
  return fmt::format("[{}]", fmt::join(ne, ", "));
}

}  // namespace

class File::Parser {
 public:
  Parser(File& file, std::span<const uint8_t> bytes)
      : file_(file), base_(bytes.data()), size_(bytes.size()) {}

  Status run() {
    uint64_t num_tensors = 0;
    uint64_t num_kv = 0;
    KILN_TRY_STATUS(parse_header(num_tensors, num_kv));
    file_.metadata_.reserve(num_kv);
    for (uint64_t i = 0; i < num_kv; ++i) KILN_TRY_STATUS(parse_kv(i));
    KILN_TRY_STATUS(parse_alignment());
    file_.tensors_.reserve(num_tensors);
    for (uint64_t i = 0; i < num_tensors; ++i) KILN_TRY_STATUS(parse_tensor_info(i));
    return place_tensors();
  }

 private:
  uint64_t remaining() const { return size_ - pos_; }

  Error truncated(const char* field, uint64_t need) const {
    return err("gguf: truncated file: {} for {} at offset {} needs {} bytes, {} remain", field,
               where_, pos_, need, remaining());
  }

  template <typename T>
  Status read(T& out, const char* field) {
    if (remaining() < sizeof(T)) return truncated(field, sizeof(T));
    std::memcpy(&out, base_ + pos_, sizeof(T));  // the format is little-endian, as is the host
    pos_ += sizeof(T);
    return {};
  }

  Status read_string(std::string& out, const char* field) {
    const uint64_t at = pos_;
    uint64_t len = 0;
    KILN_TRY_STATUS(read(len, field));
    if (len > remaining()) {
      return err(
          "gguf: truncated file: {} length {} for {} at offset {} exceeds remaining {} bytes",
          field, len, where_, at, remaining());
    }
    out.assign(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return {};
  }

  Status parse_header(uint64_t& num_tensors, uint64_t& num_kv) {
    where_ = "header";
    uint32_t magic = 0;
    KILN_TRY_STATUS(read(magic, "magic"));
    if (magic != kMagic) {
      return err("gguf: bad magic 0x{:08x} at offset 0 (expected \"GGUF\"): not a GGUF file",
                 magic);
    }
    uint32_t version = 0;
    KILN_TRY_STATUS(read(version, "version"));
    if (version == 1) {
      return err("gguf: unsupported version 1 at offset 4 (GGUF v1; kiln reads v2 and v3)");
    }
    if (version != 2 && version != 3) {
      if ((version & 0xffff) == 0 && (version >> 16) != 0) {
        return err(
            "gguf: unsupported version 0x{:08x} at offset 4 (a big-endian GGUF file?); "
            "kiln reads little-endian v2 and v3",
            version);
      }
      return err("gguf: unsupported version {} at offset 4 (kiln reads v2 and v3)", version);
    }
    file_.version_ = version;
    KILN_TRY_STATUS(read(num_tensors, "n_tensors"));
    KILN_TRY_STATUS(read(num_kv, "n_kv"));
    if (num_kv > kMaxMetadataValues) {
      return err("gguf: n_kv {} at offset 16 exceeds kiln's limit of {} metadata values", num_kv,
                 kMaxMetadataValues);
    }
    if (num_tensors > kMaxTensors) {
      return err("gguf: n_tensors {} at offset 8 exceeds kiln's limit of {} tensors", num_tensors,
                 kMaxTensors);
    }
    num_values_ = num_kv;
    // Bound both counts by the bytes left, so reserve() can never be huge.
    if (num_kv > remaining() / kMinKvBytes) {
      return err(
          "gguf: n_kv {} at offset 16 is impossible: each key/value needs at least {} "
          "bytes and only {} remain",
          num_kv, kMinKvBytes, remaining());
    }
    if (num_tensors > remaining() / kMinTensorInfoBytes ||
        num_kv * kMinKvBytes + num_tensors * kMinTensorInfoBytes > remaining()) {
      return err(
          "gguf: n_tensors {} at offset 8 is impossible: each tensor info needs at least "
          "{} bytes and only {} remain after {} key/values",
          num_tensors, kMinTensorInfoBytes, remaining(), num_kv);
    }
    return {};
  }

  Status parse_kv(uint64_t index) {
    where_ = fmt::format("key #{}", index);
    KeyValue kv;
    KILN_TRY_STATUS(read_string(kv.key, "key"));
    where_ = fmt::format("key #{} {}", index, quoted(kv.key));
    if (auto it = file_.key_index_.find(kv.key); it != file_.key_index_.end()) {
      return err("gguf: duplicate key {} (key #{} ending at offset {}; first seen as key #{})",
                 quoted(kv.key), index, pos_, it->second);
    }
    const uint64_t type_at = pos_;
    uint32_t type_id = 0;
    KILN_TRY_STATUS(read(type_id, "value type"));
    if (!is_valid_value_type(type_id)) {
      return err("gguf: unknown value type {} for {} at offset {}", type_id, where_, type_at);
    }
    KILN_TRY(kv.value, read_value(static_cast<ValueType>(type_id), 0));
    file_.key_index_.emplace(kv.key, file_.metadata_.size());
    file_.metadata_.push_back(std::move(kv));
    return {};
  }

  Expected<Value> read_value(ValueType type, int depth) {
    switch (type) {
      case ValueType::kUint8:
        return read_uint<uint8_t>(type);
      case ValueType::kUint16:
        return read_uint<uint16_t>(type);
      case ValueType::kUint32:
        return read_uint<uint32_t>(type);
      case ValueType::kUint64:
        return read_uint<uint64_t>(type);
      case ValueType::kInt8:
        return read_int<int8_t>(type);
      case ValueType::kInt16:
        return read_int<int16_t>(type);
      case ValueType::kInt32:
        return read_int<int32_t>(type);
      case ValueType::kInt64:
        return read_int<int64_t>(type);
      case ValueType::kFloat32: {
        float f = 0;
        KILN_TRY_STATUS(read(f, "float32 value"));
        return Value::float32(f);
      }
      case ValueType::kFloat64: {
        double d = 0;
        KILN_TRY_STATUS(read(d, "float64 value"));
        return Value::float64(d);
      }
      case ValueType::kBool: {
        uint8_t b = 0;
        KILN_TRY_STATUS(read(b, "bool value"));
        if (b > 1) {
          return err("gguf: bool value {} for {} at offset {} is neither 0 nor 1", b, where_,
                     pos_ - 1);
        }
        return Value::boolean(b == 1);
      }
      case ValueType::kString: {
        std::string s;
        KILN_TRY_STATUS(read_string(s, "string"));
        return Value::string(std::move(s));
      }
      case ValueType::kArray:
        return read_array(depth);
    }
    return err("gguf: unknown value type {} for {}", static_cast<uint32_t>(type), where_);
  }

  template <typename T>
  Expected<Value> read_uint(ValueType type) {
    T v = 0;
    KILN_TRY_STATUS(read(v, "integer value"));
    return Value{type, uint64_t{v}};
  }
  template <typename T>
  Expected<Value> read_int(ValueType type) {
    T v = 0;
    KILN_TRY_STATUS(read(v, "integer value"));
    return Value{type, int64_t{v}};
  }

  Expected<Value> read_array(int depth) {
    const uint64_t at = pos_;
    if (depth >= kMaxArrayDepth) {
      return err("gguf: arrays nested deeper than {} for {} at offset {}", kMaxArrayDepth, where_,
                 at);
    }
    uint32_t elem_id = 0;
    KILN_TRY_STATUS(read(elem_id, "array element type"));
    if (!is_valid_value_type(elem_id)) {
      return err("gguf: unknown array element type {} for {} at offset {}", elem_id, where_, at);
    }
    const auto elem_type = static_cast<ValueType>(elem_id);
    const uint64_t count_at = pos_;
    uint64_t count = 0;
    KILN_TRY_STATUS(read(count, "array count"));
    const uint64_t min_bytes = min_encoded_bytes(elem_type);
    if (count > remaining() / min_bytes) {
      return err(
          "gguf: truncated file: array count {} of {} (at least {} bytes each) for {} at "
          "offset {} exceeds remaining {} bytes",
          count, value_type_name(elem_type), min_bytes, where_, count_at, remaining());
    }
    if (count > kMaxMetadataValues - num_values_) {
      return err(
          "gguf: array count {} for {} at offset {} takes the metadata past kiln's limit "
          "of {} values",
          count, where_, count_at, kMaxMetadataValues);
    }
    num_values_ += count;
    Array arr;
    arr.elem_type = elem_type;
    arr.items.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      KILN_TRY(Value item, read_value(elem_type, depth + 1));
      arr.items.push_back(std::move(item));
    }
    return Value{ValueType::kArray, std::move(arr)};
  }

  Status parse_alignment() {
    where_ = kKeyAlignment;
    const Value* v = file_.find(kKeyAlignment);
    if (v == nullptr) return {};
    const std::optional<uint64_t> a = v->as_uint();
    if (!a) {
      return err("gguf: {} must be an unsigned integer, got {} {}", kKeyAlignment,
                 v->type_description(), to_string(*v));
    }
    if (*a == 0 || (*a & (*a - 1)) != 0) {
      return err("gguf: {} = {} is not a nonzero power of two", kKeyAlignment, *a);
    }
    file_.alignment_ = *a;
    return {};
  }

  Status parse_tensor_info(uint64_t index) {
    where_ = fmt::format("tensor #{}", index);
    TensorInfo t;
    KILN_TRY_STATUS(read_string(t.name, "tensor name"));
    where_ = fmt::format("tensor #{} {}", index, quoted(t.name));
    if (auto it = file_.tensor_index_.find(t.name); it != file_.tensor_index_.end()) {
      return err(
          "gguf: duplicate tensor name {} (tensor #{} ending at offset {}; first seen as "
          "tensor #{})",
          quoted(t.name), index, pos_, it->second);
    }
    uint32_t num_dims = 0;
    KILN_TRY_STATUS(read(num_dims, "n_dims"));
    if (num_dims < 1 || num_dims > kMaxDims) {
      return err("gguf: {}: n_dims {} at offset {} is out of range 1..{}", where_, num_dims,
                 pos_ - 4, kMaxDims);
    }
    KILN_TRY_STATUS(read_dims(t, num_dims));
    const uint64_t type_at = pos_;
    uint32_t type_id = 0;
    KILN_TRY_STATUS(read(type_id, "tensor type"));
    const std::optional<quant::TypeTraits> tr = quant::traits(type_id);
    if (!tr) {
      return err("gguf: {}: unknown tensor type id {} at offset {}", where_, type_id, type_at);
    }
    t.type = tr->type;
    const uint64_t offset_at = pos_;
    KILN_TRY_STATUS(read(t.offset, "tensor data offset"));
    if (t.offset % file_.alignment_ != 0) {
      return err(
          "gguf: {}: data offset {} (read at offset {}) is not a multiple of the "
          "alignment {}",
          where_, t.offset, offset_at, file_.alignment_);
    }
    KILN_TRY_STATUS(compute_size(t, *tr));
    file_.tensor_index_.emplace(t.name, file_.tensors_.size());
    file_.tensors_.push_back(std::move(t));
    return {};
  }

  Status read_dims(TensorInfo& t, uint32_t num_dims) {
    t.ne.resize(num_dims);
    uint64_t num_elements = 1;
    for (uint32_t d = 0; d < num_dims; ++d) {
      const uint64_t at = pos_;
      uint64_t n = 0;
      KILN_TRY_STATUS(read(n, "ne"));
      if (n == 0 || n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return err("gguf: {}: ne[{}] = {} at offset {} is not a positive int64", where_, d, n, at);
      }
      t.ne[d] = static_cast<int64_t>(n);
      if (__builtin_mul_overflow(num_elements, n, &num_elements) ||
          num_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return err(
            "gguf: {}: element count of ne = {} overflows int64 (dims read up to offset "
            "{})",
            where_, dims_text({t.ne.begin(), t.ne.begin() + d + 1}), pos_);
      }
    }
    return {};
  }

  Status compute_size(TensorInfo& t, const quant::TypeTraits& tr) {
    const auto row_len = static_cast<uint64_t>(t.ne[0]);
    if (row_len % tr.block_elems != 0) {
      return err("gguf: {}: row length ne[0] = {} is not a multiple of the {} block size {}",
                 where_, row_len, tr.name, tr.block_elems);
    }
    uint64_t num_rows = 1;
    for (size_t d = 1; d < t.ne.size(); ++d) num_rows *= static_cast<uint64_t>(t.ne[d]);
    // num_rows cannot overflow: the element count was checked in read_dims.
    uint64_t row_bytes = 0;
    if (__builtin_mul_overflow(row_len / tr.block_elems, uint64_t{tr.block_bytes}, &row_bytes) ||
        __builtin_mul_overflow(row_bytes, num_rows, &t.size_bytes)) {
      return err("gguf: {}: byte size of {} {} overflows uint64", where_, tr.name, dims_text(t.ne));
    }
    return {};
  }

  // Lays the tensors on the data section and checks each range lies in the file and that no two
  // ranges overlap.
  Status place_tensors() {
    const uint64_t header_end = pos_;
    const uint64_t a = file_.alignment_;
    uint64_t data_offset = 0;
    if (__builtin_add_overflow(header_end, a - 1, &data_offset)) {
      return err("gguf: data section start overflows (header end {}, alignment {})", header_end, a);
    }
    data_offset -= data_offset % a;
    file_.data_offset_ = data_offset;
    for (TensorInfo& t : file_.tensors_) {
      uint64_t begin = 0;
      uint64_t end = 0;
      if (__builtin_add_overflow(data_offset, t.offset, &begin) ||
          __builtin_add_overflow(begin, t.size_bytes, &end) || end > size_) {
        return err(
            "gguf: tensor {}: data at offset {} + {} ({} bytes) extends beyond the file "
            "end {}",
            quoted(t.name), data_offset, t.offset, t.size_bytes, size_);
      }
      t.data = base_ + begin;
    }
    std::vector<size_t> order(file_.tensors_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      return file_.tensors_[x].offset < file_.tensors_[y].offset;
    });
    for (size_t i = 1; i < order.size(); ++i) {
      const TensorInfo& prev = file_.tensors_[order[i - 1]];
      const TensorInfo& cur = file_.tensors_[order[i]];
      if (prev.offset + prev.size_bytes > cur.offset) {
        return err(
            "gguf: tensor {} data [{}, {}) overlaps tensor {} data [{}, {}) (offsets "
            "relative to the data section at {})",
            quoted(cur.name), cur.offset, cur.offset + cur.size_bytes, quoted(prev.name),
            prev.offset, prev.offset + prev.size_bytes, data_offset);
      }
    }
    return {};
  }

  File& file_;
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t num_values_ = 0;  // keys + array elements so far (bounded by kMaxMetadataValues)
  std::string where_;        // what is being read, for messages: "key #3 'general.name'"
};

Expected<std::unique_ptr<File>> File::parse(std::span<const uint8_t> bytes) {
  std::unique_ptr<File> file(new File());
  file->bytes_ = bytes;
  File::Parser parser(*file, bytes);
  KILN_TRY_STATUS(parser.run());
  return file;
}

Expected<std::unique_ptr<File>> File::open(const std::string& path) {
  KILN_TRY(util::MappedFile mapping, util::MappedFile::open(path));
  auto parsed = parse(mapping.bytes());
  if (!parsed.ok()) {
    std::string msg = std::move(parsed).take_error().message;
    constexpr std::string_view kPrefix = "gguf: ";
    if (msg.starts_with(kPrefix)) msg.erase(0, kPrefix.size());
    return err("gguf: '{}': {}", path, msg);
  }
  std::unique_ptr<File> file = std::move(parsed).value();
  // Moving the mapping keeps its address, so the tensor views stay valid.
  file->mapping_ = std::move(mapping);
  return file;
}

}  // namespace kiln::gguf
