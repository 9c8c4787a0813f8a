// kiln run --dump-activations DIR: the forward's named intermediates (Forward::set_dump) of the
// prompt, one NumPy .npy file each (little-endian f32, [rows, cols]) and an index.json that
// lists them, for layer-by-layer comparison with another implementation.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/model/forward.h"
#include "kiln/util/status.h"

namespace kiln::cli {

class ActivationRecorder {
 public:
  // A dump callback that appends each intermediate's rows to its tensor (a prompt prefilled in
  // several chunks gives one tensor per name with every row).
  model::ActivationDump callback();
  void add(std::string_view kind, int layer, const float* data, int64_t rows, int64_t cols);
  // Writes DIR/<name>.npy for every tensor and DIR/index.json: `meta` plus "tensors", a list of
  // {name, kind, layer, file, shape, dtype} in the order the forward produced them.
  Status write(const std::string& dir, nlohmann::ordered_json meta) const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string name;  // "blk.<layer>.<kind>", or <kind> outside the layers
    std::string kind;
    int layer = -1;
    int64_t cols = 0;
    std::vector<float> data;  // [rows, cols]
  };
  std::vector<Entry> entries_;
  std::map<std::string, size_t, std::less<>> index_;
};

// The bytes of a NumPy .npy file (format 1.0) holding `data` as '<f4' with `shape`.
std::vector<char> npy_f32(const float* data, const std::vector<int64_t>& shape);

}  // namespace kiln::cli
