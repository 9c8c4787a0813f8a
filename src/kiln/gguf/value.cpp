// Value helpers: type names, conversions, the debug print.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/gguf/gguf.h"

namespace kiln::gguf {

std::string value_type_name(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
      return "uint8";
    case ValueType::kInt8:
      return "int8";
    case ValueType::kUint16:
      return "uint16";
    case ValueType::kInt16:
      return "int16";
    case ValueType::kUint32:
      return "uint32";
    case ValueType::kInt32:
      return "int32";
    case ValueType::kFloat32:
      return "float32";
    case ValueType::kBool:
      return "bool";
    case ValueType::kString:
      return "string";
    case ValueType::kArray:
      return "array";
    case ValueType::kUint64:
      return "uint64";
    case ValueType::kInt64:
      return "int64";
    case ValueType::kFloat64:
      return "float64";
  }
  return fmt::format("type#{}", static_cast<uint32_t>(t));
}

bool is_valid_value_type(uint32_t id) {
  return id <= static_cast<uint32_t>(ValueType::kFloat64);
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kUint16:
    case ValueType::kInt16:
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kUint64:
    case ValueType::kInt64:
      return true;
    default:
      return false;
  }
}

std::optional<uint64_t> Value::as_uint() const {
  if (!is_integer()) return std::nullopt;
  if (const auto* u = std::get_if<uint64_t>(&data)) return *u;
  if (const auto* i = std::get_if<int64_t>(&data)) {
    if (*i < 0) return std::nullopt;
    return static_cast<uint64_t>(*i);
  }
  return std::nullopt;
}

std::optional<int64_t> Value::as_int() const {
  if (!is_integer()) return std::nullopt;
  if (const auto* i = std::get_if<int64_t>(&data)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&data)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  return std::nullopt;
}

std::optional<double> Value::as_float() const {
  if (is_float()) {
    if (const auto* d = std::get_if<double>(&data)) return *d;
    return std::nullopt;
  }
  if (!is_integer()) return std::nullopt;
  if (const auto* u = std::get_if<uint64_t>(&data)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&data)) return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<bool> Value::as_bool() const {
  if (type != ValueType::kBool) return std::nullopt;
  if (const auto* b = std::get_if<bool>(&data)) return *b;
  return std::nullopt;
}

std::string Value::type_description() const {
  if (const Array* a = as_array()) return fmt::format("array[{}]", value_type_name(a->elem_type));
  return value_type_name(type);
}

namespace {

void append_escaped(std::string& out, std::string_view s, size_t max_bytes) {
  out += '"';
  const size_t n = std::min(s.size(), max_bytes);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\x{:02x}", c);
        } else {
          out += static_cast<char>(c);  // UTF-8 bytes pass through
        }
    }
  }
  out += '"';
  if (s.size() > max_bytes) out += fmt::format("...(+{} bytes)", s.size() - max_bytes);
}

void append_value(std::string& out, const Value& v, const PrintLimits& limits) {
  if (const Array* a = v.as_array()) {
    out += '[';
    const size_t n = std::min(a->items.size(), limits.max_array_items);
    for (size_t i = 0; i < n; ++i) {
      if (i > 0) out += ", ";
      append_value(out, a->items[i], limits);
    }
    if (a->items.size() > n) {
      out += fmt::format("{}... (+{} more)", n > 0 ? ", " : "", a->items.size() - n);
    }
    out += ']';
  } else if (const std::string* s = v.as_string()) {
    append_escaped(out, *s, limits.max_string_bytes);
  } else if (const auto* b = std::get_if<bool>(&v.data)) {
    out += *b ? "true" : "false";
  } else if (const auto* u = std::get_if<uint64_t>(&v.data)) {
    out += fmt::format("{}", *u);
  } else if (const auto* i = std::get_if<int64_t>(&v.data)) {
    out += fmt::format("{}", *i);
  } else if (const auto* d = std::get_if<double>(&v.data)) {
    // Shortest text that reads back as the same float32/float64.
    if (v.type == ValueType::kFloat32) {
      out += fmt::format("{}", static_cast<float>(*d));
    } else {
      out += fmt::format("{}", *d);
    }
  }
}

}  // namespace

std::string to_string(const Value& v, const PrintLimits& limits) {
  std::string out;
  append_value(out, v, limits);
  return out;
}

int64_t TensorInfo::num_elements() const {
  // The reader checked that the product fits in int64_t.
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

}  // namespace kiln::gguf
