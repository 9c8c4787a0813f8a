#include "kiln/util/log.h"

#include <atomic>
#include <chrono>
#include <mutex>

namespace kiln::log {
namespace {
std::atomic<Level> g_level{Level::kInfo};
std::mutex g_write_mu;
}  // namespace

Level level() {
  return g_level.load(std::memory_order_relaxed);
}
void set_level(Level lvl) {
  g_level.store(lvl, std::memory_order_relaxed);
}

bool set_level(std::string_view name) {
  if (name == "debug")
    set_level(Level::kDebug);
  else if (name == "info")
    set_level(Level::kInfo);
  else if (name == "warn")
    set_level(Level::kWarn);
  else if (name == "error")
    set_level(Level::kError);
  else if (name == "off")
    set_level(Level::kOff);
  else
    return false;
  return true;
}

void write(Level lvl, std::string_view msg) {
  static constexpr const char* kNames[] = {"D", "I", "W", "E", ""};
  std::lock_guard<std::mutex> lock(g_write_mu);
  std::fprintf(stderr, "%s kiln: %.*s\n", kNames[static_cast<int>(lvl)],
               static_cast<int>(msg.size()), msg.data());
}

}  // namespace kiln::log
