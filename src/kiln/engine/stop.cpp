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

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  // KMP prefix function of each stop string: fail[i] = length of the longest proper prefix of
  // stop[0, i] that is also its suffix.
  for (size_t s = 0; s < stops_.size(); ++s) {
    const std::string& stop = stops_[s];
    if (stop.empty()) continue;
    Pattern p{s, std::vector<uint32_t>(stop.size(), 0), 0};
    for (size_t i = 1, k = 0; i < stop.size(); ++i) {
      while (k > 0 && stop[i] != stop[k]) k = p.fail[k - 1];
      if (stop[i] == stop[k]) ++k;
      p.fail[i] = static_cast<uint32_t>(k);
    }
    patterns_.push_back(std::move(p));
  }
}

Expected<StopMatcher> StopMatcher::create(std::vector<std::string> stops) {
  KILN_TRY_STATUS(validate_stops(stops));
  return StopMatcher(std::move(stops));
}

StopMatcher::Result StopMatcher::feed(std::string_view new_text) {
  if (stopped_) return {"", true, stop_index_};
  // Each pattern's state is the length of the longest prefix of its stop string that is a
  // suffix of all the text fed so far (a KMP automaton: amortized O(1) per byte per stop).
  // Bytes are taken one at a time, so the first stop to complete wins; on the same byte the
  // longest one (the earliest start).
  for (size_t pos = 0; pos < new_text.size(); ++pos) {
    const char c = new_text[pos];
    int32_t best = -1;
    for (Pattern& p : patterns_) {
      const std::string& stop = stops_[p.index];
      while (p.state > 0 && stop[p.state] != c) p.state = p.fail[p.state - 1];
      if (stop[p.state] == c) ++p.state;
      if (p.state == stop.size() && (best < 0 || stop.size() > stops_[best].size())) {
        best = static_cast<int32_t>(p.index);
      }
    }
    if (best >= 0) {
      stopped_ = true;
      stop_index_ = best;
      held_.append(new_text.substr(0, pos + 1));
      Result r{held_.substr(0, held_.size() - stops_[best].size()), true, best};
      held_.clear();
      return r;
    }
  }
  held_.append(new_text);
  // Hold back the longest suffix that may still begin a stop string (states are < its size
  // here), and an incomplete UTF-8 sequence.
  size_t hold = 0;
  for (const Pattern& p : patterns_) hold = std::max<size_t>(hold, p.state);
  KILN_ASSERT(hold <= held_.size());
  const size_t emit = utf8_complete_prefix(std::string_view(held_).substr(0, held_.size() - hold));
  Result r{held_.substr(0, emit), false, -1};
  held_.erase(0, emit);
  return r;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  // The held text is gone, so no partial match can continue into a later feed.
  for (Pattern& p : patterns_) p.state = 0;
  return out;
}

}  // namespace kiln::engine
