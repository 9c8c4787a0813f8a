#include "kiln/chat/jinja/parser.h"

#include <charconv>
#include <cstdlib>
#include <initializer_list>

#include <fmt/format.h>

namespace kiln::chat::jinja {
namespace {

[[noreturn]] void syntax_error(int line, std::string msg) {
  throw JinjaError{std::move(msg), line};
}

constexpr int kMaxNesting = 128;  // expression and block nesting (bounds parser recursion)

class Parser {
 public:
  explicit Parser(const std::vector<Token>& toks) : toks_(toks) {}

  Body parse_all() {
    Body body = parse_body({});
    if (cur().type != Tok::Eof) syntax_error(cur().line, "unexpected tag");
    return body;
  }

 private:
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t n = 1) const { return toks_[std::min(pos_ + n, toks_.size() - 1)]; }
  void next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().value == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op))
      syntax_error(cur().line, fmt::format("expected '{}', got '{}'", op, describe()));
  }
  std::string expect_name() {
    if (cur().type != Tok::Name)
      syntax_error(cur().line, fmt::format("expected a name, got '{}'", describe()));
    std::string n = cur().value;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) {
      syntax_error(cur().line, fmt::format("expected end of tag '%}}', got '{}'", describe()));
    }
    next();
  }
  std::string describe() const {
    switch (cur().type) {
      case Tok::Eof:
        return "end of template";
      case Tok::BlockEnd:
        return "%}";
      case Tok::VarEnd:
        return "}}";
      default:
        return cur().value;
    }
  }

  static ExprPtr make(ExprKind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // ---- statements ----

  // Parses until a block tag whose keyword is in `ends` (left current on that keyword).
  Body parse_body(std::initializer_list<const char*> ends) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (ends.size() == 0) return body;
        std::string want;
        for (const char* e : ends) want += std::string(want.empty() ? "'" : " or '") + e + "'";
        syntax_error(t.line, fmt::format("unexpected end of template, expected {}", want));
      }
      if (t.type == Tok::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Text;
        s->line = t.line;
        s->text = t.value;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Tok::VarBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Output;
        s->line = t.line;
        s->expr = parse_tuple();
        if (cur().type != Tok::VarEnd)
          syntax_error(cur().line, fmt::format("expected '}}}}', got '{}'", describe()));
        next();
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        const Token& kw = peek();
        if (kw.type != Tok::Name) syntax_error(kw.line, "expected a tag name");
        for (const char* e : ends) {
          if (kw.value == e) {
            next();
            return body;
          }
        }
        next();
        body.push_back(parse_statement());
      } else {
        syntax_error(t.line, fmt::format("unexpected '{}'", describe()));
      }
    }
  }

  struct DepthGuard {
    DepthGuard(int& d, int line) : d_(d) {
      if (++d_ > kMaxNesting) syntax_error(line, "template nested too deeply");
    }
    ~DepthGuard() { --d_; }
    int& d_;
  };

  std::unique_ptr<Stmt> parse_statement() {
    int line = cur().line;
    DepthGuard guard(nesting_, line);
    std::string tag = expect_name();
    auto s = std::make_unique<Stmt>();
    s->line = line;
    if (tag == "if") return parse_if(std::move(s));
    if (tag == "for") return parse_for(std::move(s));
    if (tag == "set") return parse_set(std::move(s));
    if (tag == "macro") return parse_macro(std::move(s));
    if (tag == "call") return parse_call_block(std::move(s));
    if (tag == "filter") {
      s->kind = StmtKind::FilterBlock;
      s->filters = parse_filter_chain();
      expect_block_end();
      s->body = parse_body({"endfilter"});
      end_tag();
      return s;
    }
    if (tag == "generation") {
      s->kind = StmtKind::Scope;
      expect_block_end();
      s->body = parse_body({"endgeneration"});
      end_tag();
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) syntax_error(line, fmt::format("'{}' outside of a loop", tag));
      s->kind = tag == "break" ? StmtKind::Break : StmtKind::Continue;
      expect_block_end();
      return s;
    }
    syntax_error(line, fmt::format("unsupported tag '{}'", tag));
  }

  void end_tag() {
    next();  // the end keyword
    expect_block_end();
  }

  std::unique_ptr<Stmt> parse_if(std::unique_ptr<Stmt> s) {
    s->kind = StmtKind::If;
    s->conds.push_back(parse_expression());
    expect_block_end();
    s->bodies.push_back(parse_body({"elif", "else", "endif"}));
    while (true) {
      std::string kw = cur().value;
      next();
      if (kw == "elif") {
        s->conds.push_back(parse_expression());
        expect_block_end();
        s->bodies.push_back(parse_body({"elif", "else", "endif"}));
      } else if (kw == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"});
        end_tag();
        return s;
      } else {
        expect_block_end();
        return s;
      }
    }
  }

  std::vector<std::string> parse_target_names() {
    std::vector<std::string> names;
    bool paren = skip_op("(");
    names.push_back(expect_name());
    while (skip_op(",")) {
      if (cur().type != Tok::Name || is_name("in")) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  std::unique_ptr<Stmt> parse_for(std::unique_ptr<Stmt> s) {
    s->kind = StmtKind::For;
    s->targets = parse_target_names();
    if (!skip_name("in")) syntax_error(cur().line, "expected 'in' in for loop");
    s->expr = parse_tuple(/*with_condexpr=*/false);
    if (skip_name("if")) s->cond = parse_expression();
    s->recursive = skip_name("recursive");
    expect_block_end();
    ++loop_depth_;
    s->body = parse_body({"else", "endfor"});
    --loop_depth_;
    if (cur().value == "else") {
      next();
      expect_block_end();
      s->else_body = parse_body({"endfor"});
    }
    end_tag();
    return s;
  }

  std::unique_ptr<Stmt> parse_set(std::unique_ptr<Stmt> s) {
    if (cur().type == Tok::Name && peek().type == Tok::Op && peek().value == ".") {
      s->targets.push_back(expect_name());
      next();
      s->attr = expect_name();
    } else {
      s->targets = parse_target_names();
    }
    if (skip_op("=")) {
      s->kind = StmtKind::Set;
      s->expr = parse_tuple();
      expect_block_end();
      return s;
    }
    if (!s->attr.empty() || s->targets.size() != 1) syntax_error(s->line, "bad block set target");
    s->kind = StmtKind::SetBlock;
    if (is_op("|")) s->filters = parse_filter_chain();
    expect_block_end();
    s->body = parse_body({"endset"});
    end_tag();
    return s;
  }

  void parse_params(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      s.params.push_back(expect_name());
      s.defaults.push_back(skip_op("=") ? parse_expression() : nullptr);
    }
    next();
  }

  std::unique_ptr<Stmt> parse_macro(std::unique_ptr<Stmt> s) {
    s->kind = StmtKind::Macro;
    s->text = expect_name();
    parse_params(*s);
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    size_t body_start = pos_;
    s->body = parse_body({"endmacro"});
    loop_depth_ = saved;
    for (size_t i = body_start; i < pos_; ++i) {
      if (toks_[i].type != Tok::Name) continue;
      s->uses_varargs = s->uses_varargs || toks_[i].value == "varargs";
      s->uses_kwargs = s->uses_kwargs || toks_[i].value == "kwargs";
    }
    end_tag();
    return s;
  }

  std::unique_ptr<Stmt> parse_call_block(std::unique_ptr<Stmt> s) {
    s->kind = StmtKind::CallBlock;
    if (is_op("(")) parse_params(*s);
    s->expr = parse_expression();
    if (s->expr->kind != ExprKind::Call) syntax_error(s->line, "expected a call in {% call %}");
    expect_block_end();
    s->body = parse_body({"endcall"});
    end_tag();
    return s;
  }

  // `name(args)|name2...` with no input (the first `|` is optional).
  std::vector<ExprPtr> parse_filter_chain() {
    std::vector<ExprPtr> chain;
    skip_op("|");
    do {
      auto f = make(ExprKind::Filter, cur().line);
      f->name = parse_dotted_name();
      if (is_op("(")) parse_call_args(*f);
      chain.push_back(std::move(f));
    } while (skip_op("|"));
    return chain;
  }

  // ---- expressions ----

  ExprPtr parse_tuple(bool with_condexpr = true) {
    int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        is_tuple = true;
        if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || is_op(")") || is_name("if"))
          break;
      }
      items.push_back(with_condexpr ? parse_expression() : parse_or());
    }
    if (!is_tuple) return std::move(items[0]);
    auto t = make(ExprKind::Tuple, line);
    t->args = std::move(items);
    return t;
  }

  ExprPtr parse_expression() {
    DepthGuard guard(nesting_, cur().line);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      int line = cur().line;
      next();
      auto c = make(ExprKind::CondExpr, line);
      c->args.push_back(std::move(e));
      c->args.push_back(parse_or());
      c->args.push_back(skip_name("else") ? parse_expression() : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r, int line) {
    auto b = make(ExprKind::Binary, line);
    b->name = std::move(op);
    b->args.push_back(std::move(l));
    b->args.push_back(std::move(r));
    return b;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      int line = cur().line;
      next();
      e = binary("or", std::move(e), parse_and(), line);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      int line = cur().line;
      next();
      e = binary("and", std::move(e), parse_not(), line);
    }
    return e;
  }
  ExprPtr parse_not() {
    DepthGuard guard(nesting_, cur().line);
    if (is_name("not")) {
      auto u = make(ExprKind::Unary, cur().line);
      next();
      u->name = "not";
      u->args.push_back(parse_not());
      return u;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr e = parse_math1();
    std::unique_ptr<Expr> cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">="))) {
        op = cur().value;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == Tok::Name && peek().value == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::Compare, line);
        cmp->args.push_back(std::move(e));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().value;
      int line = cur().line;
      next();
      e = binary(op, std::move(e), parse_concat(), line);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      int line = cur().line;
      next();
      e = binary("~", std::move(e), parse_math2(), line);
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().value;
      int line = cur().line;
      next();
      e = binary(op, std::move(e), parse_pow(), line);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary();
    while (is_op("**")) {
      int line = cur().line;
      next();
      e = binary("**", std::move(e), parse_unary(), line);
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter = true) {
    DepthGuard guard(nesting_, cur().line);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      auto u = make(ExprKind::Unary, cur().line);
      u->name = cur().value;
      next();
      u->args.push_back(parse_unary(false));
      e = std::move(u);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    if (t.type == Tok::Name) {
      auto e = make(ExprKind::Literal, line);
      const std::string& n = t.value;
      if (n == "true" || n == "True") {
        e->value = Value(true);
      } else if (n == "false" || n == "False") {
        e->value = Value(false);
      } else if (n == "none" || n == "None") {
        e->value = Value::none();
      } else {
        e->kind = ExprKind::Name;
        e->name = n;
      }
      next();
      return e;
    }
    if (t.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) {
        s += cur().value;
        next();
      }
      auto e = make(ExprKind::Literal, line);
      e->value = Value(std::move(s));
      return e;
    }
    if (t.type == Tok::Int || t.type == Tok::Float) {
      auto e = make(ExprKind::Literal, line);
      if (t.type == Tok::Int) {
        int64_t v = 0;
        auto res = std::from_chars(t.value.data(), t.value.data() + t.value.size(), v);
        if (res.ec != std::errc())
          syntax_error(line, fmt::format("integer '{}' out of range", t.value));
        e->value = Value(v);
      } else {
        e->value = Value(std::strtod(t.value.c_str(), nullptr));
      }
      next();
      return e;
    }
    if (is_op("(")) {
      next();
      if (skip_op(")")) {
        auto e = make(ExprKind::Tuple, line);
        return e;
      }
      ExprPtr e = parse_tuple();
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto e = make(ExprKind::List, line);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(parse_expression());
      }
      next();
      return e;
    }
    if (is_op("{")) {
      next();
      auto e = make(ExprKind::Dict, line);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        e->args.push_back(parse_expression());
        expect_op(":");
        e->args.push_back(parse_expression());
      }
      next();
      return e;
    }
    syntax_error(line, fmt::format("unexpected '{}'", describe()));
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (!call.args.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**"))
        syntax_error(cur().line, "unsupported construct '*args' in a call");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().value == "=") {
        call.arg_names.push_back(cur().value);
        next();
        next();
      } else {
        call.arg_names.push_back("");
      }
      call.args.push_back(parse_expression());
    }
    next();
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      int line = cur().line;
      if (is_op(".")) {
        next();
        auto a = make(ExprKind::Attr, line);
        if (cur().type == Tok::Int) {
          a->kind = ExprKind::Index;
          auto idx = make(ExprKind::Literal, line);
          idx->value = Value(static_cast<int64_t>(std::atoll(cur().value.c_str())));
          next();
          a->args.push_back(std::move(idx));
        } else {
          a->name = expect_name();
        }
        a->target = std::move(e);
        e = std::move(a);
      } else if (is_op("[")) {
        next();
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        auto c = make(ExprKind::Call, line);
        c->target = std::move(e);
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, int line) {
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (!is_op("]")) {
      if (is_op(":")) {
        is_slice = true;
        if (++part > 2) syntax_error(line, "bad slice");
        next();
        continue;
      }
      if (parts[part]) syntax_error(line, "bad subscript");
      parts[part] = parse_expression();
      if (!is_slice && is_op(",")) syntax_error(line, "unsupported construct: tuple subscript");
    }
    next();
    auto e = make(is_slice ? ExprKind::Slice : ExprKind::Index, line);
    e->target = std::move(target);
    if (is_slice) {
      for (auto& p : parts) e->args.push_back(std::move(p));
    } else {
      if (!parts[0]) syntax_error(line, "empty subscript");
      e->args.push_back(std::move(parts[0]));
    }
    return e;
  }

  std::string parse_dotted_name() {
    std::string n = expect_name();
    while (is_op(".") && peek().type == Tok::Name) {
      next();
      n += "." + expect_name();
    }
    return n;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      int line = cur().line;
      if (is_op("|")) {
        next();
        auto f = make(ExprKind::Filter, line);
        f->name = parse_dotted_name();
        if (is_op("(")) parse_call_args(*f);
        f->target = std::move(e);
        e = parse_postfix(std::move(f));
      } else if (is_name("is")) {
        next();
        auto t = make(ExprKind::Test, line);
        t->negated = skip_name("not");
        t->name = parse_dotted_name();
        if (is_op("(")) {
          parse_call_args(*t);
        } else if (starts_test_arg()) {
          t->arg_names.push_back("");
          t->args.push_back(parse_primary_postfix());
        }
        t->target = std::move(e);
        e = std::move(t);
      } else {
        return e;
      }
    }
  }
  // `x is divisibleby 3`, `x is sameas none`: one bare argument.
  bool starts_test_arg() const {
    const Token& t = cur();
    if (t.type == Tok::String || t.type == Tok::Int || t.type == Tok::Float) return true;
    if (t.type == Tok::Op)
      return t.value == "[" || t.value == "{" || t.value == "(" || t.value == "-";
    if (t.type == Tok::Name) {
      static const char* kStop[] = {"else", "or", "and", "is", "in", "if", "not", "recursive"};
      for (const char* s : kStop) {
        if (t.value == s) return false;
      }
      return true;
    }
    return false;
  }
  ExprPtr parse_primary_postfix() {
    if (is_op("-")) return parse_unary(false);
    return parse_postfix(parse_primary());
  }

  const std::vector<Token>& toks_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int nesting_ = 0;
};

}  // namespace

Expected<Body> parse(const std::vector<Token>& tokens) {
  try {
    Parser p(tokens);
    return p.parse_all();
  } catch (const JinjaError& e) {
    return err("template line {}: syntax error: {}", e.line, e.message);
  }
}

}  // namespace kiln::chat::jinja
