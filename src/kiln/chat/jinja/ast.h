// The parsed template: expression and statement nodes. Nodes carry their template line so
// that evaluation errors can name it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/chat/jinja/value.h"

namespace kiln::chat::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  Literal,   // value
  Name,      // name
  List,      // args
  Tuple,     // args
  Dict,      // args: key, value, key, value...
  Attr,      // target.name
  Index,     // target[args[0]]
  Slice,     // target[a:b:c]: args[0..2], null where absent
  Call,      // target(args), arg_names ("" for positional)
  Filter,    // target|name(args); target null inside {% filter %}
  Test,      // target is [not] name(args); negated
  Unary,     // op ("-", "+", "not") args[0]
  Binary,    // op args[0] args[1]; "and"/"or" short-circuit
  Compare,   // args[0] ops[0] args[1] ops[1] args[2]...
  CondExpr,  // args[0] if args[1] else args[2] (args[2] may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;
  std::string name;  // name, attribute, filter/test name, or operator
  ExprPtr target;
  std::vector<ExprPtr> args;
  std::vector<std::string> arg_names;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

enum class StmtKind {
  Text,         // text
  Output,       // {{ expr }}
  If,           // conds[i] -> bodies[i]; else_body
  For,          // targets in expr [if cond]; body; else_body
  Set,          // targets = expr, or ns.attr = expr (attr non-empty)
  SetBlock,     // targets[0] = rendered body, through filters
  Macro,        // name(params = defaults) body
  CallBlock,    // {% call(params) expr %} body
  FilterBlock,  // {% filter f %} body
  Break,
  Continue,
  Scope,  // a body run in place: {% generation %}
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  std::string attr;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // per param, null where none
  std::vector<ExprPtr> filters;   // Filter exprs with a null target
  bool uses_varargs = false;      // macro body names `varargs`: extra positionals go there
  bool uses_kwargs = false;       // macro body names `kwargs`: extra keywords go there
  bool recursive = false;         // `{% for ... recursive %}`
};

}  // namespace kiln::chat::jinja
