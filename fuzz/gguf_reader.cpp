// libFuzzer target for the GGUF reader: parse arbitrary bytes, then walk every metadata value
// and read every byte of every tensor view, so ASan sees any view that escapes the input.
//   make fuzz FUZZ_SECONDS=60
#include <cstddef>
#include <cstdint>
#include <span>

#include "kiln/gguf/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = kiln::gguf::File::parse(std::span<const uint8_t>(data, size));
  if (!parsed.ok()) return 0;
  const kiln::gguf::File& file = **parsed;
  size_t sink = file.version() + file.alignment() + file.data_offset();
  for (const kiln::gguf::KeyValue& kv : file.metadata()) {
    sink += kv.key.size() + kiln::gguf::to_string(kv.value).size();
    sink += kv.value.type_description().size();
    // The typed getters must agree with the walk and never crash on any type.
    sink += file.get_uint(kv.key).ok() + file.get_int(kv.key).ok() + file.get_float(kv.key).ok();
    sink += file.get_string(kv.key).ok() + file.get_bool(kv.key).ok();
    sink += file.get_string_array(kv.key).ok() + file.get_int_array(kv.key).ok();
    sink += file.get_float_array(kv.key).ok() + file.get_uint_array(kv.key).ok();
    if (file.find(kv.key) != &kv.value) __builtin_trap();
  }
  for (const kiln::gguf::TensorInfo& t : file.tensors()) {
    if (t.data < data || t.data + t.size_bytes > data + size) __builtin_trap();
    if (t.num_elements() <= 0 || t.offset % file.alignment() != 0) __builtin_trap();
    if (file.find_tensor(t.name) != &t) __builtin_trap();
    for (uint8_t b : t.bytes()) sink += b;
  }
  // Keep the walk from being optimized away.
  volatile size_t keep = sink;
  (void)keep;
  return 0;
}
