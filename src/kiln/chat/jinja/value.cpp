#include "kiln/chat/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

namespace kiln::chat::jinja {

void fail(std::string message) {
  throw JinjaError{std::move(message)};
}

namespace {
// Bounds the recursion of repr/json/equality over values nested by a template (a loop can
// build [[[...]]] as deep as it iterates).
constexpr int kMaxValueDepth = 512;
thread_local int g_value_depth = 0;
struct DepthGuard {
  DepthGuard() {
    if (++g_value_depth > kMaxValueDepth) {
      --g_value_depth;
      fail("value nested too deeply");
    }
  }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
  ~DepthGuard() { --g_value_depth; }
};
}  // namespace

void Function::set_attrs(const Value& d) {
  attrs_holder = std::make_shared<Value>(d);
}

Value Value::undefined(std::string hint) {
  Value v;
  v.s_ = std::move(hint);
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}
Value::Value(bool b) : kind_(Kind::Bool), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::Int), i_(i) {}
Value::Value(double f) : kind_(Kind::Float), f_(f) {}
Value::Value(std::string s) : kind_(Kind::String), s_(std::move(s)) {}

Value Value::list(ValueList items, bool is_tuple) {
  Value v;
  v.kind_ = Kind::List;
  v.is_tuple_ = is_tuple;
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::iterator(ValueList items) {
  Value v = list(std::move(items));
  v.is_iterator_ = true;
  return v;
}
Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.is_markup_ = true;
  return v;
}
Value Value::dict() {
  Value v;
  v.kind_ = Kind::Dict;
  v.dict_ = std::make_shared<ValueDict>();
  return v;
}
Value Value::namespace_() {
  Value v = dict();
  v.is_namespace_ = true;
  return v;
}
Value Value::func(std::string name, std::function<Value(CallArgs&)> fn) {
  Value v;
  v.kind_ = Kind::Func;
  v.fn_ = std::make_shared<Function>(Function{std::move(name), std::move(fn)});
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = dict();
      for (auto it = j.begin(); it != j.end(); ++it) {
        d.dict_->entries.emplace_back(Value(it.key()), from_json(it.value()));
      }
      return d;
    }
    default:
      return none();
  }
}

double Value::to_double() const {
  if (kind_ == Kind::Float) return f_;
  if (kind_ == Kind::Int) return static_cast<double>(i_);
  if (kind_ == Kind::Bool) return b_ ? 1.0 : 0.0;
  return 0.0;
}

const void* Value::identity() const {
  if (list_) return list_.get();
  if (dict_) return dict_.get();
  if (fn_) return fn_.get();
  return nullptr;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return b_;
    case Kind::Int:
      return i_ != 0;
    case Kind::Float:
      return f_ != 0.0;
    case Kind::String:
      return !s_.empty();
    case Kind::List:
      return is_iterator_ || !list_->empty();
    case Kind::Dict:
      return is_namespace_ || !dict_->entries.empty();
    case Kind::Func:
      return true;
  }
  return false;
}

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  int exp10 = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  std::string out = neg ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." +
             digits.substr(static_cast<size_t>(decpt));
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    int e = decpt - 1;
    out += fmt::format("e{}{:02d}", e < 0 ? '-' : '+', std::abs(e));
  }
  return out;
}

static std::string string_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == quote || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

std::string Value::repr() const {
  DepthGuard guard;
  if (is_iterator_) fail("unsupported construct: printing an iterator (Python prints its address)");
  switch (kind_) {
    case Kind::String:
      return string_repr(s_);
    case Kind::List: {
      std::string out = is_tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].repr();
      }
      if (is_tuple_ && list_->size() == 1) out += ",";
      out += is_tuple_ ? ")" : "]";
      return out;
    }
    case Kind::Dict: {
      if (is_namespace_) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : dict_->entries) {
        if (!first) out += ", ";
        first = false;
        out += k.repr() + ": " + v.repr();
      }
      return out + "}";
    }
    default:
      return to_str();
  }
}

std::string Value::to_str() const {
  switch (kind_) {
    case Kind::Undefined:
      return "";
    case Kind::None:
      return "None";
    case Kind::Bool:
      return b_ ? "True" : "False";
    case Kind::Int:
      return std::to_string(i_);
    case Kind::Float:
      return float_repr(f_);
    case Kind::String:
      return s_;
    case Kind::List:
    case Kind::Dict:
      return repr();
    case Kind::Func:
      fail(fmt::format("cannot print the callable '{}'", fn_->name));
  }
  return "";
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      return is_iterator_ ? "generator" : is_tuple_ ? "tuple" : "list";
    case Kind::Dict:
      return is_namespace_ ? "Namespace" : "dict";
    case Kind::Func:
      return "function";
  }
  return "?";
}

nlohmann::ordered_json Value::to_json() const {
  switch (kind_) {
    case Kind::None:
      return nullptr;
    case Kind::Bool:
      return b_;
    case Kind::Int:
      return i_;
    case Kind::Float:
      return f_;
    case Kind::String:
      return s_;
    case Kind::List: {
      auto arr = nlohmann::ordered_json::array();
      for (const auto& e : *list_) arr.push_back(e.to_json());
      return arr;
    }
    case Kind::Dict: {
      auto obj = nlohmann::ordered_json::object();
      for (const auto& [k, v] : dict_->entries) obj[k.to_str()] = v.to_json();
      return obj;
    }
    default:
      fail(fmt::format("Object of type {} is not JSON serializable", type_name()));
  }
}

const Value* ValueDict::find(const Value& key) const {
  for (const auto& e : entries) {
    if (py_equal(e.first, key)) return &e.second;
  }
  return nullptr;
}
const Value* ValueDict::find(const std::string& key) const {
  for (const auto& e : entries) {
    if (e.first.is_string() && e.first.str() == key) return &e.second;
  }
  return nullptr;
}
void ValueDict::set(const Value& key, Value value) {
  for (auto& e : entries) {
    if (py_equal(e.first, key)) {
      e.second = std::move(value);
      return;
    }
  }
  entries.emplace_back(key, std::move(value));
}
bool ValueDict::erase(const Value& key) {
  for (auto it = entries.begin(); it != entries.end(); ++it) {
    if (py_equal(it->first, key)) {
      entries.erase(it);
      return true;
    }
  }
  return false;
}

bool py_equal(const Value& a, const Value& b) {
  DepthGuard guard;
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) {
      int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
      int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
      return x == y;
    }
    return a.to_double() == b.to_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return true;
    case Value::Kind::String:
      return a.str() == b.str();
    case Value::Kind::List: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!py_equal(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::Dict: {
      if (a.is_namespace() || b.is_namespace()) return a.identity() == b.identity();
      const auto& x = a.dict_ref().entries;
      const auto& y = b.dict_ref().entries;
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* o = b.dict_ref().find(k);
        if (!o || !py_equal(v, *o)) return false;
      }
      return true;
    }
    case Value::Kind::Func:
      return a.identity() == b.identity();
    default:
      return false;
  }
}

bool py_less(const Value& a, const Value& b) {
  DepthGuard guard;
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) {
      int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
      int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
      return x < y;
    }
    return a.to_double() < b.to_double();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 order = code points
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!py_equal(x[i], y[i])) return py_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  fail(fmt::format("'<' not supported between instances of '{}' and '{}'", a.type_name(),
                   b.type_name()));
}

// \uXXXX escapes (surrogate pairs above the BMP) for json.dumps(ensure_ascii=True).
static void json_ascii_escape(std::string& out, const std::string& ch) {
  unsigned char c0 = static_cast<unsigned char>(ch[0]);
  uint32_t cp = ch.size() == 2 ? (c0 & 0x1fu) : ch.size() == 3 ? (c0 & 0x0fu) : (c0 & 0x07u);
  for (size_t i = 1; i < ch.size(); ++i)
    cp = (cp << 6) | (static_cast<unsigned char>(ch[i]) & 0x3fu);
  if (ch.size() < 2) cp = c0;
  if (cp >= 0x10000) {
    cp -= 0x10000;
    out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
  } else {
    out += fmt::format("\\u{:04x}", cp);
  }
}

static void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  if (ensure_ascii) {
    std::string plain;
    out += '"';
    for (const auto& ch : utf8_chars(s)) {
      if (static_cast<unsigned char>(ch[0]) >= 0x80) {
        json_ascii_escape(out, ch);
      } else {
        std::string one;
        json_string(one, ch, false);
        out += one.substr(1, one.size() - 2);
      }
    }
    out += '"';
    return;
  }
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

struct JsonStyle {
  int indent;  // < 0: one line
  std::string item_sep;
  std::string key_sep;
  bool sort_keys;
  bool ensure_ascii;
};

static void json_write(std::string& out, const Value& v, const JsonStyle& st, int depth) {
  DepthGuard guard;
  const int indent = st.indent;
  auto newline = [&](int d) {
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::None:
      out += "null";
      return;
    case Value::Kind::Bool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::Float: {
      double f = v.as_float();
      if (std::isnan(f)) {
        out += "NaN";
      } else if (std::isinf(f)) {
        out += f > 0 ? "Infinity" : "-Infinity";
      } else {
        out += float_repr(f);
      }
      return;
    }
    case Value::Kind::String:
      json_string(out, v.str(), st.ensure_ascii);
      return;
    case Value::Kind::List: {
      if (v.is_iterator()) break;
      const auto& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += st.item_sep;
        if (indent >= 0) newline(depth + 1);
        json_write(out, items[i], st, depth + 1);
      }
      if (indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::Dict: {
      if (v.is_namespace()) break;
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& e : v.dict_ref().entries) entries.push_back(&e);
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (st.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return py_less(a->first, b->first); });
      }
      out += '{';
      bool first = true;
      for (const auto* e : entries) {
        if (!first) out += st.item_sep;
        first = false;
        if (indent >= 0) newline(depth + 1);
        const Value& k = e->first;
        if (k.is_string()) {
          json_string(out, k.str(), st.ensure_ascii);
        } else if (k.is_bool() || k.is_none() || k.is_number()) {
          std::string ks;
          json_write(ks, k, JsonStyle{-1, "", "", false, false}, 0);
          json_string(out, ks, false);
        } else {
          fail(fmt::format("keys must be str, int, float, bool or None, not {}", k.type_name()));
        }
        out += st.key_sep;
        json_write(out, e->second, st, depth + 1);
      }
      if (indent >= 0) newline(depth);
      out += '}';
      return;
    }
    default:
      break;
  }
  fail(fmt::format("Object of type {} is not JSON serializable", v.type_name()));
}

std::string to_json_text(const Value& v, int indent, const std::string& item_sep,
                         const std::string& key_sep, bool sort_keys, bool ensure_ascii) {
  std::string out;
  json_write(out, v, JsonStyle{indent, item_sep, key_sep, sort_keys, ensure_ascii}, 0);
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

static size_t utf8_seq_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xe) return 3;
  if ((c >> 3) == 0x1e) return 4;
  return 1;  // invalid byte: treat as one unit
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = std::min(utf8_seq_len(static_cast<unsigned char>(s[i])), s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) {
    if ((c & 0xc0) != 0x80) ++n;
  }
  return n;
}

}  // namespace kiln::chat::jinja
