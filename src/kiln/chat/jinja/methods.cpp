#include "kiln/chat/jinja/methods.h"

#include <cctype>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "kiln/chat/jinja/builtins.h"

namespace kiln::chat::jinja {
namespace {

// Length of the Python whitespace character (str.isspace) starting at s[i], or 0.
size_t space_len(const std::string& s, size_t i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
  if (c == 0xc2 && i + 1 < s.size()) {
    unsigned char d = static_cast<unsigned char>(s[i + 1]);
    return d == 0x85 || d == 0xa0 ? 2 : 0;
  }
  if (i + 2 >= s.size()) return 0;
  unsigned char d = static_cast<unsigned char>(s[i + 1]), e = static_cast<unsigned char>(s[i + 2]);
  if (c == 0xe1 && d == 0x9a && e == 0x80) return 3;  // U+1680
  if (c == 0xe2 && d == 0x80 && (e <= 0x8a || e == 0xa8 || e == 0xa9 || e == 0xaf)) return 3;
  if (c == 0xe2 && d == 0x81 && e == 0x9f) return 3;  // U+205F
  if (c == 0xe3 && d == 0x80 && e == 0x80) return 3;  // U+3000
  return 0;
}

size_t space_len_before(const std::string& s, size_t end) {
  for (size_t n = 1; n <= 3 && n <= end; ++n) {
    if (space_len(s, end - n) == n) return n;
  }
  return 0;
}

std::vector<std::string> split_ws(const std::string& s, int64_t maxsplit) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && space_len(s, i)) i += space_len(s, i);
    if (i >= s.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      std::string rest = s.substr(i);
      out.push_back(py_strip(rest, nullptr, false, true));
      break;
    }
    size_t j = i;
    while (j < s.size() && !space_len(s, j)) ++j;
    out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::vector<std::string> split_sep(const std::string& s, const std::string& sep, int64_t maxsplit) {
  if (sep.empty()) fail("empty separator");
  std::vector<std::string> out;
  size_t start = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    size_t p = s.find(sep, start);
    if (p == std::string::npos) break;
    out.push_back(s.substr(start, p - start));
    start = p + sep.size();
  }
  out.push_back(s.substr(start));
  return out;
}

std::vector<std::string> rsplit_sep(const std::string& s, const std::string& sep,
                                    int64_t maxsplit) {
  if (maxsplit < 0) return split_sep(s, sep, -1);
  if (sep.empty()) fail("empty separator");
  std::vector<std::string> out;
  size_t end = s.size();
  while (static_cast<int64_t>(out.size()) < maxsplit) {
    if (end < sep.size()) break;
    size_t p = s.rfind(sep, end - sep.size());
    if (p == std::string::npos) break;
    out.insert(out.begin(), s.substr(p + sep.size(), end - p - sep.size()));
    end = p;
  }
  out.insert(out.begin(), s.substr(0, end));
  return out;
}

Value str_list(const std::vector<std::string>& parts) {
  ValueList out;
  for (const auto& p : parts) out.emplace_back(p);
  return Value::list(std::move(out));
}

int64_t opt_int(const CallArgs& a, size_t i, const char* name, int64_t def) {
  const Value* v = find_arg(a, i, name);
  if (!v || v->is_none()) return def;
  if (!v->is_int()) fail(fmt::format("argument '{}' must be an integer", name));
  return v->as_int();
}

// Byte offset of code point index i (clamped, negatives from the end).
size_t cp_offset(const std::string& s, int64_t i) {
  int64_t n = static_cast<int64_t>(utf8_length(s));
  if (i < 0) i = std::max<int64_t>(0, i + n);
  if (i >= n) return s.size();
  size_t pos = 0;
  for (int64_t k = 0; k < i; ++k) {
    ++pos;
    while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xc0) == 0x80) ++pos;
  }
  return pos;
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, const CallArgs& a) {
  size_t start = cp_offset(s, opt_int(a, 1, "start", 0));
  std::string sub = s.substr(start);
  auto one = [&](const Value& v) {
    if (!v.is_string()) fail("startswith/endswith first arg must be str or a tuple of str");
    const std::string& x = v.str();
    if (x.size() > sub.size()) return false;
    return prefix ? sub.compare(0, x.size(), x) == 0
                  : sub.compare(sub.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) {
    for (const auto& v : affix.items()) {
      if (one(v)) return true;
    }
    return false;
  }
  return one(affix);
}

std::string str_format(const std::string& f, const CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    char c = f[i];
    if (c == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      out += '}';
      ++i;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t close = f.find('}', i);
    if (close == std::string::npos) fail("Single '{' encountered in format string");
    std::string field = f.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!.[") != std::string::npos) {
      fail(fmt::format("unsupported construct: format field '{{{}}}'", field));
    }
    const Value* v = nullptr;
    if (field.empty()) {
      if (auto_index < a.pos.size()) v = &a.pos[auto_index++];
    } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
      size_t idx = static_cast<size_t>(std::atoi(field.c_str()));
      if (idx < a.pos.size()) v = &a.pos[idx];
    } else {
      v = find_arg(a, SIZE_MAX, field.c_str());
    }
    if (!v) fail(fmt::format("format: no argument for field '{{{}}}'", field));
    out += v->to_str();
    i = close;
  }
  return out;
}

Value string_method(const std::string& s, const std::string& name, CallArgs& a) {
  auto chars_arg = [&](std::string& buf) -> const std::string* {
    const Value* c = find_arg(a, 0, "chars");
    if (!c || c->is_none()) return nullptr;
    buf = c->to_str();
    return &buf;
  };
  std::string buf;
  if (name == "strip") return Value(py_strip(s, chars_arg(buf)));
  if (name == "lstrip") return Value(py_strip(s, chars_arg(buf), true, false));
  if (name == "rstrip") return Value(py_strip(s, chars_arg(buf), false, true));
  if (name == "upper") return Value(ascii_upper(s));
  if (name == "lower") return Value(ascii_lower(s));
  if (name == "title") return Value(py_title(s));
  if (name == "capitalize") return Value(py_capitalize(s));
  if (name == "split" || name == "rsplit") {
    const Value* sep = find_arg(a, 0, "sep");
    int64_t maxsplit = opt_int(a, 1, "maxsplit", -1);
    if (!sep || sep->is_none()) {
      if (name == "rsplit" && maxsplit >= 0)
        fail("unsupported construct: rsplit() without sep and with maxsplit");
      return str_list(split_ws(s, maxsplit));
    }
    return str_list(name == "split" ? split_sep(s, sep->to_str(), maxsplit)
                                    : rsplit_sep(s, sep->to_str(), maxsplit));
  }
  if (name == "splitlines") return str_list(split_lines(s));
  if (name == "startswith" || name == "endswith") {
    if (a.pos.empty()) fail(fmt::format("{}() takes at least 1 argument", name));
    return Value(affix_match(s, a.pos[0], name == "startswith", a));
  }
  if (name == "replace") {
    if (a.pos.size() < 2) fail("replace() needs old and new");
    return Value(py_replace(s, a.pos[0].to_str(), a.pos[1].to_str(), opt_int(a, 2, "count", -1)));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    if (a.pos.empty() || !a.pos[0].is_string()) fail(fmt::format("{}() needs a string", name));
    size_t start = cp_offset(s, opt_int(a, 1, "start", 0));
    bool rev = name[0] == 'r';
    size_t p = rev ? s.rfind(a.pos[0].str()) : s.find(a.pos[0].str(), start);
    if (p != std::string::npos && p < start) p = std::string::npos;
    if (p == std::string::npos) {
      if (name.find("index") != std::string::npos) fail("substring not found");
      return Value(-1);
    }
    return Value(static_cast<int64_t>(utf8_length(s.substr(0, p))));
  }
  if (name == "count") {
    if (a.pos.empty() || !a.pos[0].is_string()) fail("count() needs a string");
    const std::string& sub = a.pos[0].str();
    if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(s) + 1));
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value(n);
  }
  if (name == "join") {
    if (a.pos.empty()) fail("join() needs an iterable");
    std::string out;
    bool first = true;
    for (const auto& v : iterate(a.pos[0])) {
      if (!v.is_string())
        fail(fmt::format("sequence item: expected str instance, {} found", v.type_name()));
      if (!first) out += s;
      first = false;
      out += v.str();
    }
    return Value(std::move(out));
  }
  if (name == "format") return Value(str_format(s, a));
  auto all_of = [&](auto pred) {
    if (s.empty()) return Value(false);
    for (unsigned char c : s) {
      if (!pred(c)) return Value(false);
    }
    return Value(true);
  };
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal")
    return all_of([](unsigned char c) { return std::isdigit(c) != 0; });
  if (name == "isalpha") return all_of([](unsigned char c) { return std::isalpha(c) != 0; });
  if (name == "isalnum") return all_of([](unsigned char c) { return std::isalnum(c) != 0; });
  if (name == "isspace") return all_of([](unsigned char c) { return std::isspace(c) != 0; });
  if (name == "islower" || name == "isupper") {
    CallArgs none;
    return Value(apply_test(name.substr(2), Value(s), none));
  }
  fail(fmt::format("unsupported construct: str.{}()", name));
}

Value dict_method(const Value& d, const std::string& name, CallArgs& a) {
  if (name == "get") {
    if (a.pos.empty()) fail("get() needs a key");
    const Value* v = d.dict_ref().find(a.pos[0]);
    if (v) return *v;
    return a.pos.size() > 1 ? a.pos[1] : Value::none();
  }
  ValueList out;
  for (const auto& [k, v] : d.dict_ref().entries) {
    if (name == "items") out.push_back(Value::list({k, v}, true));
    if (name == "keys") out.push_back(k);
    if (name == "values") out.push_back(v);
  }
  if (name == "copy") {
    Value c = Value::dict();
    c.dict_ref().entries = d.dict_ref().entries;
    return c;
  }
  return Value::list(std::move(out));
}

Value list_method(const Value& l, const std::string& name, CallArgs& a) {
  if (a.pos.empty()) fail(fmt::format("{}() takes exactly one argument", name));
  const ValueList& items = l.items();
  if (name == "count") {
    int64_t n = 0;
    for (const auto& v : items) n += py_equal(v, a.pos[0]);
    return Value(n);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (py_equal(items[i], a.pos[0])) return Value(static_cast<int64_t>(i));
  }
  fail(fmt::format("{} is not in list", a.pos[0].repr()));
}

Value unsafe(const Value& obj, const std::string& name) {
  std::string type = obj.type_name();
  return Value::func(name, [type, name](CallArgs&) -> Value {
    fail(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type));
  });
}

}  // namespace

Value get_method(const Value& obj, const std::string& name) {
  static const char* kStr[] = {
      "strip",     "lstrip",    "rstrip",     "upper",      "lower",    "title",   "capitalize",
      "split",     "rsplit",    "splitlines", "startswith", "endswith", "replace", "find",
      "rfind",     "index",     "rindex",     "count",      "join",     "format",  "isdigit",
      "isnumeric", "isdecimal", "isalpha",    "isalnum",    "isspace",  "islower", "isupper"};
  static const char* kDict[] = {"get", "items", "keys", "values", "copy"};
  static const char* kDictUnsafe[] = {"pop", "popitem", "update", "setdefault", "clear"};
  static const char* kList[] = {"count", "index"};
  static const char* kListUnsafe[] = {"append", "extend", "insert", "pop",
                                      "remove", "clear",  "sort",   "reverse"};
  auto in = [&](const auto& table) {
    for (const char* n : table) {
      if (name == n) return true;
    }
    return false;
  };
  if (obj.is_string() && in(kStr)) {
    std::string s = obj.str();
    return Value::func("str." + name, [s, name](CallArgs& a) { return string_method(s, name, a); });
  }
  if (obj.is_dict() && !obj.is_namespace()) {
    if (in(kDict)) {
      return Value::func("dict." + name,
                         [obj, name](CallArgs& a) { return dict_method(obj, name, a); });
    }
    if (in(kDictUnsafe)) return unsafe(obj, name);
  }
  if (obj.is_list()) {
    if (in(kList)) {
      return Value::func("list." + name,
                         [obj, name](CallArgs& a) { return list_method(obj, name, a); });
    }
    if (in(kListUnsafe)) return unsafe(obj, name);
  }
  return Value();
}

std::string ascii_lower(const std::string& s) {
  std::string out = s;
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
std::string ascii_upper(const std::string& s) {
  std::string out = s;
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}
std::string py_capitalize(const std::string& s) {
  std::string out = ascii_lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}
std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    unsigned char u = static_cast<unsigned char>(c);
    bool cased = std::isalpha(u) != 0;
    if (cased) c = static_cast<char>(prev_cased ? std::tolower(u) : std::toupper(u));
    prev_cased = cased;
  }
  return out;
}
std::string jinja_title(const std::string& s) {
  // Words begin after runs of [-\s({\[<]; each word: first char upper, rest lower.
  std::string out;
  bool word_start = true;
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    bool sep = c == '-' || std::isspace(u) || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      out += c;
      word_start = true;
    } else {
      out += static_cast<char>(word_start ? std::toupper(u) : std::tolower(u));
      word_start = false;
    }
  }
  return out;
}

std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (chars) {
    auto chs = utf8_chars(*chars);
    auto match_at = [&](size_t i) -> size_t {
      for (const auto& c : chs) {
        if (s.compare(i, c.size(), c) == 0) return c.size();
      }
      return 0;
    };
    auto match_before = [&](size_t end) -> size_t {
      for (const auto& c : chs) {
        if (c.size() <= end && s.compare(end - c.size(), c.size(), c) == 0) return c.size();
      }
      return 0;
    };
    while (left && b < e && match_at(b)) b += match_at(b);
    while (right && e > b && match_before(e)) e -= match_before(e);
  } else {
    while (left && b < e && space_len(s, b)) b += space_len(s, b);
    while (right && e > b && space_len_before(s, e)) e -= space_len_before(s, e);
  }
  return s.substr(b, e - b);
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count) {
  std::string out;
  if (old.empty()) {
    auto chars = utf8_chars(s);
    int64_t n = 0;
    for (const auto& c : chars) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      out += c;
    }
    if (count < 0 || n < count) out += repl;
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t p = s.find(old, start);
    if (p == std::string::npos) break;
    out += s.substr(start, p - start) + repl;
    start = p + old.size();
    ++n;
  }
  return out + s.substr(start);
}

std::string percent_format(const std::string& f, const ValueList& args) {
  std::string out;
  size_t next_arg = 0;
  auto take = [&]() -> const Value& {
    if (next_arg >= args.size()) fail("not enough arguments for format string");
    return args[next_arg++];
  };
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out += f[i];
      continue;
    }
    size_t j = i + 1;
    std::string spec = "%";
    while (j < f.size() && std::strchr("-+ 0#", f[j])) spec += f[j++];
    while (j < f.size() && std::isdigit(static_cast<unsigned char>(f[j]))) spec += f[j++];
    if (j < f.size() && f[j] == '.') {
      spec += f[j++];
      while (j < f.size() && std::isdigit(static_cast<unsigned char>(f[j]))) spec += f[j++];
    }
    if (j >= f.size()) fail("incomplete format");
    char conv = f[j];
    i = j;
    if (spec.size() > 8) fail("format spec too long");  // width/precision < 10^6
    char buf[512];
    if (conv == '%') {
      out += '%';
    } else if (conv == 's' || conv == 'r') {
      const Value& v = take();
      std::string text = conv == 's' ? v.to_str() : v.repr();
      std::snprintf(buf, sizeof(buf), (spec + "s").c_str(), "");  // validates flags
      int width = std::atoi(spec.c_str() + spec.find_first_not_of("%-+ 0#"));
      size_t len = utf8_length(text);
      std::string pad = width > 0 && static_cast<size_t>(width) > len
                            ? std::string(static_cast<size_t>(width) - len, ' ')
                            : "";
      out += spec.find('-') != std::string::npos ? text + pad : pad + text;
    } else if (std::strchr("dixXoc", conv)) {
      const Value& v = take();
      if (!v.is_number())
        fail(fmt::format("%{} format: a real number is required, not {}", conv, v.type_name()));
      long long n = v.is_float() ? static_cast<long long>(v.as_float())
                                 : (v.is_bool() ? v.as_bool() : v.as_int());
      std::string cs = spec + (conv == 'i'   ? std::string("lld")
                               : conv == 'c' ? "c"
                                             : std::string("ll") + conv);
      std::snprintf(buf, sizeof(buf), cs.c_str(), n);
      out += buf;
    } else if (std::strchr("fFeEgG", conv)) {
      const Value& v = take();
      if (!v.is_number()) fail(fmt::format("must be real number, not {}", v.type_name()));
      std::snprintf(buf, sizeof(buf), (spec + conv).c_str(), v.to_double());
      out += buf;
    } else {
      fail(fmt::format("unsupported format character '{}'", conv));
    }
  }
  if (next_arg < args.size()) fail("not all arguments converted during string formatting");
  return out;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t brk = 0;
    if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') {
      brk = 2;
    } else if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) {
      brk = 1;
    } else if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x85) {
      brk = 2;
    } else if (c == 0xe2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
               (static_cast<unsigned char>(s[i + 2]) == 0xa8 ||
                static_cast<unsigned char>(s[i + 2]) == 0xa9)) {
      brk = 3;
    }
    if (brk) {
      out.push_back(cur);
      cur.clear();
      i += brk - 1;
    } else {
      cur += s[i];
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

}  // namespace kiln::chat::jinja
