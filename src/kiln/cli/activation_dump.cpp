#include "kiln/cli/activation_dump.h"

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

namespace kiln::cli {

model::ActivationDump ActivationRecorder::callback() {
  return [this](std::string_view kind, int layer, const float* data, int64_t rows, int64_t cols) {
    add(kind, layer, data, rows, cols);
  };
}

void ActivationRecorder::add(std::string_view kind, int layer, const float* data, int64_t rows,
                             int64_t cols) {
  std::string name = layer >= 0 ? fmt::format("blk.{}.{}", layer, kind) : std::string(kind);
  auto it = index_.find(name);
  if (it == index_.end()) {
    it = index_.emplace(name, entries_.size()).first;
    entries_.push_back({name, std::string(kind), layer, cols, {}});
  }
  Entry& e = entries_[it->second];
  KILN_ASSERT(e.cols == cols);
  e.data.insert(e.data.end(), data, data + rows * cols);
}

std::vector<char> npy_f32(const float* data, const std::vector<int64_t>& shape) {
  static_assert(std::endian::native == std::endian::little, "npy writer assumes little-endian");
  std::string dims;
  int64_t n = 1;
  for (int64_t d : shape) {
    dims += fmt::format("{}, ", d);
    n *= d;
  }
  if (shape.size() > 1) dims.resize(dims.size() - 1);  // (r, c) but (r,) for one dimension
  std::string header =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  // magic (6) + version (2) + header length (2) + header, padded with spaces to 64 bytes and
  // ended by a newline.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  std::vector<char> out(10 + header.size() + bytes);
  std::memcpy(out.data(), magic, 8);
  out[8] = static_cast<char>(header.size() & 0xff);
  out[9] = static_cast<char>(header.size() >> 8);
  std::memcpy(out.data() + 10, header.data(), header.size());
  if (bytes > 0) std::memcpy(out.data() + 10 + header.size(), data, bytes);
  return out;
}

Status ActivationRecorder::write(const std::string& dir, nlohmann::ordered_json meta) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return err("dump: cannot create '{}': {}", dir, ec.message());
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (const Entry& e : entries_) {
    const int64_t rows = e.cols > 0 ? static_cast<int64_t>(e.data.size()) / e.cols : 0;
    const std::string file = e.name + ".npy";
    const std::string path = (std::filesystem::path(dir) / file).string();
    const std::vector<char> bytes = npy_f32(e.data.data(), {rows, e.cols});
    std::ofstream f(path, std::ios::binary);
    if (!f.write(bytes.data(), static_cast<std::streamsize>(bytes.size())))
      return err("dump: cannot write '{}'", path);
    tensors.push_back({{"name", e.name},
                       {"kind", e.kind},
                       {"layer", e.layer},
                       {"file", file},
                       {"shape", {rows, e.cols}},
                       {"dtype", "float32"}});
  }
  meta["tensors"] = std::move(tensors);
  const std::string path = (std::filesystem::path(dir) / "index.json").string();
  std::ofstream f(path);
  if (!(f << meta.dump(1) << "\n")) return err("dump: cannot write '{}'", path);
  return {};
}

}  // namespace kiln::cli
