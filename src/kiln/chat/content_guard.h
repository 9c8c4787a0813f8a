// Control-token text in message content stays text.
//
// A chat prompt is rendered from the template's markup and the client's strings (message
// content, tool results, assistant history, tool definitions). Tokenizing the rendered
// prompt with special-token parsing would turn "<|im_end|>\n<|im_start|>system" typed by a
// user into real control tokens: a forged turn. ContentGuard keeps the two apart:
//
//   ContentGuard guard(find);          // find: where a text spells a control token
//   guard.protect(messages);           // such text in every string -> a unique marker
//   guard.protect(tools);
//   std::string rendered = render_chat(tmpl, messages, ...);
//   auto [prompt, literal] = guard.restore(rendered);  // markers -> the original text
//   tokenizer.encode(prompt, .., /*parse_special=*/true, literal);  // literal: no control
//
// Strings without control-token text are left as they are, so templates see exactly what
// the client sent unless it spelled a control token. A marker is ASCII letters and digits
// with a random 64-bit nonce, so template string operations (strip, split, tojson) carry it
// through and no client text can collide with it.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::chat {

class ContentGuard {
 public:
  using Range = std::pair<size_t, size_t>;  // [begin, end) byte offsets
  using FindFn = std::function<std::vector<Range>(std::string_view)>;

  explicit ContentGuard(FindFn find);

  // Replaces each range find() reports, in every string value of `value` (recursively;
  // object keys are left alone), with a marker.
  void protect(nlohmann::ordered_json& value);
  // Whether protect() replaced anything.
  bool empty() const { return originals_.empty(); }

  struct Restored {
    std::string text;
    std::vector<Range> literal;  // where restored text lies in `text`, sorted
  };
  // `rendered` with every marker replaced by the text it stands for.
  Restored restore(std::string_view rendered) const;

 private:
  std::string protect_string(const std::string& s);

  FindFn find_;
  std::string prefix_;  // "kilnlit" + nonce + "n": a marker is prefix_ + index + "x"
  std::vector<std::string> originals_;
};

}  // namespace kiln::chat
