#include "kiln/grammar/token_index.h"

#include <algorithm>
#include <bit>
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
    if (t == tokenizer::TokenType::kUnknown || t == tokenizer::TokenType::kUnused) continue;
    bytes[id] = std::string(tok.token_piece(id));
    // A control token's text is kept for token terminals; it is never text of the output.
    allowed[id] = t != tokenizer::TokenType::kControl && !bytes[id].empty();
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
                                                     std::vector<int32_t> end_tokens,
                                                     std::vector<int32_t> control_tokens) {
  std::vector<bool> allowed(token_bytes.size());
  for (size_t i = 0; i < token_bytes.size(); ++i) allowed[i] = !token_bytes[i].empty();
  for (int32_t e : end_tokens) allowed[e] = false;
  for (int32_t c : control_tokens) allowed[c] = false;
  auto idx = std::make_shared<TokenIndex>();
  idx->build(std::move(token_bytes), std::move(end_tokens), std::move(allowed));
  return idx;
}

std::string_view TokenIndex::token_bytes(int32_t id) const {
  if (id < 0 || id >= num_tokens_) return {};
  return std::string_view(bytes_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
}

std::vector<int32_t> TokenIndex::tokens_with_text(std::string_view text) const {
  std::vector<int32_t> ids;
  if (text.empty()) return ids;
  // Trie tokens: descend the byte trie (a node's children follow it; siblings chain by `end`).
  const auto& nodes = byte_trie_.nodes;
  int32_t i = 0;
  int32_t end = static_cast<int32_t>(nodes.size());
  for (size_t k = 0; k < text.size() && i < end; ++k) {
    const uint8_t c = static_cast<uint8_t>(text[k]);
    while (i < end && nodes[i].byte != c) i = nodes[i].end;
    if (i >= end) break;
    if (k + 1 == text.size()) {
      for (int32_t t = nodes[i].tok_begin; t < nodes[i].own_end; ++t)
        ids.push_back(byte_trie_.tokens[t]);
    }
    end = nodes[i].end;
    ++i;
  }
  // Tokens outside the tries (control tokens).
  for (int32_t id = 0; id < num_tokens_; ++id) {
    if (!in_trie_[id] && !is_end_token(id) && token_bytes(id) == text) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

bool TokenIndex::is_end_token(int32_t id) const {
  return std::find(end_tokens_.begin(), end_tokens_.end(), id) != end_tokens_.end();
}

namespace {

// A UTF-8 decoder over byte classes: what the next byte may be. kBoundary: a character may
// start; kCont1..3: any 1..3 continuation bytes; the others restrict the first continuation
// byte after E0 (A0-BF), ED (80-9F), F0 (90-BF) and F4 (80-8F).
enum Utf8State : int8_t {
  kInvalid = -1,
  kBoundary,
  kCont1,
  kCont2,
  kCont3,
  kAfterE0,
  kAfterED,
  kAfterF0,
  kAfterF4,
  kNumUtf8States
};

Utf8State utf8_next(Utf8State st, uint8_t byte) {
  const uint8_t c = TokenIndex::utf8_class(byte);
  const bool cont = c == 0x80 || c == 0x90 || c == 0xA0;
  switch (st) {
    case kBoundary:
      if (c < 0x80) return kBoundary;
      switch (c) {
        case 0xC2:
          return kCont1;
        case 0xE0:
          return kAfterE0;
        case 0xE1:
        case 0xEE:
          return kCont2;
        case 0xED:
          return kAfterED;
        case 0xF0:
          return kAfterF0;
        case 0xF1:
          return kCont3;
        case 0xF4:
          return kAfterF4;
        default:
          return kInvalid;
      }
    case kCont1:
      return cont ? kBoundary : kInvalid;
    case kCont2:
      return cont ? kCont1 : kInvalid;
    case kCont3:
      return cont ? kCont2 : kInvalid;
    case kAfterE0:
      return c == 0xA0 ? kCont1 : kInvalid;
    case kAfterED:
      return c == 0x80 || c == 0x90 ? kCont1 : kInvalid;
    case kAfterF0:
      return c == 0x90 || c == 0xA0 ? kCont2 : kInvalid;
    case kAfterF4:
      return c == 0x80 ? kCont2 : kInvalid;
    default:
      return kInvalid;
  }
}

}  // namespace

void TokenIndex::text_chars(Trie& trie, const std::vector<int32_t>& parent) {
  // Bottom-up (reverse preorder: children before parents), per decoder state d in which a
  // node's byte is read: are all paths from the node valid, and the most characters begun.
  const size_t n = trie.nodes.size();
  std::vector<std::array<uint8_t, kNumUtf8States>> kids_ok(n);
  std::vector<std::array<uint16_t, kNumUtf8States>> kids_chars(n);
  for (auto& k : kids_ok) k.fill(1);
  for (auto& k : kids_chars) k.fill(0);
  for (int32_t i = static_cast<int32_t>(n) - 1; i >= 0; --i) {
    Node& nd = trie.nodes[i];
    nd.text_chars = kids_ok[i][kBoundary] ? kids_chars[i][kBoundary] : kNotText;
    const int32_t p = parent[i];
    if (p < 0) continue;
    for (int d = 0; d < kNumUtf8States; ++d) {
      const Utf8State next = utf8_next(static_cast<Utf8State>(d), nd.byte);
      if (next == kInvalid || !kids_ok[i][next]) {
        kids_ok[p][d] = 0;
        continue;
      }
      const int begun = (d == kBoundary ? 1 : 0) + kids_chars[i][next];
      kids_chars[p][d] = static_cast<uint16_t>(
          std::max<int>(kids_chars[p][d], std::min<int>(begun, kNotText - 1)));
    }
  }
}

std::shared_ptr<const TokenIndex::TextTokens> TokenIndex::text_tokens(const ByteSet& ascii,
                                                                      bool multibyte) const {
  {
    std::lock_guard<std::mutex> lock(text_mu_);
    for (const auto& k : text_kinds_) {
      if (k->ascii == ascii && k->multibyte == multibyte) return k;
    }
  }
  auto tt = std::make_shared<TextTokens>();
  tt->ascii = ascii;
  tt->multibyte = multibyte;
  const size_t words = static_cast<size_t>(mask_words());
  tt->up_to.assign(kTextUpTo + 1, std::vector<uint64_t>(words, 0));
  tt->all.assign(words, 0);
  for (size_t w = 0; w < words; ++w) {
    for (uint64_t bits = trie_mask_[w]; bits != 0; bits &= bits - 1) {
      const int32_t id = static_cast<int32_t>(w * 64) + std::countr_zero(bits);
      const TokenText& x = token_text_[id];
      if ((x.ascii[0] & ~ascii.bits[0]) != 0 || (x.ascii[1] & ~ascii.bits[1]) != 0) continue;
      if (x.non_ascii && !(multibyte && x.valid_utf8)) continue;
      const uint64_t bit = uint64_t{1} << (id & 63);
      tt->all[w] |= bit;
      if (x.num_chars <= kTextUpTo) tt->up_to[x.num_chars][w] |= bit;
    }
  }
  for (int32_t n = 1; n <= kTextUpTo; ++n) {
    for (size_t w = 0; w < words; ++w) tt->up_to[n][w] |= tt->up_to[n - 1][w];
  }
  std::lock_guard<std::mutex> lock(text_mu_);
  if (text_kinds_.size() >= kMaxTextKinds) text_kinds_.erase(text_kinds_.begin() + 1);
  text_kinds_.push_back(tt);
  return tt;
}

uint8_t TokenIndex::utf8_class(uint8_t b) {
  if (b < 0x80) return b;
  if (b <= 0x8F) return 0x80;
  if (b <= 0x9F) return 0x90;
  if (b <= 0xBF) return 0xA0;
  if (b <= 0xC1) return 0xC0;
  if (b <= 0xDF) return 0xC2;
  if (b == 0xE0) return 0xE0;
  if (b <= 0xEC) return 0xE1;
  if (b == 0xED) return 0xED;
  if (b <= 0xEF) return 0xEE;
  if (b == 0xF0) return 0xF0;
  if (b <= 0xF3) return 0xF1;
  if (b == 0xF4) return 0xF4;
  return 0xF5;
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
  trie_mask_.assign(mask_words(), 0);
  for (int32_t i = 0; i < num_tokens_; ++i) {
    if (allowed[i] && token_bytes[i].size() < 65535) {
      order.push_back(i);
      trie_mask_[i >> 6] |= uint64_t{1} << (i & 63);
    } else {
      in_trie_[i] = false;
    }
  }
  // Tokens as text, and the tokens that hold each byte.
  token_text_.assign(num_tokens_, TokenText{});
  std::vector<std::vector<int32_t>> with_byte(256);
  for (int32_t id : order) {
    TokenText& t = token_text_[id];
    Utf8State st = kBoundary;
    std::array<uint64_t, 4> seen{};
    for (char ch : token_bytes[id]) {
      const uint8_t b = static_cast<uint8_t>(ch);
      if (b < 0x80) {
        t.ascii[b >> 6] |= uint64_t{1} << (b & 63);
      } else {
        t.non_ascii = true;
      }
      if (st == kBoundary) ++t.num_chars;
      if (st != kInvalid) st = utf8_next(st, b);
      if (!((seen[b >> 6] >> (b & 63)) & 1)) {
        seen[b >> 6] |= uint64_t{1} << (b & 63);
        with_byte[b].push_back(id);
      }
    }
    t.valid_utf8 = st != kInvalid;
  }
  for (int32_t id : order) {
    if (token_text_[id].num_chars > kTextUpTo) long_tokens_.push_back(id);
  }
  std::sort(long_tokens_.begin(), long_tokens_.end());
  byte_token_offsets_.assign(257, 0);
  for (int b = 0; b < 256; ++b) {
    byte_token_offsets_[b + 1] =
        byte_token_offsets_[b] + static_cast<uint32_t>(with_byte[b].size());
    byte_tokens_.insert(byte_tokens_.end(), with_byte[b].begin(), with_byte[b].end());
  }

  auto by_string = [](const std::vector<std::string>& strs) {
    return [&strs](int32_t a, int32_t b) { return strs[a] != strs[b] ? strs[a] < strs[b] : a < b; };
  };
  std::sort(order.begin(), order.end(), by_string(token_bytes));
  build_trie(token_bytes, order, &byte_trie_);

  for (std::string& t : token_bytes) {
    for (char& c : t) c = static_cast<char>(utf8_class(static_cast<uint8_t>(c)));
  }
  std::sort(order.begin(), order.end(), by_string(token_bytes));
  build_trie(token_bytes, order, &class_trie_);

  // The characters of a JSON string (printable ASCII but '"' and '\\', any code point): the
  // text kind every JSON Schema meets first (kept first, never evicted).
  ByteSet json_chars;
  json_chars.add_range(0x20, 0x7E);
  json_chars.bits['"' >> 6] &= ~(uint64_t{1} << ('"' & 63));
  json_chars.bits['\\' >> 6] &= ~(uint64_t{1} << ('\\' & 63));
  text_tokens(json_chars, true);
}

void TokenIndex::build_trie(const std::vector<std::string>& strings,
                            const std::vector<int32_t>& order, Trie* trie) {
  // Preorder construction from the sorted strings: the path of open nodes is popped to the
  // common prefix with the previous string, then extended. Shorter strings sort first, so a
  // node's own tokens are appended before any of its descendants' tokens.
  std::vector<Node>& nodes = trie->nodes;
  std::vector<int32_t>& tokens = trie->tokens;
  std::vector<int32_t> path;  // node index per depth - 1
  std::vector<int32_t> parent;
  auto close = [&](int32_t node) {
    nodes[node].end = static_cast<int32_t>(nodes.size());
    nodes[node].tok_end = static_cast<int32_t>(tokens.size());
  };
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = strings[id];
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
      nd.tok_begin = static_cast<int32_t>(tokens.size());
      nd.own_end = nd.tok_begin;
      parent.push_back(path.empty() ? -1 : path.back());
      path.push_back(static_cast<int32_t>(nodes.size()));
      nodes.push_back(nd);
      trie->max_depth = std::max<int32_t>(trie->max_depth, nd.depth);
    }
    tokens.push_back(id);
    nodes[path.back()].own_end = static_cast<int32_t>(tokens.size());
    prev = &s;
  }
  while (!path.empty()) {
    close(path.back());
    path.pop_back();
  }

  // Bytes below each node, deduplicated (most subtrees share a handful of sets).
  std::vector<ByteSet> desc(nodes.size());
  for (int32_t i = static_cast<int32_t>(nodes.size()) - 1; i >= 0; --i) {
    if (parent[i] >= 0) {
      desc[parent[i]] |= desc[i];
      desc[parent[i]].add(nodes[i].byte);
      nodes[parent[i]].height = std::max<uint16_t>(nodes[parent[i]].height, nodes[i].height + 1);
    }
  }
  text_chars(*trie, parent);
  std::map<std::array<uint64_t, 4>, int32_t> ids;
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto [it, fresh] = ids.emplace(desc[i].bits, static_cast<int32_t>(trie->desc_sets.size()));
    if (fresh) trie->desc_sets.push_back(desc[i]);
    nodes[i].desc_bytes = it->second;
  }
}

}  // namespace kiln::grammar
