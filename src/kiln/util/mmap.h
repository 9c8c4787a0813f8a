// Read-only memory mapping of a whole file. RAII and move-only: the mapping lives exactly as
// long as the MappedFile that owns it, so views into it (tensor data) must not outlive it.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "kiln/util/status.h"

namespace kiln::util {

class MappedFile {
 public:
  // Maps `path` read-only (MAP_PRIVATE). An empty file maps to an empty span (no mmap call).
  // Errors carry the path and strerror: "mmap: cannot open 'x.gguf': No such file or directory".
  static Expected<MappedFile> open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  uint64_t size_bytes() const { return size_bytes_; }
  std::span<const uint8_t> bytes() const { return {data_, static_cast<size_t>(size_bytes_)}; }
  const std::string& path() const { return path_; }

 private:
  void reset();

  const uint8_t* data_ = nullptr;  // nullptr for an empty file
  uint64_t size_bytes_ = 0;
  std::string path_;
};

}  // namespace kiln::util
