// Filters, tests, attribute/method lookup and global functions of the Jinja evaluator.
#pragma once

#include <ctime>
#include <string>

#include "kiln/chat/jinja/value.h"

namespace kiln::chat::jinja {

// `value|name(args)`; fails naming an unknown filter.
Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
// `value is name(args)`; fails naming an unknown test.
bool apply_test(const std::string& name, const Value& input, CallArgs& args);
// `obj.name` with Jinja2's rule: Python attribute (methods) first, then item.
Value get_attr(const Value& obj, const std::string& name);
// `obj[key]`: item first, then attribute; missing gives undefined.
Value get_item(const Value& obj, const Value& key);
// Iteration as Python does it (dict: keys, string: characters); fails on non-iterables.
ValueList iterate(const Value& v);
// Calls a callable value; fails on anything else.
Value call_value(const Value& callee, CallArgs& args);
// Fails with the undefined's message when v is undefined.
void check_defined(const Value& v);

// Global functions: range, dict, namespace, raise_exception, strftime_now(now).
Value make_global(const std::string& name, const std::tm& now);

// Argument helper: positional index or keyword, else the default.
const Value* find_arg(const CallArgs& args, size_t index, const char* name);

}  // namespace kiln::chat::jinja
