#include "kiln/model/convert/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "kiln/quant/fp16.h"

namespace kiln::model {

int64_t SafeTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

Expected<size_t> dtype_bytes(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return size_t{4};
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16") return size_t{2};
  if (dtype == "F64" || dtype == "I64") return size_t{8};
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return size_t{1};
  return err("safetensors: unknown dtype '{}'", dtype);
}

}  // namespace

const SafeTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Expected<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  auto f = std::make_unique<SafetensorsFile>();
  KILN_TRY(f->mapping_, util::MappedFile::open(path));
  const std::span<const uint8_t> bytes = f->mapping_.bytes();
  if (bytes.size() < 8) return err("safetensors: '{}' is too short", path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  if (header_len > bytes.size() - 8)
    return err("safetensors: '{}': header length {} exceeds the file", path, header_len);
  const auto* hdr = reinterpret_cast<const char*>(bytes.data() + 8);
  nlohmann::json j = nlohmann::json::parse(hdr, hdr + header_len, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return err("safetensors: '{}': header is not a JSON object", path);
  const std::span<const uint8_t> data = bytes.subspan(8 + header_len);
  for (auto& [name, info] : j.items()) {
    if (name == "__metadata__") continue;
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets"))
      return err("safetensors: '{}': tensor '{}' lacks dtype/shape/data_offsets", path, name);
    SafeTensor t;
    if (!info["dtype"].is_string()) return err("safetensors: '{}': bad dtype", name);
    t.dtype = info["dtype"].get<std::string>();
    KILN_TRY(size_t elem, dtype_bytes(t.dtype));
    uint64_t n = 1;
    for (const auto& d : info["shape"]) {
      if (!d.is_number_unsigned()) return err("safetensors: '{}': bad shape", name);
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && n > (uint64_t{1} << 48) / dim)
        return err("safetensors: '{}': huge shape", name);
      n *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = info["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      return err("safetensors: '{}': bad data_offsets", name);
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data.size() || end - begin != n * elem)
      return err("safetensors: '{}': data range [{}, {}) does not fit {} x {} bytes in {} bytes",
                 name, begin, end, n, elem, data.size());
    t.data = data.subspan(begin, end - begin);
    f->tensors_.emplace(name, std::move(t));
  }
  return f;
}

Expected<std::vector<float>> SafetensorsFile::read_f32(const std::string& name) const {
  const SafeTensor* t = find(name);
  if (t == nullptr) return err("safetensors: missing tensor '{}'", name);
  const size_t n = static_cast<size_t>(t->num_elements());
  std::vector<float> out(n);
  if (t->dtype == "F32") {
    std::memcpy(out.data(), t->data.data(), n * 4);
  } else if (t->dtype == "F16" || t->dtype == "BF16") {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, t->data.data() + 2 * i, 2);
      out[i] = t->dtype == "F16" ? quant::fp16_to_fp32(h) : quant::bf16_to_fp32(h);
    }
  } else {
    return err("safetensors: tensor '{}' has dtype {}, expected F32/F16/BF16", name, t->dtype);
  }
  return out;
}

const SafeTensor* Checkpoint::find(const std::string& name) const {
  for (const auto& f : files)
    if (const SafeTensor* t = f->find(name)) return t;
  if (name.starts_with("model."))
    for (const auto& f : files)
      if (const SafeTensor* t = f->find(name.substr(6))) return t;
  return nullptr;
}

bool Checkpoint::has(const std::string& name) const {
  for (const auto& f : files)
    if (f->find(name)) return true;
  return false;
}

Expected<std::vector<float>> Checkpoint::read(const std::string& name) const {
  for (const auto& f : files)
    if (f->find(name)) return f->read_f32(name);
  if (name.starts_with("model."))
    for (const auto& f : files)
      if (f->find(name.substr(6))) return f->read_f32(name.substr(6));
  return err("convert: checkpoint has no tensor '{}'", name);
}

Expected<Checkpoint> open_checkpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  Checkpoint ck;
  std::error_code ec;
  std::vector<fs::path> paths;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") paths.push_back(e.path());
  if (ec) return err("convert: cannot list '{}': {}", dir, ec.message());
  if (paths.empty()) return err("convert: no .safetensors files in '{}'", dir);
  std::sort(paths.begin(), paths.end());
  for (const fs::path& p : paths) {
    KILN_TRY(auto f, SafetensorsFile::open(p.string()));
    ck.files.push_back(std::move(f));
  }
  return ck;
}

}  // namespace kiln::model
