#include "kiln/grammar/token_index.h"

#include <algorithm>
#include <map>
#include <numeric>

namespace kiln::grammar {

std::shared_ptr<const TokenIndex> TokenIndex::create(const tokenizer::Tokenizer& tok) {
  std::vector<int32_t> ends;
  const auto& v = tok.vocab();
  for (const auto& id : {v.eos_id, v.eot_id, v.eom_id}) {
    if (id && *id >= 0 && *id < tok.num_tokens()) ends.push_back(*id);
  }
  return create(tok, std::move(ends));
}

std::shared_ptr<const TokenIndex> TokenIndex::create(const tokenizer::Tokenizer& tok,
                                                     std::vector<int32_t> ends) {
  const int32_t n = tok.num_tokens();
  std::vector<std::string> bytes(n);
  std::vector<bool> allowed(n, false);
  for (int32_t id = 0; id < n; ++id) {
    const auto t = tok.token_type(id);
    if (t == tokenizer::TokenType::kControl || t == tokenizer::TokenType::kUnknown ||
        t == tokenizer::TokenType::kUnused) {
      continue;
    }
    bytes[id] = std::string(tok.token_piece(id));
    allowed[id] = !bytes[id].empty();
  }
  for (int32_t e : ends) {
    if (e >= 0 && e < n) allowed[e] = false;  // only where the grammar may end
  }
  std::erase_if(ends, [&](int32_t e) { return e < 0 || e >= n; });
  auto idx = std::make_shared<TokenIndex>();
  idx->build(std::move(bytes), std::move(ends), std::move(allowed));
  return idx;
}

std::shared_ptr<const TokenIndex> TokenIndex::create(std::vector<std::string> token_bytes,
                                                     std::vector<int32_t> end_tokens) {
  std::vector<bool> allowed(token_bytes.size());
  for (size_t i = 0; i < token_bytes.size(); ++i) allowed[i] = !token_bytes[i].empty();
  for (int32_t e : end_tokens) allowed[e] = false;
  auto idx = std::make_shared<TokenIndex>();
  idx->build(std::move(token_bytes), std::move(end_tokens), std::move(allowed));
  return idx;
}

std::string_view TokenIndex::token_bytes(int32_t id) const {
  if (id < 0 || id >= num_tokens_) return {};
  return std::string_view(bytes_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
}

bool TokenIndex::is_end_token(int32_t id) const {
  return std::find(end_tokens_.begin(), end_tokens_.end(), id) != end_tokens_.end();
}

void TokenIndex::build(std::vector<std::string> token_bytes, std::vector<int32_t> end_tokens,
                       std::vector<bool> allowed) {
  num_tokens_ = static_cast<int32_t>(token_bytes.size());
  end_tokens_ = std::move(end_tokens);
  std::sort(end_tokens_.begin(), end_tokens_.end());
  end_tokens_.erase(std::unique(end_tokens_.begin(), end_tokens_.end()), end_tokens_.end());
  offsets_.assign(num_tokens_ + 1, 0);
  for (int32_t i = 0; i < num_tokens_; ++i) {
    offsets_[i] = static_cast<uint32_t>(bytes_.size());
    bytes_ += token_bytes[i];
  }
  offsets_[num_tokens_] = static_cast<uint32_t>(bytes_.size());
  in_trie_ = allowed;

  std::vector<int32_t> order;
  for (int32_t i = 0; i < num_tokens_; ++i) {
    if (allowed[i] && token_bytes[i].size() < 65535) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return token_bytes[a] != token_bytes[b] ? token_bytes[a] < token_bytes[b] : a < b;
  });

  // Preorder construction from the sorted strings: the path of open nodes is popped to the
  // common prefix with the previous string, then extended. Shorter strings sort first, so a
  // node's own tokens are appended before any of its descendants' tokens.
  std::vector<int32_t> path;  // node index per depth - 1
  std::vector<int32_t> parent;
  auto close = [&](int32_t node) {
    nodes_[node].end = static_cast<int32_t>(nodes_.size());
    nodes_[node].tok_end = static_cast<int32_t>(trie_tokens_.size());
  };
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = token_bytes[id];
    size_t lcp = 0;
    if (prev) {
      while (lcp < s.size() && lcp < prev->size() && s[lcp] == (*prev)[lcp]) ++lcp;
    }
    while (path.size() > lcp) {
      close(path.back());
      path.pop_back();
    }
    for (size_t d = lcp; d < s.size(); ++d) {
      Node nd{};
      nd.byte = static_cast<uint8_t>(s[d]);
      nd.depth = static_cast<uint16_t>(d + 1);
      nd.tok_begin = static_cast<int32_t>(trie_tokens_.size());
      nd.own_end = nd.tok_begin;
      parent.push_back(path.empty() ? -1 : path.back());
      path.push_back(static_cast<int32_t>(nodes_.size()));
      nodes_.push_back(nd);
      max_depth_ = std::max<int32_t>(max_depth_, nd.depth);
    }
    trie_tokens_.push_back(id);
    nodes_[path.back()].own_end = static_cast<int32_t>(trie_tokens_.size());
    prev = &s;
  }
  while (!path.empty()) {
    close(path.back());
    path.pop_back();
  }

  // Bytes below each node, deduplicated (most subtrees share a handful of sets).
  std::vector<ByteSet> desc(nodes_.size());
  for (int32_t i = static_cast<int32_t>(nodes_.size()) - 1; i >= 0; --i) {
    if (parent[i] >= 0) {
      desc[parent[i]] |= desc[i];
      desc[parent[i]].add(nodes_[i].byte);
      nodes_[parent[i]].height = std::max<uint16_t>(nodes_[parent[i]].height, nodes_[i].height + 1);
    }
  }
  std::map<std::array<uint64_t, 4>, int32_t> ids;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    auto [it, fresh] = ids.emplace(desc[i].bits, static_cast<int32_t>(desc_sets_.size()));
    if (fresh) desc_sets_.push_back(desc[i]);
    nodes_[i].desc_bytes = it->second;
  }
}

}  // namespace kiln::grammar
