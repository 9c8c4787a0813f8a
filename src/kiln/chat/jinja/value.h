// The value model of the Jinja evaluator: Python objects as chat templates observe them.
// Lists, dicts and namespaces are shared by reference (as in Python); strings are UTF-8.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::chat::jinja {

class Value;
using ValueList = std::vector<Value>;

// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  int line = 0;
};

struct Function {
  std::string name;
  std::function<Value(CallArgs&)> fn;
  std::shared_ptr<Value> attrs_holder;  // a dict of attributes (a recursive loop's `loop`)
  void set_attrs(const Value& d);
  const Value* attrs() const { return attrs_holder.get(); }
};

struct ValueDict;

// Raised inside the evaluator; converted to kiln::Error at the API boundary (jinja.h).
struct JinjaError {
  std::string message;
  int line = 0;         // 0: not yet known; the evaluator fills in the current line
  bool raised = false;  // from raise_exception(): message is the template's own text
};

[[noreturn]] void fail(std::string message);

class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Func };

  Value() = default;  // undefined
  static Value undefined(std::string hint = {});
  static Value none();
  Value(bool b);                                    // NOLINT: implicit
  Value(int64_t i);                                 // NOLINT
  Value(int i) : Value(static_cast<int64_t>(i)) {}  // NOLINT
  Value(double f);                                  // NOLINT
  Value(std::string s);                             // NOLINT
  Value(const char* s) : Value(std::string(s)) {}   // NOLINT
  static Value list(ValueList items = {}, bool is_tuple = false);
  // What Jinja2 filters such as select/map/unique return: a Python iterator, always truthy,
  // without len(), and not printable (Python would print an object address).
  static Value iterator(ValueList items);
  // markupsafe.Markup (from |safe and |escape): `+` with a plain string HTML-escapes that
  // string. Jinja2 without autoescape prints it unchanged.
  static Value markup(std::string s);
  static Value dict();
  static Value namespace_();
  static Value func(std::string name, std::function<Value(CallArgs&)> fn);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const {
    return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool;
  }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_tuple() const { return kind_ == Kind::List && is_tuple_; }
  bool is_iterator() const { return kind_ == Kind::List && is_iterator_; }
  bool is_markup() const { return kind_ == Kind::String && is_markup_; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_namespace() const { return kind_ == Kind::Dict && is_namespace_; }
  bool is_func() const { return kind_ == Kind::Func; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_float() const { return f_; }
  double to_double() const;                      // int, float or bool
  const std::string& str() const { return s_; }  // string value, or the undefined's hint
  ValueList& items() const { return *list_; }
  ValueDict& dict_ref() const { return *dict_; }
  Function& function() const { return *fn_; }
  const void* identity() const;  // for `is sameas` on containers

  bool truthy() const;
  std::string to_str() const;              // Python str()
  std::string repr() const;                // Python repr()
  std::string type_name() const;           // Python type name, for messages
  nlohmann::ordered_json to_json() const;  // fails on undefined and callables

 private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false;
  bool is_tuple_ = false;
  bool is_namespace_ = false;
  bool is_iterator_ = false;
  bool is_markup_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<Function> fn_;
};

// Insertion-ordered dict; keys are compared with Python equality. Chat dicts are small, so
// lookup is a linear scan.
struct ValueDict {
  std::vector<std::pair<Value, Value>> entries;
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
  void set(const Value& key, Value value);
  bool erase(const Value& key);
};

bool py_equal(const Value& a, const Value& b);
// Python ordering (<); fails on types Python cannot order.
bool py_less(const Value& a, const Value& b);
// Python repr of a float ("1.0", "1e-05", "0.30000000000000004").
std::string float_repr(double f);
// json.dumps(v, ensure_ascii=False, indent, separators, sort_keys) as Python writes it.
std::string to_json_text(const Value& v, int indent, const std::string& item_sep,
                         const std::string& key_sep, bool sort_keys, bool ensure_ascii = false);

// markupsafe.escape of a plain string.
std::string html_escape(const std::string& s);

// UTF-8 helpers: Python strings index by code point.
std::vector<std::string> utf8_chars(const std::string& s);
size_t utf8_length(const std::string& s);

}  // namespace kiln::chat::jinja
