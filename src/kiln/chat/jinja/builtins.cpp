// Filters, tests and globals (Jinja2's filters.py/tests.py/defaults.py semantics) and the
// attribute rules of Jinja2's sandbox (ImmutableSandboxedEnvironment: methods that mutate
// lists and dicts are refused, as in Hugging Face's renderer).
#include "kiln/chat/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "kiln/chat/jinja/methods.h"

namespace kiln::chat::jinja {

const Value* find_arg(const CallArgs& args, size_t index, const char* name) {
  for (const auto& [k, v] : args.kw) {
    if (k == name) return &v;
  }
  if (index < args.pos.size()) return &args.pos[index];
  return nullptr;
}

void check_defined(const Value& v) {
  if (v.is_undefined()) fail(v.str().empty() ? "value is undefined" : v.str());
}

ValueList iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::List:
      return v.items();
    case Value::Kind::Dict: {
      ValueList keys;
      for (const auto& e : v.dict_ref().entries) keys.push_back(e.first);
      return keys;
    }
    case Value::Kind::String: {
      ValueList chars;
      for (auto& c : utf8_chars(v.str())) chars.emplace_back(std::move(c));
      return chars;
    }
    case Value::Kind::Undefined:
      return {};
    default:
      fail(fmt::format("'{}' object is not iterable", v.type_name()));
  }
}

Value call_value(const Value& callee, CallArgs& args) {
  if (callee.is_func()) return callee.function().fn(args);
  check_defined(callee);
  fail(fmt::format("'{}' object is not callable", callee.type_name()));
}

static std::string type_repr(const Value& obj) {
  if (obj.is_none()) return "None";
  return obj.type_name() + " object";
}

Value get_attr(const Value& obj, const std::string& name) {
  check_defined(obj);
  if (obj.is_func() && obj.function().attrs()) return get_attr(*obj.function().attrs(), name);
  if (obj.is_namespace()) {
    if (const Value* v = obj.dict_ref().find(name)) return *v;
  } else {
    Value m = get_method(obj, name);
    if (!m.is_undefined()) return m;
    if (obj.is_dict()) {
      if (const Value* v = obj.dict_ref().find(name)) return *v;
    }
  }
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", type_repr(obj), name));
}

Value get_item(const Value& obj, const Value& key) {
  check_defined(obj);
  if (obj.is_dict() && !obj.is_namespace()) {
    if (const Value* v = obj.dict_ref().find(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) && key.is_number() && !key.is_float()) {
    int64_t i = key.is_bool() ? key.as_bool() : key.as_int();
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.items().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.items()[static_cast<size_t>(i)];
    } else {
      auto chars = utf8_chars(obj.str());
      int64_t n = static_cast<int64_t>(chars.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value(chars[static_cast<size_t>(i)]);
    }
    return Value::undefined(fmt::format("'{}' has no element {}", type_repr(obj), i));
  }
  if (key.is_string()) return get_attr(obj, key.str());
  return Value::undefined(fmt::format("'{}' has no element {}", type_repr(obj), key.repr()));
}

// ---- helpers for filters ----

static int64_t int_arg(const CallArgs& a, size_t i, const char* name, int64_t def) {
  const Value* v = find_arg(a, i, name);
  if (!v || v->is_none()) return def;
  if (!v->is_number() || v->is_float()) fail(fmt::format("argument '{}' must be an integer", name));
  return v->is_bool() ? v->as_bool() : v->as_int();
}
static bool bool_arg(const CallArgs& a, size_t i, const char* name, bool def) {
  const Value* v = find_arg(a, i, name);
  return v ? v->truthy() : def;
}
static std::string str_arg(const CallArgs& a, size_t i, const char* name, const char* def) {
  const Value* v = find_arg(a, i, name);
  if (!v) return def;
  return v->to_str();
}

// Jinja2's make_attrgetter: dotted path, numeric parts index lists.
static Value attr_path(const Value& item, const std::string& path) {
  Value cur = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = numeric ? get_item(cur, Value(static_cast<int64_t>(std::stoll(part))))
                  : get_item(cur, Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

static Value lower_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(ascii_lower(v.str()));
  return v;
}

static Value sort_key(const Value& item, const std::string& attribute, bool case_sensitive) {
  return lower_key(attribute.empty() ? item : attr_path(item, attribute), case_sensitive);
}

static std::string do_indent(const std::string& input, const Value* width_arg, bool first,
                             bool blank) {
  std::string indention = "    ";
  if (width_arg) {
    if (width_arg->is_string()) {
      indention = width_arg->str();
    } else if (width_arg->is_int()) {
      int64_t w = width_arg->as_int();
      if (w < 0 || w > 4096) fail("indent width out of range");
      indention = std::string(static_cast<size_t>(w), ' ');
    } else {
      fail("indent width must be an integer or a string");
    }
  }
  std::vector<std::string> lines = split_lines(input + "\n");
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
    }
  }
  if (first) rv = indention + rv;
  return rv;
}

static Value do_tojson(const Value& input, const CallArgs& a) {
  bool ensure_ascii = bool_arg(a, 0, "ensure_ascii", false);
  const Value* indent_v = find_arg(a, 1, "indent");
  int indent = -1;
  if (indent_v && !indent_v->is_none()) {
    if (!indent_v->is_int()) fail("unsupported construct: tojson indent that is not an integer");
    indent = static_cast<int>(std::clamp<int64_t>(indent_v->as_int(), 0, 64));
  }
  std::string item_sep = indent >= 0 ? "," : ", ";
  std::string key_sep = ": ";
  if (const Value* sep = find_arg(a, 2, "separators"); sep && !sep->is_none()) {
    if (!sep->is_list() || sep->items().size() != 2) fail("tojson separators must be a pair");
    item_sep = sep->items()[0].to_str();
    key_sep = sep->items()[1].to_str();
  }
  bool sort_keys = bool_arg(a, 3, "sort_keys", false);
  return Value(to_json_text(input, indent, item_sep, key_sep, sort_keys, ensure_ascii));
}

// The test arguments after the test name in select/selectattr.
static bool run_select_test(const Value& v, const CallArgs& a, size_t first) {
  if (a.pos.size() <= first) return v.truthy();
  CallArgs targs;
  targs.pos.assign(a.pos.begin() + static_cast<ptrdiff_t>(first) + 1, a.pos.end());
  return apply_test(a.pos[first].to_str(), v, targs);
}

static Value do_select(const std::string& name, const Value& input, CallArgs& a) {
  bool want = name == "select" || name == "selectattr";
  bool by_attr = name == "selectattr" || name == "rejectattr";
  ValueList out;
  if (!input.truthy()) return Value::iterator({});  // Jinja2: `if value:` before iterating
  for (const auto& item : iterate(input)) {
    bool ok;
    if (by_attr) {
      if (a.pos.empty()) fail(fmt::format("{} needs an attribute name", name));
      ok = run_select_test(attr_path(item, a.pos[0].to_str()), a, 1);
    } else {
      ok = run_select_test(item, a, 0);
    }
    if (ok == want) out.push_back(item);
  }
  return Value::iterator(std::move(out));
}

static Value do_map(const Value& input, CallArgs& a) {
  ValueList out;
  if (!input.truthy()) return Value::iterator({});
  const Value* attribute = find_arg(a, 99, "attribute");
  if (attribute) {
    const Value* def = find_arg(a, 99, "default");
    for (const auto& item : iterate(input)) {
      Value v = attr_path(item, attribute->to_str());
      if (v.is_undefined() && def) v = *def;
      out.push_back(v);
    }
    return Value::iterator(std::move(out));
  }
  if (a.pos.empty()) fail("map needs a filter name or attribute=");
  std::string filter = a.pos[0].to_str();
  CallArgs fargs;
  fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
  fargs.kw = a.kw;
  for (const auto& item : iterate(input)) out.push_back(apply_filter(filter, item, fargs));
  return Value::iterator(std::move(out));
}

static Value do_sort(const Value& input, CallArgs& a) {
  bool reverse = bool_arg(a, 0, "reverse", false);
  bool case_sensitive = bool_arg(a, 1, "case_sensitive", false);
  std::string attribute = str_arg(a, 2, "attribute", "");
  ValueList items = iterate(input);
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t i = 0; i < items.size(); ++i)
    keyed.emplace_back(sort_key(items[i], attribute, case_sensitive), i);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? py_less(y.first, x.first) : py_less(x.first, y.first);
  });
  ValueList out;
  for (const auto& k : keyed) out.push_back(items[k.second]);
  return Value::list(std::move(out));
}

static Value do_unique(const Value& input, CallArgs& a) {
  bool case_sensitive = bool_arg(a, 0, "case_sensitive", false);
  std::string attribute = str_arg(a, 1, "attribute", "");
  ValueList out, seen;
  for (const auto& item : iterate(input)) {
    Value k = sort_key(item, attribute, case_sensitive);
    bool dup = false;
    for (const auto& s : seen) dup = dup || py_equal(s, k);
    if (!dup) {
      seen.push_back(k);
      out.push_back(item);
    }
  }
  return Value::iterator(std::move(out));
}

static Value do_int(const Value& input, CallArgs& a) {
  int64_t def = int_arg(a, 0, "default", 0);
  if (input.is_bool()) return Value(static_cast<int64_t>(input.as_bool()));
  if (input.is_int()) return input;
  if (input.is_float()) {
    double f = input.as_float();
    if (!std::isfinite(f) || std::fabs(f) > 9.2e18) return Value(def);
    return Value(static_cast<int64_t>(f));
  }
  if (input.is_string()) {
    std::string s = py_strip(input.str(), nullptr);
    std::string t;
    for (char c : s) {
      if (c != '_') t += c;
    }
    if (!t.empty()) {
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(t.c_str(), &end, 10);
      if (*end == '\0' && errno == 0) return Value(static_cast<int64_t>(v));
      double f = std::strtod(t.c_str(), &end);
      if (*end == '\0' && std::isfinite(f) && std::fabs(f) < 9.2e18)
        return Value(static_cast<int64_t>(f));
    }
  }
  return Value(def);
}

static Value do_float(const Value& input, CallArgs& a) {
  const Value* def = find_arg(a, 0, "default");
  if (input.is_number()) return Value(input.to_double());
  if (input.is_string()) {
    std::string s = py_strip(input.str(), nullptr);
    char* end = nullptr;
    double f = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value(f);
  }
  return def ? *def : Value(0.0);
}

static Value do_length(const Value& input) {
  if (input.is_iterator()) fail("object of type 'generator' has no len()");
  if (input.is_string()) return Value(static_cast<int64_t>(utf8_length(input.str())));
  if (input.is_list()) return Value(static_cast<int64_t>(input.items().size()));
  if (input.is_dict()) return Value(static_cast<int64_t>(input.dict_ref().entries.size()));
  if (input.is_undefined()) return Value(0);
  fail(fmt::format("object of type '{}' has no len()", input.type_name()));
}

static Value do_first_last(const Value& input, bool last) {
  ValueList items = iterate(input);
  if (items.empty())
    return Value::undefined(last ? "No last item, sequence was empty."
                                 : "No first item, sequence was empty.");
  return last ? items.back() : items.front();
}

static Value do_minmax(const Value& input, CallArgs& a, bool is_max) {
  bool case_sensitive = bool_arg(a, 0, "case_sensitive", false);
  std::string attribute = str_arg(a, 1, "attribute", "");
  ValueList items = iterate(input);
  if (items.empty())
    return Value::undefined(is_max ? "No aggregated item, sequence was empty."
                                   : "No aggregated item, sequence was empty.");
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = sort_key(items[i], attribute, case_sensitive);
    Value b = sort_key(items[best], attribute, case_sensitive);
    if (is_max ? py_less(b, k) : py_less(k, b)) best = i;
  }
  return items[best];
}

static Value do_batch(const Value& input, CallArgs& a) {
  int64_t n = int_arg(a, 0, "linecount", 1);
  if (n <= 0) fail("batch size must be positive");
  const Value* fill = find_arg(a, 1, "fill_with");
  ValueList out, cur;
  for (const auto& item : iterate(input)) {
    cur.push_back(item);
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value::list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (fill && !fill->is_none()) {
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*fill);
    }
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::iterator(std::move(out));
}

static Value do_round(const Value& input, CallArgs& a) {
  int64_t precision = int_arg(a, 0, "precision", 0);
  std::string method = str_arg(a, 1, "method", "common");
  double v = input.to_double();
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v * scale;
  double r;
  if (method == "common") {
    r = std::nearbyint(x);  // Python round(): half to even
  } else if (method == "ceil") {
    r = std::ceil(x);
  } else if (method == "floor") {
    r = std::floor(x);
  } else {
    fail("method must be common, ceil or floor");
  }
  return Value(r / scale);
}

static Value do_dictsort(const Value& input, CallArgs& a) {
  if (!input.is_dict()) fail("dictsort needs a dict");
  bool case_sensitive = bool_arg(a, 0, "case_sensitive", false);
  std::string by = str_arg(a, 1, "by", "key");
  bool reverse = bool_arg(a, 2, "reverse", false);
  size_t pos = by == "value" ? 1 : 0;
  ValueList pairs;
  for (const auto& [k, v] : input.dict_ref().entries) pairs.push_back(Value::list({k, v}, true));
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    Value kx = lower_key(x.items()[pos], case_sensitive),
          ky = lower_key(y.items()[pos], case_sensitive);
    return reverse ? py_less(ky, kx) : py_less(kx, ky);
  });
  return Value::list(std::move(pairs));
}

static Value do_string_filter(const std::string& name, const Value& input, CallArgs& a) {
  std::string s = input.to_str();
  if (name == "upper") return Value(ascii_upper(s));
  if (name == "lower") return Value(ascii_lower(s));
  if (name == "capitalize") return Value(py_capitalize(s));
  if (name == "title") return Value(jinja_title(s));
  if (name == "trim") {
    const Value* chars = find_arg(a, 0, "chars");
    std::string cs = chars && !chars->is_none() ? chars->to_str() : "";
    return Value(py_strip(s, chars && !chars->is_none() ? &cs : nullptr));
  }
  if (name == "replace") {
    if (a.pos.size() < 2) fail("replace needs old and new");
    return Value(py_replace(s, a.pos[0].to_str(), a.pos[1].to_str(), int_arg(a, 2, "count", -1)));
  }
  if (name == "indent") {
    return Value(do_indent(s, find_arg(a, 0, "width"), bool_arg(a, 1, "first", false),
                           bool_arg(a, 2, "blank", false)));
  }
  if (name == "center") {
    int64_t width = int_arg(a, 0, "width", 80);
    if (width > (1 << 20)) fail("center width too large");
    int64_t len = static_cast<int64_t>(utf8_length(s));
    if (width <= len) return Value(s);
    int64_t total = width - len;
    int64_t left = total / 2 + (total & width & 1);
    return Value(std::string(static_cast<size_t>(left), ' ') + s +
                 std::string(static_cast<size_t>(total - left), ' '));
  }
  if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (unsigned char c : s) {
      bool w = std::isalnum(c) || c == '_' || c >= 0x80;
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value(n);
  }
  if (name == "e" || name == "escape" || name == "forceescape") {
    if (input.is_markup() && name != "forceescape") return input;
    return Value::markup(html_escape(s));
  }
  fail(fmt::format("no filter named '{}'", name));
}

static Value do_items(const Value& input) {
  if (input.is_undefined()) return Value::iterator({});
  if (!input.is_dict()) fail("Can only get item pairs from a mapping.");
  ValueList pairs;
  for (const auto& [k, v] : input.dict_ref().entries) pairs.push_back(Value::list({k, v}, true));
  return Value::iterator(std::move(pairs));
}

static Value do_join(const Value& input, CallArgs& a) {
  std::string sep = str_arg(a, 0, "d", "");
  const Value* attribute = find_arg(a, 1, "attribute");
  std::string out;
  bool first = true;
  for (const auto& item : iterate(input)) {
    if (!first) out += sep;
    first = false;
    out += (attribute ? attr_path(item, attribute->to_str()) : item).to_str();
  }
  return Value(std::move(out));
}

static Value do_reverse(const Value& input) {
  if (input.is_string()) {
    auto chars = utf8_chars(input.str());
    std::string out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
    return Value(std::move(out));
  }
  ValueList items = iterate(input);
  std::reverse(items.begin(), items.end());
  return Value::iterator(std::move(items));
}

static Value do_abs(const Value& input) {
  if (input.is_float()) return Value(std::fabs(input.as_float()));
  if (input.is_number()) {
    int64_t i = input.is_bool() ? input.as_bool() : input.as_int();
    if (i == INT64_MIN) fail("integer overflow");
    return Value(i < 0 ? -i : i);
  }
  fail(fmt::format("bad operand type for abs(): '{}'", input.type_name()));
}

static Value do_sum(const Value& input, CallArgs& a) {
  std::string attribute = str_arg(a, 0, "attribute", "");
  const Value* start = find_arg(a, 1, "start");
  Value total = start ? *start : Value(0);
  for (const auto& item : iterate(input)) {
    Value v = attribute.empty() ? item : attr_path(item, attribute);
    if (!total.is_number() || !v.is_number()) {
      fail(fmt::format("unsupported operand type(s) for +: '{}' and '{}'", total.type_name(),
                       v.type_name()));
    }
    if (total.is_float() || v.is_float()) {
      total = Value(total.to_double() + v.to_double());
    } else {
      int64_t x = total.is_bool() ? total.as_bool() : total.as_int();
      int64_t y = v.is_bool() ? v.as_bool() : v.as_int();
      int64_t out;
      if (__builtin_add_overflow(x, y, &out)) fail("integer overflow");
      total = Value(out);
    }
  }
  return total;
}

static Value do_default(const Value& input, CallArgs& a) {
  const Value* def = find_arg(a, 0, "default_value");
  bool boolean = bool_arg(a, 1, "boolean", false);
  if (input.is_undefined() || (boolean && !input.truthy())) return def ? *def : Value("");
  return input;
}

Value apply_filter(const std::string& name, const Value& input, CallArgs& a) {
  using Fn = Value (*)(const Value&, CallArgs&);
  static const std::pair<const char*, Fn> kFilters[] = {
      {"tojson", [](const Value& v, CallArgs& x) { return do_tojson(v, x); }},
      {"default", do_default},
      {"d", do_default},
      {"length", [](const Value& v, CallArgs&) { return do_length(v); }},
      {"count", [](const Value& v, CallArgs&) { return do_length(v); }},
      {"string", [](const Value& v, CallArgs&) { return Value(v.to_str()); }},
      {"safe",
       [](const Value& v, CallArgs&) { return v.is_markup() ? v : Value::markup(v.to_str()); }},
      {"list", [](const Value& v, CallArgs&) { return Value::list(iterate(v)); }},
      {"items", [](const Value& v, CallArgs&) { return do_items(v); }},
      {"first", [](const Value& v, CallArgs&) { return do_first_last(v, false); }},
      {"last", [](const Value& v, CallArgs&) { return do_first_last(v, true); }},
      {"join", do_join},
      {"select", [](const Value& v, CallArgs& x) { return do_select("select", v, x); }},
      {"reject", [](const Value& v, CallArgs& x) { return do_select("reject", v, x); }},
      {"selectattr", [](const Value& v, CallArgs& x) { return do_select("selectattr", v, x); }},
      {"rejectattr", [](const Value& v, CallArgs& x) { return do_select("rejectattr", v, x); }},
      {"map", do_map},
      {"sort", do_sort},
      {"unique", do_unique},
      {"reverse", [](const Value& v, CallArgs&) { return do_reverse(v); }},
      {"int", do_int},
      {"float", do_float},
      {"abs", [](const Value& v, CallArgs&) { return do_abs(v); }},
      {"round", do_round},
      {"min", [](const Value& v, CallArgs& x) { return do_minmax(v, x, false); }},
      {"max", [](const Value& v, CallArgs& x) { return do_minmax(v, x, true); }},
      {"sum", do_sum},
      {"batch", do_batch},
      {"dictsort", do_dictsort},
      {"format",
       [](const Value& v, CallArgs& x) {
         if (!x.kw.empty()) fail("format filter: keyword arguments are not supported");
         return Value(percent_format(v.to_str(), x.pos));
       }},
      {"attr", [](const Value& v, CallArgs& x) { return get_attr(v, str_arg(x, 0, "name", "")); }},
  };
  for (const auto& [n, fn] : kFilters) {
    if (name == n) return fn(input, a);
  }
  static const char* kStringFilters[] = {"upper",     "lower",   "capitalize", "title",
                                         "trim",      "replace", "indent",     "center",
                                         "wordcount", "e",       "escape",     "forceescape"};
  for (const char* f : kStringFilters) {
    if (name == f) return do_string_filter(name, input, a);
  }
  fail(fmt::format("unsupported filter '{}'", name));
}

bool apply_test(const std::string& name, const Value& v, CallArgs& a) {
  const Value* arg = find_arg(a, 0, "value");
  auto need_arg = [&]() -> const Value& {
    if (!arg) fail(fmt::format("test '{}' needs an argument", name));
    return *arg;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.is_namespace();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "callable") return v.is_func();
  if (name == "escaped") return v.is_markup();
  if (name == "sameas") {
    // Python identity: containers by reference; None/True/False and small ints are
    // singletons; other strings and numbers are taken as distinct objects.
    const Value& o = need_arg();
    if (v.identity() || o.identity()) return v.identity() == o.identity();
    if (v.kind() != o.kind()) return false;
    if (v.is_none() || v.is_bool()) return py_equal(v, o);
    if (v.is_int()) return v.as_int() == o.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
    return false;
  }
  if (name == "in")
    return [&] {
      const Value& seq = need_arg();
      if (seq.is_string()) {
        if (!v.is_string()) fail("'in <string>' requires string as left operand");
        return seq.str().find(v.str()) != std::string::npos;
      }
      if (seq.is_dict()) return seq.dict_ref().find(v) != nullptr;
      for (const auto& item : iterate(seq)) {
        if (py_equal(item, v)) return true;
      }
      return false;
    }();
  if (name == "lower" || name == "upper") {
    std::string s = v.to_str();
    bool has_cased = false, ok = true;
    for (unsigned char c : s) {
      if (std::isalpha(c)) {
        has_cased = true;
        ok = ok && (name == "lower" ? std::islower(c) : std::isupper(c));
      }
    }
    return has_cased && ok;
  }
  if (name == "even" || name == "odd" || name == "divisibleby") {
    check_defined(v);
    if (!v.is_number()) fail(fmt::format("test '{}' needs a number", name));
    if (v.is_float()) {
      double d = name == "divisibleby" ? need_arg().to_double() : 2.0;
      double m = std::fmod(v.as_float(), d);
      return name == "odd" ? m != 0 : m == 0;
    }
    int64_t i = v.is_bool() ? v.as_bool() : v.as_int();
    if (name == "even") return i % 2 == 0;
    if (name == "odd") return i % 2 != 0;
    const Value& d = need_arg();
    int64_t n = d.is_bool() ? d.as_bool() : d.as_int();
    if (d.is_float() || n == 0) fail("divisibleby needs a non-zero integer");
    return i % n == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return py_equal(v, need_arg());
  if (name == "ne" || name == "!=") return !py_equal(v, need_arg());
  if (name == "lt" || name == "lessthan" || name == "<") return py_less(v, need_arg());
  if (name == "gt" || name == "greaterthan" || name == ">") return py_less(need_arg(), v);
  if (name == "le" || name == "<=") return !py_less(need_arg(), v);
  if (name == "ge" || name == ">=") return !py_less(v, need_arg());
  fail(fmt::format("unsupported test '{}'", name));
}

static Value make_range(CallArgs& a) {
  if (a.pos.empty() || a.pos.size() > 3) fail("range expects 1 to 3 integer arguments");
  for (const auto& v : a.pos) {
    if (!v.is_int() && !v.is_bool()) fail("range arguments must be integers");
  }
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = a.pos[0].as_int();
  } else {
    start = a.pos[0].as_int();
    stop = a.pos[1].as_int();
    if (a.pos.size() == 3) step = a.pos[2].as_int();
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  ValueList out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    if (out.size() >= 100000) fail("range too big, maximum size for range is 100000");
    out.emplace_back(i);
    if (__builtin_add_overflow(i, step, &i)) break;
  }
  return Value::list(std::move(out));
}

Value make_global(const std::string& name, const std::tm& now) {
  if (name == "range") return Value::func("range", make_range);
  if (name == "dict") {
    return Value::func("dict", [](CallArgs& a) {
      Value d = Value::dict();
      if (!a.pos.empty()) {
        if (a.pos[0].is_dict()) {
          for (const auto& [k, v] : a.pos[0].dict_ref().entries) d.dict_ref().set(k, v);
        } else {
          for (const auto& pair : iterate(a.pos[0])) {
            ValueList kv = iterate(pair);
            if (kv.size() != 2) fail("dict() sequence elements must have length 2");
            d.dict_ref().set(kv[0], kv[1]);
          }
        }
      }
      for (auto& [k, v] : a.kw) d.dict_ref().set(Value(k), v);
      return d;
    });
  }
  if (name == "namespace") {
    return Value::func("namespace", [](CallArgs& a) {
      Value ns = Value::namespace_();
      if (!a.pos.empty() && a.pos[0].is_dict()) {
        for (const auto& [k, v] : a.pos[0].dict_ref().entries) ns.dict_ref().set(k, v);
      }
      for (auto& [k, v] : a.kw) ns.dict_ref().set(Value(k), v);
      return ns;
    });
  }
  if (name == "raise_exception") {
    return Value::func("raise_exception", [](CallArgs& a) -> Value {
      throw JinjaError{a.pos.empty() ? std::string() : a.pos[0].to_str(), a.line, true};
    });
  }
  if (name == "strftime_now") {
    return Value::func("strftime_now", [now](CallArgs& a) {
      if (a.pos.empty()) fail("strftime_now needs a format");
      std::string f = a.pos[0].to_str();
      if (f.empty()) return Value("");
      char buf[512];
      size_t n = std::strftime(buf, sizeof(buf), f.c_str(), &now);
      if (n == 0) fail("strftime_now: format produced nothing or is too long");
      return Value(std::string(buf, n));
    });
  }
  return Value();
}

}  // namespace kiln::chat::jinja
