// Python methods of str, dict and list as templates call them (`s.strip()`, `d.items()`),
// and the string helpers the filters share.
#pragma once

#include <string>
#include <vector>

#include "kiln/chat/jinja/value.h"

namespace kiln::chat::jinja {

// A bound method of obj, or undefined when obj has no such method. Methods that mutate a
// list or dict fail when called (Jinja2's ImmutableSandboxedEnvironment refuses them).
Value get_method(const Value& obj, const std::string& name);

std::string ascii_lower(const std::string& s);
std::string ascii_upper(const std::string& s);
std::string py_capitalize(const std::string& s);
std::string py_title(const std::string& s);     // str.title()
std::string jinja_title(const std::string& s);  // the |title filter
// str.strip(chars); chars null: whitespace. left/right select the side.
std::string py_strip(const std::string& s, const std::string* chars, bool left = true,
                     bool right = true);
std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count);
std::vector<std::string> split_lines(const std::string& s);  // str.splitlines()
// Python printf-style `fmt % args` (args: a tuple/list of values or one value), for the
// `%` operator on strings and the |format filter: %s %r %d %i %f %F %e %g %x %X %o %c %%,
// with flags, width and precision.
std::string percent_format(const std::string& fmt, const ValueList& args);

}  // namespace kiln::chat::jinja
