// Internal to the output parser (it holds one): the state that lets a waiting tool-call
// block resume its scans. Here rather than in tool_formats.h because OutputParser stores it
// by value.
#pragma once

#include <cstddef>

namespace kiln::chat {
namespace detail {
inline constexpr int kMaxJsonDepth = 128;

// Lets a block that keeps needing more text resume its scans where the last attempt
// stopped, instead of rescanning the block on every feed (quadratic in its length). Valid
// only while the buffer is only appended to: the parser resets it whenever it consumes.
struct ScanCache {
  size_t find_from = 0;  // no match of the searched literal starts before this
  size_t json_start = static_cast<size_t>(-1);  // the scan below belongs to this start
  size_t json_pos = 0;                          // next byte to scan
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  bool json_done = false;  // the scan ended: json_status and json_end hold its answer
  int json_status = 0;     // a JsonScan::Status
  size_t json_end = 0;
  char stack[kMaxJsonDepth] = {};
};
}  // namespace detail

}  // namespace kiln::chat
