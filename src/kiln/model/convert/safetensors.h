// safetensors reader (Hugging Face's weight format): u64 little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the
// raw little-endian tensor bytes. Validated like the GGUF reader: every range is checked.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/util/mmap.h"
#include "kiln/util/status.h"

namespace kiln::model {

struct SafeTensor {
  std::string dtype;           // "F32", "F16", "BF16", ...
  std::vector<int64_t> shape;  // PyTorch order: shape[0] outermost
  std::span<const uint8_t> data;
  int64_t num_elements() const;
};

class SafetensorsFile {
 public:
  static Expected<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  const std::map<std::string, SafeTensor>& tensors() const { return tensors_; }
  const SafeTensor* find(const std::string& name) const;
  // The tensor as F32 (from F32, F16 or BF16).
  Expected<std::vector<float>> read_f32(const std::string& name) const;

 private:
  util::MappedFile mapping_;
  std::map<std::string, SafeTensor> tensors_;
};

// Every *.safetensors file of a Hugging Face folder, read as one name index.
struct Checkpoint {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  bool has(const std::string& name) const;
  // The tensor as F32. A base model saved on its own (Qwen3Model, embedding checkpoints) has
  // no "model." prefix: a name with it is also looked up without it.
  Expected<std::vector<float>> read(const std::string& name) const;
  // Its shape (PyTorch order), or null.
  const SafeTensor* find(const std::string& name) const;
};

Expected<Checkpoint> open_checkpoint(const std::string& dir);

}  // namespace kiln::model
