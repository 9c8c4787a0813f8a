#include "kiln/util/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace kiln::util {

Expected<MappedFile> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return err("mmap: cannot open '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return err("mmap: cannot stat '{}': {}", path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return err("mmap: '{}' is not a regular file", path);
  }
  MappedFile m;
  m.path_ = path;
  m.size_bytes_ = static_cast<uint64_t>(st.st_size);
  if (m.size_bytes_ > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(m.size_bytes_), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return err("mmap: cannot map '{}' ({} bytes): {}", path, m.size_bytes_, std::strerror(e));
    }
    m.data_ = static_cast<const uint8_t*>(p);
  }
  // The mapping keeps the file's pages referenced; the descriptor is no longer needed.
  ::close(fd);
  return m;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

MappedFile::~MappedFile() {
  reset();
}

void MappedFile::reset() {
  if (data_ != nullptr) {
    ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_bytes_));
  }
  data_ = nullptr;
  size_bytes_ = 0;
}

}  // namespace kiln::util
