// A Jinja2 subset for chat templates, rendering byte for byte like Jinja2 as Hugging Face's
// apply_chat_template configures it: ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True, extensions=[loopcontrols]) with transformers' tojson, raise_exception
// and strftime_now. Anything outside the subset fails naming the construct and template
// line. docs/chat-templates.md lists the subset.
#pragma once

#include <ctime>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/chat/jinja/value.h"
#include "kiln/util/status.h"

namespace kiln::chat::jinja {

struct Stmt;

struct RenderContext {
  std::vector<std::pair<std::string, Value>> vars;  // template variables, later ones win
  std::tm now{};  // what strftime_now() formats (tests inject a fixed date)
  // Work bounds: a template that loops or recurses without end (or exponentially) fails
  // instead of hanging. Real chat templates take thousands of steps.
  int64_t max_steps = 4'000'000;        // statements + expressions evaluated
  size_t max_output_bytes = 64u << 20;  // rendered text, including captured blocks
};

class Template {
 public:
  // Lexes and parses; syntax errors name the template line.
  static Expected<Template> parse(const std::string& source);
  // Renders; errors name the construct and line. raise_exception(msg) gives msg in the error.
  Expected<std::string> render(const RenderContext& ctx) const;

 private:
  std::shared_ptr<std::vector<std::unique_ptr<Stmt>>> body_;
};

// Parse and render in one call.
Expected<std::string> render(const std::string& source, const RenderContext& ctx);

}  // namespace kiln::chat::jinja
