#include "vocabs.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

namespace kiln::tokenizer::testing {

const VocabData& npm_vocab(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, VocabData> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  auto v = import_hf_tokenizer(npm_models_dir("tokenizer-" + name));
  if (!v.ok()) {
    std::fprintf(stderr, "cannot import %s: %s\n", name.c_str(), v.error().message.c_str());
    std::abort();
  }
  return cache.emplace(name, std::move(v).value()).first->second;
}

const Tokenizer& npm_tokenizer(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, Tokenizer> cache;
  const VocabData& v = npm_vocab(name);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  auto t = Tokenizer::create(v);
  if (!t.ok()) {
    std::fprintf(stderr, "cannot create %s: %s\n", name.c_str(), t.error().message.c_str());
    std::abort();
  }
  return cache.emplace(name, std::move(t).value()).first->second;
}

std::filesystem::path shared_model(const std::string& file) {
  // ../shared beside the repository root, wherever the checkout is.
  return std::filesystem::path(KILN_SOURCE_DIR) / ".." / "shared" / "models" / file;
}

}  // namespace kiln::tokenizer::testing
