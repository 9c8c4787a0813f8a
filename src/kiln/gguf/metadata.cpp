// Typed metadata getters of File.
#include <limits>

#include "kiln/gguf/gguf.h"

namespace kiln::gguf {
namespace {

Error wrong_type(std::string_view key, std::string_view expected, const Value& v) {
  return err("gguf: key '{}' has type {}, expected {}", key, v.type_description(), expected);
}

Error out_of_range(std::string_view key, std::string_view expected, const Value& v) {
  return err("gguf: key '{}' value {} ({}) is out of range for {}", key, to_string(v),
             v.type_description(), expected);
}

}  // namespace

const Value* File::find(std::string_view key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].value;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Expected<const Value*> File::require(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return err("gguf: missing key '{}'", key);
  return v;
}

Expected<uint64_t> File::get_uint(std::string_view key) const {
  KILN_TRY(const Value* v, require(key));
  if (!v->is_integer()) return wrong_type(key, "an unsigned integer", *v);
  if (auto u = v->as_uint()) return *u;
  return out_of_range(key, "an unsigned integer", *v);
}

Expected<int64_t> File::get_int(std::string_view key) const {
  KILN_TRY(const Value* v, require(key));
  if (!v->is_integer()) return wrong_type(key, "an integer", *v);
  if (auto i = v->as_int()) return *i;
  return out_of_range(key, "int64", *v);
}

Expected<double> File::get_float(std::string_view key) const {
  KILN_TRY(const Value* v, require(key));
  if (auto d = v->as_float()) return *d;
  return wrong_type(key, "a number", *v);
}

Expected<bool> File::get_bool(std::string_view key) const {
  KILN_TRY(const Value* v, require(key));
  if (auto b = v->as_bool()) return *b;
  return wrong_type(key, "bool", *v);
}

Expected<std::string> File::get_string(std::string_view key) const {
  KILN_TRY(const Value* v, require(key));
  if (const std::string* s = v->as_string()) return *s;
  return wrong_type(key, "string", *v);
}

Expected<uint64_t> File::get_uint_or(std::string_view key, uint64_t fallback) const {
  return has(key) ? get_uint(key) : Expected<uint64_t>(fallback);
}
Expected<int64_t> File::get_int_or(std::string_view key, int64_t fallback) const {
  return has(key) ? get_int(key) : Expected<int64_t>(fallback);
}
Expected<double> File::get_float_or(std::string_view key, double fallback) const {
  return has(key) ? get_float(key) : Expected<double>(fallback);
}
Expected<bool> File::get_bool_or(std::string_view key, bool fallback) const {
  return has(key) ? get_bool(key) : Expected<bool>(fallback);
}
Expected<std::string> File::get_string_or(std::string_view key, std::string fallback) const {
  return has(key) ? get_string(key) : Expected<std::string>(std::move(fallback));
}

Expected<const Array*> File::require_array(std::string_view key, std::string_view expected) const {
  KILN_TRY(const Value* v, require(key));
  if (const Array* a = v->as_array()) return a;
  return wrong_type(key, expected, *v);
}

Expected<std::vector<std::string>> File::get_string_array(std::string_view key) const {
  KILN_TRY(const Array* a, require_array(key, "array[string]"));
  if (a->elem_type != ValueType::kString) {
    return err("gguf: key '{}' has type array[{}], expected array[string]", key,
               value_type_name(a->elem_type));
  }
  std::vector<std::string> out;
  out.reserve(a->items.size());
  for (const Value& item : a->items) {
    const std::string* s = item.as_string();
    if (s == nullptr) return err("gguf: key '{}' holds a non-string element", key);
    out.push_back(*s);
  }
  return out;
}

Expected<std::vector<float>> File::get_float_array(std::string_view key) const {
  KILN_TRY(const Array* a, require_array(key, "an array of numbers"));
  std::vector<float> out;
  out.reserve(a->items.size());
  for (size_t i = 0; i < a->items.size(); ++i) {
    auto d = a->items[i].as_float();
    if (!d) {
      return err("gguf: key '{}' element {} has type {}, expected a number", key, i,
                 a->items[i].type_description());
    }
    out.push_back(static_cast<float>(*d));
  }
  return out;
}

Expected<std::vector<int64_t>> File::get_int_array(std::string_view key) const {
  KILN_TRY(const Array* a, require_array(key, "an array of integers"));
  std::vector<int64_t> out;
  out.reserve(a->items.size());
  for (size_t i = 0; i < a->items.size(); ++i) {
    auto v = a->items[i].as_int();
    if (!v) {
      return err("gguf: key '{}' element {} ({} {}) is not an int64", key, i,
                 a->items[i].type_description(), to_string(a->items[i]));
    }
    out.push_back(*v);
  }
  return out;
}

Expected<std::vector<uint64_t>> File::get_uint_array(std::string_view key) const {
  KILN_TRY(const Array* a, require_array(key, "an array of unsigned integers"));
  std::vector<uint64_t> out;
  out.reserve(a->items.size());
  for (size_t i = 0; i < a->items.size(); ++i) {
    auto v = a->items[i].as_uint();
    if (!v) {
      return err("gguf: key '{}' element {} ({} {}) is not an unsigned integer", key, i,
                 a->items[i].type_description(), to_string(a->items[i]));
    }
    out.push_back(*v);
  }
  return out;
}

}  // namespace kiln::gguf
