#include "kiln/server/responses_store.h"

#include "kiln/server/errors.h"

namespace kiln::server::responses {

bool ResponseStore::put(const std::string& id, StoredResponse entry) {
  const size_t num_bytes =
      dump_json(entry.response).size() + dump_json(entry.conversation).size() + id.size();
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = slots_.find(id); it != slots_.end()) {
    num_bytes_ -= it->second.num_bytes;
    lru_.erase(it->second.lru);
    slots_.erase(it);
  }
  if (num_bytes > max_bytes_ || max_count_ == 0) return false;
  lru_.push_front(id);
  slots_[id] =
      Slot{std::make_shared<const StoredResponse>(std::move(entry)), num_bytes, lru_.begin()};
  num_bytes_ += num_bytes;
  evict_locked();
  return true;
}

void ResponseStore::evict_locked() {
  while (!lru_.empty() && (slots_.size() > max_count_ || num_bytes_ > max_bytes_)) {
    auto it = slots_.find(lru_.back());
    num_bytes_ -= it->second.num_bytes;
    slots_.erase(it);
    lru_.pop_back();
  }
}

std::shared_ptr<const StoredResponse> ResponseStore::get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(id);
  if (it == slots_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);  // most recently used
  return it->second.entry;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(id);
  if (it == slots_.end()) return false;
  num_bytes_ -= it->second.num_bytes;
  lru_.erase(it->second.lru);
  slots_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.size();
}

size_t ResponseStore::num_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_bytes_;
}

}  // namespace kiln::server::responses
