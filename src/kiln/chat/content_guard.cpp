#include "kiln/chat/content_guard.h"

#include <random>

#include <fmt/format.h>

namespace kiln::chat {

ContentGuard::ContentGuard(FindFn find) : find_(std::move(find)) {
  std::random_device rd;
  const uint64_t nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  prefix_ = fmt::format("kilnlit{:016x}n", nonce);
}

std::string ContentGuard::protect_string(const std::string& s) {
  const std::vector<Range> hits = find_(s);
  if (hits.empty()) return s;
  std::string out;
  size_t pos = 0;
  for (const auto& [begin, end] : hits) {
    out.append(s, pos, begin - pos);
    out += prefix_;
    out += std::to_string(originals_.size());
    out += 'x';
    originals_.push_back(s.substr(begin, end - begin));
    pos = end;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

void ContentGuard::protect(nlohmann::ordered_json& value) {
  if (value.is_string()) {
    value = protect_string(value.get_ref<const std::string&>());
  } else if (value.is_array() || value.is_object()) {
    for (auto& v : value) protect(v);
  }
}

ContentGuard::Restored ContentGuard::restore(std::string_view rendered) const {
  Restored r;
  if (originals_.empty()) {
    r.text = std::string(rendered);
    return r;
  }
  r.text.reserve(rendered.size());
  size_t pos = 0;
  for (;;) {
    const size_t hit = rendered.find(prefix_, pos);
    if (hit == std::string_view::npos) break;
    size_t k = hit + prefix_.size();
    size_t index = 0;
    size_t num_digits = 0;
    while (k < rendered.size() && rendered[k] >= '0' && rendered[k] <= '9' && num_digits < 9) {
      index = index * 10 + static_cast<size_t>(rendered[k] - '0');
      ++k;
      ++num_digits;
    }
    if (num_digits == 0 || k >= rendered.size() || rendered[k] != 'x' ||
        index >= originals_.size()) {
      // Not a whole marker (a template cut it): keep the bytes as they are.
      r.text.append(rendered.substr(pos, hit + prefix_.size() - pos));
      pos = hit + prefix_.size();
      continue;
    }
    r.text.append(rendered.substr(pos, hit - pos));
    const size_t begin = r.text.size();
    r.text += originals_[index];
    r.literal.emplace_back(begin, r.text.size());
    pos = k + 1;
  }
  r.text.append(rendered.substr(pos));
  return r;
}

}  // namespace kiln::chat
