// The tree-walking evaluator. Errors are JinjaError exceptions inside this file and the
// builtins; Template::render catches them and returns a kiln::Error, so nothing escapes.
#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "kiln/chat/jinja/ast.h"
#include "kiln/chat/jinja/builtins.h"
#include "kiln/chat/jinja/jinja.h"
#include "kiln/chat/jinja/lexer.h"
#include "kiln/chat/jinja/methods.h"
#include "kiln/chat/jinja/parser.h"

namespace kiln::chat::jinja {
namespace {

// Scopes: the template's top level, each for-loop iteration and each macro call have a frame.
struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
};

enum class Flow { Normal, Break, Continue };

constexpr int kMaxDepth = 100;  // macro recursion guard (bounds the C++ stack)

class Interp {
 public:
  Interp(const RenderContext& ctx, std::string* out)
      : now_(ctx.now),
        out_(out),
        max_steps_(ctx.max_steps),
        max_output_bytes_(ctx.max_output_bytes) {
    globals_ = std::make_shared<Frame>();
    for (const auto& [k, v] : ctx.vars) globals_->vars[k] = v;
    frame_ = std::make_shared<Frame>();
    frame_->parent = globals_;
  }

  Flow exec(const Body& body) {
    for (const auto& s : body) {
      Flow f = exec(*s);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  int line() const { return line_; }

 private:
  void step() {
    if (++num_steps_ > max_steps_) {
      fail(fmt::format("template rendering exceeded {} steps (endless or exponential loop?)",
                       max_steps_));
    }
  }

  Flow exec(const Stmt& s) {
    line_ = s.line;
    step();
    if (out_->size() > max_output_bytes_) {
      fail(fmt::format("rendered text exceeds {} bytes", max_output_bytes_));
    }
    switch (s.kind) {
      case StmtKind::Text:
        *out_ += s.text;
        return Flow::Normal;
      case StmtKind::Output:
        *out_ += eval(*s.expr).to_str();
        return Flow::Normal;
      case StmtKind::If:
        for (size_t i = 0; i < s.conds.size(); ++i) {
          if (eval(*s.conds[i]).truthy()) return exec(s.bodies[i]);
        }
        return exec(s.else_body);
      case StmtKind::For:
        exec_for(s);
        return Flow::Normal;
      case StmtKind::Set:
        exec_set(s);
        return Flow::Normal;
      case StmtKind::SetBlock: {
        Value v = apply_filters(s, capture(s.body));
        frame_->vars[s.targets[0]] = v;
        return Flow::Normal;
      }
      case StmtKind::Macro:
        frame_->vars[s.text] = make_macro(s, frame_, s.text);
        return Flow::Normal;
      case StmtKind::CallBlock:
        exec_call_block(s);
        return Flow::Normal;
      case StmtKind::FilterBlock:
        *out_ += apply_filters(s, capture(s.body)).to_str();
        return Flow::Normal;
      case StmtKind::Break:
        return Flow::Break;
      case StmtKind::Continue:
        return Flow::Continue;
      case StmtKind::Scope:
        return exec(s.body);
    }
    return Flow::Normal;
  }

  Value apply_filters(const Stmt& s, Value v) {
    for (const auto& f : s.filters) {
      CallArgs args = eval_args(*f);
      v = apply_filter(f->name, v, args);
    }
    return v;
  }

  std::string capture(const Body& body) {
    std::string buf;
    std::string* saved = out_;
    out_ = &buf;
    Flow f = exec(body);
    out_ = saved;
    if (f != Flow::Normal) fail("break/continue outside of a loop");
    return buf;
  }

  void exec_for(const Stmt& s) { run_loop(s, eval(*s.expr), frame_, 0); }

  void bind_targets(const Stmt& s, Frame& f, const Value& item) {
    if (s.targets.size() == 1) {
      f.vars[s.targets[0]] = item;
      return;
    }
    ValueList parts = iterate(item);
    if (parts.size() != s.targets.size()) {
      fail(fmt::format("cannot unpack {} values into {} loop variables", parts.size(),
                       s.targets.size()));
    }
    for (size_t i = 0; i < parts.size(); ++i) f.vars[s.targets[i]] = parts[i];
  }

  // One run of a for loop over `iterable` (depth0 > 0: a recursive loop(...) call).
  // `outer` is taken by value: callers pass frame_, which this function reassigns.
  void run_loop(const Stmt& s, const Value& iterable, std::shared_ptr<Frame> outer, int depth0) {
    ValueList items = iterate(iterable);
    if (s.cond) {
      ValueList kept;
      for (const auto& item : items) {
        frame_ = std::make_shared<Frame>();
        frame_->parent = outer;
        bind_targets(s, *frame_, item);
        bool keep = eval(*s.cond).truthy();
        frame_ = outer;
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    size_t n = items.size();
    // loop.changed(...) compares with the arguments of its previous call in this loop.
    auto changed_state = std::make_shared<std::optional<Value>>();
    for (size_t i = 0; i < n; ++i) {
      step();
      frame_ = std::make_shared<Frame>();
      frame_->parent = outer;
      bind_targets(s, *frame_, items[i]);
      Value loop = make_loop(items, i, changed_state);
      loop.dict_ref().set("depth", Value(depth0 + 1));
      loop.dict_ref().set("depth0", Value(depth0));
      if (s.recursive) loop = make_recursive_loop(s, loop, outer, depth0);
      frame_->vars["loop"] = loop;
      Flow f = exec(s.body);
      frame_ = outer;
      if (f == Flow::Break) break;
    }
    frame_ = outer;
    if (n == 0) exec(s.else_body);
  }

  // In a `recursive` loop, `loop` is also callable: loop(children) renders the body over
  // children one level deeper and returns the text.
  Value make_recursive_loop(const Stmt& s, const Value& attrs, const std::shared_ptr<Frame>& outer,
                            int depth0) {
    const Stmt* stmt = &s;
    keep_alive_.push_back(outer);
    std::weak_ptr<Frame> weak = outer;
    Value fn = Value::func("loop", [this, stmt, weak, depth0](CallArgs& a) -> Value {
      if (a.pos.size() != 1) fail("loop() takes exactly one argument");
      if (++depth_ > kMaxDepth) fail("recursive loop nested too deeply");
      std::string buf;
      std::string* saved_out = out_;
      std::shared_ptr<Frame> saved_frame = frame_;
      out_ = &buf;
      run_loop(*stmt, a.pos[0], weak.lock(), depth0 + 1);
      out_ = saved_out;
      frame_ = saved_frame;
      --depth_;
      return Value(std::move(buf));
    });
    fn.function().set_attrs(attrs);
    return fn;
  }

  static Value make_loop(const ValueList& items, size_t i,
                         const std::shared_ptr<std::optional<Value>>& changed_state) {
    int64_t n = static_cast<int64_t>(items.size());
    int64_t k = static_cast<int64_t>(i);
    Value loop = Value::dict();
    auto& d = loop.dict_ref();
    d.set("index", Value(k + 1));
    d.set("index0", Value(k));
    d.set("revindex", Value(n - k));
    d.set("revindex0", Value(n - k - 1));
    d.set("first", Value(k == 0));
    d.set("last", Value(k == n - 1));
    d.set("length", Value(n));
    d.set("depth", Value(1));
    d.set("depth0", Value(0));
    d.set("previtem", k > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
    d.set("nextitem", k + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
    d.set("changed", Value::func("loop.changed", [changed_state](CallArgs& a) -> Value {
            Value args = Value::list(a.pos, true);
            if (*changed_state && py_equal(**changed_state, args)) return Value(false);
            *changed_state = args;
            return Value(true);
          }));
    d.set("cycle", Value::func("loop.cycle", [k](CallArgs& a) -> Value {
            if (a.pos.empty()) fail("no items for cycling given");
            return a.pos[static_cast<size_t>(k) % a.pos.size()];
          }));
    return loop;
  }

  void exec_set(const Stmt& s) {
    Value v = eval(*s.expr);
    if (!s.attr.empty()) {
      Value ns = lookup(s.targets[0]);
      if (!ns.is_namespace()) {
        fail(fmt::format("cannot assign attribute on non-namespace object '{}'", s.targets[0]));
      }
      ns.dict_ref().set(Value(s.attr), v);
      return;
    }
    if (s.targets.size() == 1) {
      frame_->vars[s.targets[0]] = v;
      return;
    }
    ValueList parts = iterate(v);
    if (parts.size() != s.targets.size()) {
      fail(fmt::format("cannot unpack {} values into {} names", parts.size(), s.targets.size()));
    }
    for (size_t i = 0; i < parts.size(); ++i) frame_->vars[s.targets[i]] = parts[i];
  }

  // The closure holds its frame weakly (a frame holding the macro would otherwise be a
  // reference cycle); keep_alive_ holds the frames until the render ends.
  Value make_macro(const Stmt& s, const std::shared_ptr<Frame>& def_frame, std::string name) {
    const Stmt* stmt = &s;
    keep_alive_.push_back(def_frame);
    std::weak_ptr<Frame> weak = def_frame;
    return Value::func(name, [this, stmt, weak, name](CallArgs& a) -> Value {
      return call_macro(*stmt, weak.lock(), name, a);
    });
  }

  Value call_macro(const Stmt& s, const std::shared_ptr<Frame>& def_frame, const std::string& name,
                   CallArgs& a) {
    if (++depth_ > kMaxDepth) fail(fmt::format("macro '{}' nested too deeply", name));
    auto f = std::make_shared<Frame>();
    f->parent = def_frame;
    if (a.pos.size() > s.params.size() && !s.uses_varargs) {
      fail(fmt::format("macro '{}' takes not more than {} argument(s)", name, s.params.size()));
    }
    std::vector<bool> bound(s.params.size(), false);
    ValueList varargs;
    for (size_t i = 0; i < a.pos.size(); ++i) {
      if (i >= s.params.size()) {
        varargs.push_back(a.pos[i]);
        continue;
      }
      f->vars[s.params[i]] = a.pos[i];
      bound[i] = true;
    }
    Value kwargs = Value::dict();
    for (auto& [k, v] : a.kw) {
      auto it = std::find(s.params.begin(), s.params.end(), k);
      if (it != s.params.end()) {
        size_t i = static_cast<size_t>(it - s.params.begin());
        if (bound[i])
          fail(fmt::format("macro '{}' got multiple values for argument '{}'", name, k));
        f->vars[k] = v;
        bound[i] = true;
      } else if (k == "caller") {
        f->vars[k] = v;
      } else if (s.uses_kwargs) {
        kwargs.dict_ref().set(Value(k), v);
      } else {
        fail(fmt::format("macro '{}' takes no keyword argument '{}'", name, k));
      }
    }
    if (s.uses_varargs) f->vars["varargs"] = Value::list(std::move(varargs), true);
    if (s.uses_kwargs) f->vars["kwargs"] = kwargs;
    std::shared_ptr<Frame> saved = frame_;
    frame_ = f;
    for (size_t i = 0; i < s.params.size(); ++i) {
      if (bound[i]) continue;
      f->vars[s.params[i]] =
          s.defaults[i]
              ? eval(*s.defaults[i])
              : Value::undefined(fmt::format("parameter '{}' was not provided", s.params[i]));
    }
    int saved_line = line_;
    std::string text = capture(s.body);
    frame_ = saved;
    line_ = saved_line;
    --depth_;
    return Value(std::move(text));
  }

  void exec_call_block(const Stmt& s) {
    const Expr& call = *s.expr;
    Value callee = eval(*call.target);
    CallArgs args = eval_args(call);
    args.kw.emplace_back("caller", make_macro(s, frame_, "caller"));
    *out_ += call_value(callee, args).to_str();
  }

  Value lookup(const std::string& name) const {
    for (const Frame* f = frame_.get(); f; f = f->parent.get()) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return it->second;
    }
    Value g = make_global(name, now_);
    if (!g.is_undefined()) return g;
    return Value::undefined(fmt::format("'{}' is undefined", name));
  }

  CallArgs eval_args(const Expr& e) {
    CallArgs a;
    a.line = e.line;
    for (size_t i = 0; i < e.args.size(); ++i) {
      Value v = eval(*e.args[i]);
      if (e.arg_names[i].empty()) {
        a.pos.push_back(std::move(v));
      } else {
        a.kw.emplace_back(e.arg_names[i], std::move(v));
      }
    }
    return a;
  }

 public:
  Value eval(const Expr& e) {
    line_ = e.line;
    step();
    switch (e.kind) {
      case ExprKind::Literal:
        return e.value;
      case ExprKind::Name:
        return lookup(e.name);
      case ExprKind::List:
      case ExprKind::Tuple: {
        ValueList items;
        for (const auto& a : e.args) items.push_back(eval(*a));
        return Value::list(std::move(items), e.kind == ExprKind::Tuple);
      }
      case ExprKind::Dict: {
        Value d = Value::dict();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i]);
          d.dict_ref().set(k, eval(*e.args[i + 1]));
        }
        return d;
      }
      case ExprKind::Attr:
        return get_attr(eval(*e.target), e.name);
      case ExprKind::Index: {
        Value obj = eval(*e.target);
        return get_item(obj, eval(*e.args[0]));
      }
      case ExprKind::Slice:
        return eval_slice(e);
      case ExprKind::Call: {
        Value callee = eval(*e.target);
        CallArgs args = eval_args(e);
        line_ = e.line;
        return call_value(callee, args);
      }
      case ExprKind::Filter: {
        Value input = eval(*e.target);
        CallArgs args = eval_args(e);
        line_ = e.line;
        return apply_filter(e.name, input, args);
      }
      case ExprKind::Test: {
        Value input = eval(*e.target);
        CallArgs args = eval_args(e);
        line_ = e.line;
        return Value(apply_test(e.name, input, args) != e.negated);
      }
      case ExprKind::Unary:
        return eval_unary(e);
      case ExprKind::Binary:
        return eval_binary(e);
      case ExprKind::Compare:
        return eval_compare(e);
      case ExprKind::CondExpr:
        if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("the inline if evaluated false");
    }
    fail("unknown expression");
  }

 private:
  Value eval_slice(const Expr& e) {
    Value obj = eval(*e.target);
    check_defined(obj);
    int64_t bounds[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int i = 0; i < 3; ++i) {
      if (!e.args[i]) continue;
      Value v = eval(*e.args[i]);
      if (v.is_none()) continue;
      if (!v.is_int()) fail("slice indices must be integers or None");
      bounds[i] = v.as_int();
      given[i] = true;
    }
    int64_t step = bounds[2];
    if (step == 0) fail("slice step cannot be zero");
    bool is_str = obj.is_string();
    std::vector<std::string> chars;
    if (is_str) {
      chars = utf8_chars(obj.str());
    } else if (!obj.is_list()) {
      fail(fmt::format("'{}' object is not subscriptable", obj.type_name()));
    }
    int64_t n =
        is_str ? static_cast<int64_t>(chars.size()) : static_cast<int64_t>(obj.items().size());
    auto clamp = [&](int64_t v, bool is_given, int64_t def) {
      if (!is_given) return def;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    int64_t start = clamp(bounds[0], given[0], step > 0 ? 0 : n - 1);
    int64_t stop = clamp(bounds[1], given[1], step > 0 ? n : -1);
    std::string s;
    ValueList items;
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      if (is_str) {
        s += chars[static_cast<size_t>(i)];
      } else {
        items.push_back(obj.items()[static_cast<size_t>(i)]);
      }
      if (__builtin_add_overflow(i, step, &i)) break;
    }
    if (is_str) return Value(std::move(s));
    return Value::list(std::move(items), obj.is_tuple());
  }

  Value eval_unary(const Expr& e) {
    Value v = eval(*e.args[0]);
    if (e.name == "not") return Value(!v.truthy());
    check_defined(v);
    if (!v.is_number())
      fail(fmt::format("bad operand type for unary {}: '{}'", e.name, v.type_name()));
    if (e.name == "+") return v.is_bool() ? Value(static_cast<int64_t>(v.as_bool())) : v;
    if (v.is_float()) return Value(-v.as_float());
    int64_t i = v.is_bool() ? v.as_bool() : v.as_int();
    if (i == INT64_MIN) fail("integer overflow");
    return Value(-i);
  }

  Value eval_binary(const Expr& e) {
    if (e.name == "and") {
      Value l = eval(*e.args[0]);
      return l.truthy() ? eval(*e.args[1]) : l;
    }
    if (e.name == "or") {
      Value l = eval(*e.args[0]);
      return l.truthy() ? l : eval(*e.args[1]);
    }
    Value l = eval(*e.args[0]);
    Value r = eval(*e.args[1]);
    line_ = e.line;
    Value out = e.name == "~" ? Value(l.to_str() + r.to_str()) : arith(e.name, l, r);
    // Building big strings or lists costs work in proportion to their size (a loop doing
    // `x = x + [i]` is quadratic).
    if (out.is_list()) num_steps_ += static_cast<int64_t>(out.items().size() / 8);
    if (out.is_string()) num_steps_ += static_cast<int64_t>(out.str().size() / 64);
    return out;
  }

  static int64_t as_i(const Value& v) { return v.is_bool() ? v.as_bool() : v.as_int(); }

  static Value repeat(const Value& seq, int64_t n) {
    if (n < 0) n = 0;
    size_t unit = seq.is_string() ? seq.str().size() : seq.items().size();
    if (unit == 0) n = 0;  // '' * 10**18 is '' (and must not loop 10**18 times)
    size_t total = 0;
    if (__builtin_mul_overflow(unit, static_cast<size_t>(n), &total) || total > (64u << 20)) {
      fail("repetition result too large");
    }
    if (seq.is_string()) {
      std::string s;
      for (int64_t i = 0; i < n; ++i) s += seq.str();
      return seq.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s));
    }
    ValueList items;
    for (int64_t i = 0; i < n; ++i)
      items.insert(items.end(), seq.items().begin(), seq.items().end());
    return Value::list(std::move(items), seq.is_tuple());
  }

  static Value arith(const std::string& op, const Value& l, const Value& r) {
    check_defined(l);
    check_defined(r);
    bool ints = l.is_number() && r.is_number() && !l.is_float() && !r.is_float();
    bool nums = l.is_number() && r.is_number();
    auto bad = [&]() -> Value {
      fail(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, l.type_name(),
                       r.type_name()));
    };
    if (op == "+") {
      if (ints) {
        int64_t out;
        if (__builtin_add_overflow(as_i(l), as_i(r), &out)) fail("integer overflow");
        return Value(out);
      }
      if (nums) return Value(l.to_double() + r.to_double());
      if (l.is_markup() || r.is_markup()) {
        if (!l.is_string() || !r.is_string()) return bad();
        return Value::markup((l.is_markup() ? l.str() : html_escape(l.str())) +
                             (r.is_markup() ? r.str() : html_escape(r.str())));
      }
      if (l.is_string() && r.is_string()) return Value(l.str() + r.str());
      if (l.is_list() && r.is_list() && l.is_tuple() == r.is_tuple()) {
        ValueList items = l.items();
        items.insert(items.end(), r.items().begin(), r.items().end());
        return Value::list(std::move(items), l.is_tuple());
      }
      return bad();
    }
    if (op == "-") {
      if (ints) {
        int64_t out;
        if (__builtin_sub_overflow(as_i(l), as_i(r), &out)) fail("integer overflow");
        return Value(out);
      }
      if (nums) return Value(l.to_double() - r.to_double());
      return bad();
    }
    if (op == "*") {
      if (ints) {
        int64_t out;
        if (__builtin_mul_overflow(as_i(l), as_i(r), &out)) fail("integer overflow");
        return Value(out);
      }
      if (nums) return Value(l.to_double() * r.to_double());
      if ((l.is_string() || l.is_list()) && r.is_number() && !r.is_float())
        return repeat(l, as_i(r));
      if ((r.is_string() || r.is_list()) && l.is_number() && !l.is_float())
        return repeat(r, as_i(l));
      return bad();
    }
    if (!nums) {
      if (op == "%" && l.is_string()) {
        ValueList args = r.is_tuple() ? r.items() : ValueList{r};
        return Value(percent_format(l.str(), args));
      }
      return bad();
    }
    if (op == "/") {
      if (r.to_double() == 0) fail("division by zero");
      return Value(l.to_double() / r.to_double());
    }
    if (op == "//" || op == "%") {
      if (r.to_double() == 0)
        fail(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
      if (ints) {
        int64_t a = as_i(l), b = as_i(r);
        if (a == INT64_MIN && b == -1) fail("integer overflow");
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {
          q -= 1;
          m += b;
        }
        return op == "//" ? Value(q) : Value(m);
      }
      // Python's float_divmod.
      double a = l.to_double(), b = r.to_double();
      double mod = std::fmod(a, b);
      double div = (a - mod) / b;
      if (mod != 0) {
        if ((b < 0) != (mod < 0)) {
          mod += b;
          div -= 1.0;
        }
      } else {
        mod = std::copysign(0.0, b);
      }
      if (op == "%") return Value(mod);
      double floordiv = std::copysign(0.0, a / b);
      if (div != 0) {
        floordiv = std::floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
      }
      return Value(floordiv);
    }
    if (op == "**") {
      if (ints && as_i(r) >= 0) {
        // Exponentiation by squaring; Python ints are unbounded, ours fail on overflow.
        int64_t base = as_i(l), exp = as_i(r), out = 1;
        while (exp > 0) {
          if ((exp & 1) && __builtin_mul_overflow(out, base, &out)) fail("integer overflow");
          exp >>= 1;
          if (exp > 0 && __builtin_mul_overflow(base, base, &base)) fail("integer overflow");
        }
        return Value(out);
      }
      return Value(std::pow(l.to_double(), r.to_double()));
    }
    return bad();
  }

  static bool contains(const Value& container, const Value& item) {
    if (container.is_string()) {
      if (!item.is_string()) {
        fail(
            fmt::format("'in <string>' requires string as left operand, not {}", item.type_name()));
      }
      return container.str().find(item.str()) != std::string::npos;
    }
    if (container.is_list()) {
      for (const auto& v : container.items()) {
        if (py_equal(v, item)) return true;
      }
      return false;
    }
    if (container.is_dict()) return container.dict_ref().find(item) != nullptr;
    if (container.is_undefined()) return false;
    fail(fmt::format("argument of type '{}' is not iterable", container.type_name()));
  }

  Value eval_compare(const Expr& e) {
    Value l = eval(*e.args[0]);
    for (size_t i = 0; i < e.ops.size(); ++i) {
      Value r = eval(*e.args[i + 1]);
      line_ = e.line;
      const std::string& op = e.ops[i];
      bool ok;
      if (op == "==") {
        ok = py_equal(l, r);
      } else if (op == "!=") {
        ok = !py_equal(l, r);
      } else if (op == "in") {
        ok = contains(r, l);
      } else if (op == "notin") {
        ok = !contains(r, l);
      } else {
        check_defined(l);
        check_defined(r);
        if (op == "<")
          ok = py_less(l, r);
        else if (op == ">")
          ok = py_less(r, l);
        else if (op == "<=")
          ok = !py_less(r, l);
        else
          ok = !py_less(l, r);
      }
      if (!ok) return Value(false);
      l = std::move(r);
    }
    return Value(true);
  }

  std::tm now_;
  std::string* out_;
  std::shared_ptr<Frame> globals_;
  std::shared_ptr<Frame> frame_;
  int line_ = 0;
  int depth_ = 0;
  std::vector<std::shared_ptr<Frame>> keep_alive_;
  int64_t max_steps_;
  size_t max_output_bytes_;
  int64_t num_steps_ = 0;
};

}  // namespace

Expected<Template> Template::parse(const std::string& source) {
  KILN_TRY(auto tokens, lex(source));
  KILN_TRY(auto body, jinja::parse(tokens));
  Template t;
  t.body_ = std::make_shared<Body>(std::move(body));
  return t;
}

Expected<std::string> Template::render(const RenderContext& ctx) const {
  std::string out;
  Interp interp(ctx, &out);
  try {
    interp.exec(*body_);
  } catch (const JinjaError& e) {
    int line = e.line ? e.line : interp.line();
    if (e.raised) return err("template raised an exception at line {}: {}", line, e.message);
    return err("template line {}: {}", line, e.message);
  }
  return out;
}

Expected<std::string> render(const std::string& source, const RenderContext& ctx) {
  KILN_TRY(auto t, Template::parse(source));
  return t.render(ctx);
}

}  // namespace kiln::chat::jinja
