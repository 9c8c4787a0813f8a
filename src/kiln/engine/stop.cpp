#include "kiln/engine/stop.h"

#include <algorithm>

namespace kiln::engine {

// ---------------------------------------------------------------------------
// StopTokens
// ---------------------------------------------------------------------------

StopTokens::StopTokens(std::vector<int32_t> ids) : ids_(std::move(ids)) {
  std::sort(ids_.begin(), ids_.end());
  ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
}

bool StopTokens::contains(int32_t id) const {
  return std::binary_search(ids_.begin(), ids_.end(), id);
}

void StopTokens::add(int32_t id) {
  const auto it = std::lower_bound(ids_.begin(), ids_.end(), id);
  if (it == ids_.end() || *it != id) ids_.insert(it, id);
}

// ---------------------------------------------------------------------------
// UTF-8
// ---------------------------------------------------------------------------

size_t utf8_complete_prefix(std::string_view text) {
  const size_t n = text.size();
  // Walk back over at most 3 continuation bytes (10xxxxxx) to the lead byte.
  size_t num_cont = 0;
  while (num_cont < 3 && num_cont < n &&
         (static_cast<unsigned char>(text[n - 1 - num_cont]) & 0xC0) == 0x80) {
    ++num_cont;
  }
  if (num_cont == n) return n;  // only continuation bytes: invalid, emit as they are
  const size_t lead_pos = n - 1 - num_cont;
  const auto lead = static_cast<unsigned char>(text[lead_pos]);
  size_t len = 1;  // ASCII or an invalid lead byte
  if ((lead & 0xE0) == 0xC0) {
    len = 2;
  } else if ((lead & 0xF0) == 0xE0) {
    len = 3;
  } else if ((lead & 0xF8) == 0xF0) {
    len = 4;
  }
  return num_cont + 1 < len ? lead_pos : n;
}

// ---------------------------------------------------------------------------
// StopMatcher
// ---------------------------------------------------------------------------

Status validate_stops(const std::vector<std::string>& stops) {
  if (stops.size() > kMaxStopStrings) {
    return err("stop: at most {} stop strings are allowed, got {}", kMaxStopStrings, stops.size());
  }
  for (size_t i = 0; i < stops.size(); ++i) {
    if (stops[i].empty()) return err("stop: stop string {} is empty", i);
    if (stops[i].size() > kMaxStopStringBytes) {
      return err("stop: stop string {} is {} bytes long (limit {})", i, stops[i].size(),
                 kMaxStopStringBytes);
    }
  }
  return {};
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

Expected<StopMatcher> StopMatcher::create(std::vector<std::string> stops) {
  KILN_TRY_STATUS(validate_stops(stops));
  return StopMatcher(std::move(stops));
}

StopMatcher::Result StopMatcher::feed(std::string_view new_text) {
  if (stopped_) return {"", true, stop_index_};
  const size_t old_size = held_.size();
  held_.append(new_text);
  const size_t size = held_.size();

  // A match ending at or before old_size was looked for by an earlier feed, and every match
  // that ends later starts inside held_ (held_ keeps the longest suffix that begins a stop
  // string). So look at the ends in (old_size, size], earliest first, longest stop on a tie.
  for (size_t end = old_size + 1; end <= size; ++end) {
    int32_t best = -1;
    for (size_t s = 0; s < stops_.size(); ++s) {
      const std::string& stop = stops_[s];
      if (stop.empty() || stop.size() > end) continue;
      if (held_.compare(end - stop.size(), stop.size(), stop) != 0) continue;
      if (best < 0 || stop.size() > stops_[best].size()) best = static_cast<int32_t>(s);
    }
    if (best >= 0) {
      stopped_ = true;
      stop_index_ = best;
      Result r{held_.substr(0, end - stops_[best].size()), true, best};
      held_.clear();
      return r;
    }
  }

  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    for (size_t k = std::min(stop.size() - (stop.empty() ? 0 : 1), size); k > hold; --k) {
      if (held_.compare(size - k, k, stop, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  const size_t emit = utf8_complete_prefix(std::string_view(held_).substr(0, size - hold));
  Result r{held_.substr(0, emit), false, -1};
  held_.erase(0, emit);
  return r;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace kiln::engine
