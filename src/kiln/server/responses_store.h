// The in-memory store of /v1/responses (store: true): what GET /v1/responses/{id} returns and
// what previous_response_id continues from. Bounded by a count and by bytes (the serialized
// size of what an entry holds); the least recently used entries go first. Nothing survives a
// restart: a continuation after one is a 404 previous_response_not_found.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace kiln::server::responses {

struct StoredResponse {
  nlohmann::ordered_json response;      // the response object as returned
  nlohmann::ordered_json conversation;  // its items: the input (earlier turns' included)
                                        // and its output, what a continuation starts from
};

class ResponseStore {
 public:
  ResponseStore(size_t max_count, size_t max_bytes)
      : max_count_(max_count), max_bytes_(max_bytes) {}

  // Stores (or replaces) an entry; false when it alone exceeds max_bytes (not stored).
  bool put(const std::string& id, StoredResponse entry);
  // The entry, or null when unknown (never stored, deleted or evicted).
  std::shared_ptr<const StoredResponse> get(const std::string& id);
  bool erase(const std::string& id);

  size_t size() const;
  size_t num_bytes() const;

 private:
  struct Slot {
    std::shared_ptr<const StoredResponse> entry;
    size_t num_bytes = 0;
    std::list<std::string>::iterator lru;  // position in lru_ (front: most recent)
  };
  void evict_locked();

  const size_t max_count_;
  const size_t max_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Slot> slots_;
  std::list<std::string> lru_;
  size_t num_bytes_ = 0;
};

}  // namespace kiln::server::responses
