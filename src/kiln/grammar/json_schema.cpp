#include "kiln/grammar/json_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "kiln/grammar/regex.h"

namespace kiln::grammar {

namespace {

using Json = nlohmann::ordered_json;

// Keywords that never constrain a value.
const std::set<std::string> kAnnotations = {"title",
                                            "description",
                                            "default",
                                            "examples",
                                            "$schema",
                                            "$id",
                                            "$comment",
                                            "deprecated",
                                            "readOnly",
                                            "writeOnly",
                                            "contentMediaType",
                                            "$anchor",
                                            "contentEncoding",
                                            "discriminator",
                                            "example",
                                            "externalDocs",
                                            "xml",
                                            "$defs",
                                            "definitions",
                                            "strict"};

// Formats: the body of the JSON string (ASCII, nothing to escape).
const std::map<std::string, std::string> kFormats = {
    {"date",
     "[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-"
     "(0[1-9]|1[0-9]|2[0-8]))"},
    {"time",
     "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-"
     "9])"},
    {"date-time",
     "[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-"
     "(0[1-9]|1[0-9]|2[0-8]))T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01]"
     "[0-9]|2[0-3]):[0-5][0-9])"},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
    {"email", "[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\\.[A-Za-z0-9-]{1,63}){1,8}"},
    {"uri", "[a-zA-Z][a-zA-Z0-9+.-]{0,15}://[A-Za-z0-9._~:/?#@!$&'()*+,;=%-]{1,2000}"},
    {"ipv4",
     "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9]"
     ")){3}"},
};

std::string escape_pointer(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

// Decimal strings of the integers in [lo, hi] (no leading zeros); hi == nullopt: no bound.
Expr digits_same_length(const std::string& lo, const std::string& hi) {
  if (lo.empty()) return empty();
  if (lo[0] == hi[0]) {
    return seq({literal(lo.substr(0, 1)), digits_same_length(lo.substr(1), hi.substr(1))});
  }
  const size_t rest = lo.size() - 1;
  auto digit = [](char a, char b) {
    ByteSet s;
    s.add_range(static_cast<uint8_t>(a), static_cast<uint8_t>(b));
    return byte_set(s);
  };
  auto any_digits = [&](size_t n) { return repeat(digit('0', '9'), int32_t(n), int32_t(n)); };
  if (lo.substr(1) == std::string(rest, '0') && hi.substr(1) == std::string(rest, '9')) {
    return seq({digit(lo[0], hi[0]), any_digits(rest)});
  }
  std::vector<Expr> alts;
  alts.push_back(
      seq({literal(lo.substr(0, 1)), digits_same_length(lo.substr(1), std::string(rest, '9'))}));
  if (hi[0] - lo[0] > 1) alts.push_back(seq({digit(lo[0] + 1, hi[0] - 1), any_digits(rest)}));
  alts.push_back(
      seq({literal(hi.substr(0, 1)), digits_same_length(std::string(rest, '0'), hi.substr(1))}));
  return alt(std::move(alts));
}

// Unbounded integers and the parts of numbers have at most this many digits (so every value
// the grammar admits is a finite double; llama.cpp limits them the same way).
constexpr size_t kMaxDigits = 16;

Expr uint_range(uint64_t lo, std::optional<uint64_t> hi) {
  std::vector<Expr> alts;
  const std::string los = std::to_string(lo);
  const size_t max_len = hi ? std::to_string(*hi).size() : los.size();
  if (hi && *hi < lo) return codepoints({});
  for (size_t len = los.size(); len <= max_len; ++len) {
    std::string a = len == los.size() ? los : "1" + std::string(len - 1, '0');
    std::string b = std::string(len, '9');
    if (hi && len == max_len) b = std::to_string(*hi);
    alts.push_back(digits_same_length(a, b));
  }
  if (!hi) {  // any longer number
    ByteSet nz, d;
    nz.add_range('1', '9');
    d.add_range('0', '9');
    if (los.size() < kMaxDigits) {
      alts.push_back(
          seq({byte_set(nz), repeat(byte_set(d), int32_t(los.size()), int32_t(kMaxDigits - 1))}));
    }
  }
  return alt(std::move(alts));
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const JsonSchemaOptions& opt) : root_(root), opt_(opt) {}

  Expected<Grammar> compile() {
    const int32_t r = b_.rule("root");
    auto e = schema(root_, "#");
    if (!e) return err("json schema: {}", error_);
    Expr one = seq({ws(), literal(opt_.prefix), std::move(*e), literal(opt_.suffix), ws()});
    if (opt_.max_repeats <= 1) {
      b_.define(r, std::move(one));
    } else {
      const int32_t item = b_.rule("item");
      b_.define(item, std::move(one));
      b_.define(r, seq({ref(item), repeat(seq({literal(opt_.separator), ref(item)}), 0,
                                          opt_.max_repeats - 1)}));
    }
    return b_.build(r);
  }

  // root_ holds the tools under "x-kiln-tools" (kJson: each tool's call object; else its
  // parameters) beside their merged $defs; names[i] is tool i's name.
  Expected<Grammar> tool_calls(const ToolCallSyntax& syn, const std::vector<std::string>& names) {
    const Json& items = root_.at("x-kiln-tools");
    std::vector<Expr> bodies;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string ptr = "#/x-kiln-tools/" + std::to_string(i);
      Opt e;
      switch (syn.body) {
        case ToolCallSyntax::Body::kJson:
          e = schema(items[i], ptr);
          break;
        case ToolCallSyntax::Body::kNamed:
          if (auto args = schema(items[i], ptr)) {
            e = seq({framing(syn, syn.before_name), literal(names[i]), framing(syn, syn.after_name),
                     std::move(*args)});
          }
          break;
        case ToolCallSyntax::Body::kXml:
          e = xml_call(items[i], ptr, names[i]);
          break;
      }
      if (!e) return err("tool calls: tools[{}] ('{}') parameters: {}", i, names[i], error_);
      bodies.push_back(std::move(*e));
    }
    const int32_t call = b_.rule("call");
    b_.define(call, seq({ws(), framing(syn, syn.call_open), alt(std::move(bodies)),
                         framing(syn, syn.call_close), ws()}));
    std::vector<Expr> opens;
    for (const std::string& o : syn.opens) opens.push_back(framing(syn, o));
    if (opens.empty()) opens.push_back(empty());
    std::vector<Expr> parts;
    parts.push_back(alt(std::move(opens)));
    parts.push_back(ref(call));
    if (syn.max_calls > 1)
      parts.push_back(repeat(seq({framing(syn, syn.separator), ref(call)}), 0, syn.max_calls - 1));
    parts.push_back(framing(syn, syn.close));
    const int32_t r = b_.rule("root");
    b_.define(r, seq(std::move(parts)));
    return b_.build(r);
  }

  // A framing string of a tool-call format: its text, each token marker in it a token terminal.
  static Expr framing(const ToolCallSyntax& syn, std::string_view text) {
    std::vector<Expr> parts;
    size_t pos = 0;
    while (pos < text.size()) {
      // The marker that starts first (the longest of those starting there).
      size_t best = std::string_view::npos;
      const std::string* marker = nullptr;
      for (const std::string& m : syn.token_markers) {
        if (m.empty()) continue;
        const size_t at = text.find(m, pos);
        if (at < best ||
            (at == best && at != std::string_view::npos && m.size() > marker->size())) {
          best = at;
          marker = &m;
        }
      }
      if (best == std::string_view::npos) break;
      parts.push_back(literal(text.substr(pos, best - pos)));
      parts.push_back(token(*marker));
      pos = best + marker->size();
    }
    parts.push_back(literal(text.substr(pos)));
    return seq(std::move(parts));
  }

  Grammar any_object() {
    const int32_t r = b_.rule("root");
    b_.define(r, seq({ws(), ref(object_rule()), ws()}));
    auto g = b_.build(r);
    return std::move(g).value();
  }

 private:
  using Opt = std::optional<Expr>;

  Opt fail(std::string msg) {
    if (error_.empty()) error_ = std::move(msg);
    return std::nullopt;
  }

  Expr ws() {
    if (opt_.compact) return empty();
    if (ws_rule_ < 0) {
      ws_rule_ = b_.rule("ws");
      ByteSet s;
      s.add(' ');
      s.add('\t');
      s.add('\n');
      b_.define(ws_rule_, repeat(byte_set(s), 0, opt_.max_whitespace));
    }
    return ref(ws_rule_);
  }
  Expr punct(const char* p) { return seq({ws(), literal(p), ws()}); }

  // String characters: anything but '"', '\' and controls, or an escape (no surrogate \u).
  Expr string_char() {
    if (char_rule_ < 0) {
      char_rule_ = b_.rule("char");
      ByteSet hex, esc, h0, hd, hd2;
      for (char c : std::string("0123456789abcdefABCDEF")) hex.add(static_cast<uint8_t>(c));
      for (char c : std::string("\"\\/bfnrt")) esc.add(static_cast<uint8_t>(c));
      for (char c : std::string("0123456789abcABCefEF")) h0.add(static_cast<uint8_t>(c));
      hd.add('d');
      hd.add('D');
      hd2.add_range('0', '7');
      Expr h = byte_set(hex);
      Expr u = alt({seq({byte_set(h0), repeat(h, 3, 3)}),
                    seq({byte_set(hd), byte_set(hd2), repeat(h, 2, 2)})});
      b_.define(
          char_rule_,
          alt({opt_.escape_lt ? codepoints({{0, 0x1F}, {'"', '"'}, {'<', '<'}, {'\\', '\\'}}, true)
                              : codepoints({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, true),
               seq({literal("\\"), alt({byte_set(esc), seq({literal("u"), u})})})}));
    }
    return ref(char_rule_);
  }

  Expr any_string() {
    if (string_rule_ < 0) {
      string_rule_ = b_.rule("string");
      b_.define(string_rule_, seq({literal("\""), star(string_char()), literal("\"")}));
    }
    return ref(string_rule_);
  }

  Expr any_number() {
    if (number_rule_ < 0) {
      number_rule_ = b_.rule("number");
      ByteSet d, e, sign;
      d.add_range('0', '9');
      e.add('e');
      e.add('E');
      sign.add('-');
      sign.add('+');
      b_.define(number_rule_,
                seq({opt(literal("-")), uint_range(0, std::nullopt),
                     opt(seq({literal("."), repeat(byte_set(d), 1, kMaxDigits)})),
                     opt(seq({byte_set(e), opt(byte_set(sign)), repeat(byte_set(d), 1, 2)}))}));
    }
    return ref(number_rule_);
  }

  int32_t value_rule() {
    if (value_rule_ < 0) {
      value_rule_ = b_.rule("value");
      const int32_t arr = b_.rule("array");
      b_.define(value_rule_, alt({ref(object_rule()), ref(arr), any_string(), any_number(),
                                  literal("true"), literal("false"), literal("null")}));
      b_.define(arr, seq({literal("["), ws(),
                          opt(seq({ref(value_rule_), star(seq({punct(","), ref(value_rule_)}))})),
                          ws(), literal("]")}));
    }
    return value_rule_;
  }

  int32_t object_rule() {
    if (object_rule_ < 0) {
      object_rule_ = b_.rule("object");
      const int32_t v = value_rule();
      Expr kv = seq({any_string(), punct(":"), ref(v)});
      b_.define(object_rule_, seq({literal("{"), ws(), opt(seq({kv, star(seq({punct(","), kv}))})),
                                   ws(), literal("}")}));
    }
    return object_rule_;
  }

  const Json* resolve(const std::string& refstr) {
    if (refstr.empty() || refstr[0] != '#') return nullptr;
    const Json* cur = &root_;
    size_t pos = 1;
    while (pos < refstr.size()) {
      if (refstr[pos] != '/') return nullptr;
      size_t next = refstr.find('/', pos + 1);
      if (next == std::string::npos) next = refstr.size();
      std::string key;
      const std::string raw = refstr.substr(pos + 1, next - pos - 1);
      for (size_t i = 0; i < raw.size(); ++i) {
        if (raw[i] == '~' && i + 1 < raw.size()) {
          key += raw[i + 1] == '1' ? '/' : '~';
          ++i;
        } else {
          key += raw[i];
        }
      }
      if (cur->is_object()) {
        auto it = cur->find(key);
        if (it == cur->end()) return nullptr;
        cur = &*it;
      } else if (cur->is_array()) {
        size_t idx = 0;
        for (char c : key) {
          if (c < '0' || c > '9') return nullptr;
          idx = idx * 10 + static_cast<size_t>(c - '0');
        }
        if (idx >= cur->size()) return nullptr;
        cur = &(*cur)[idx];
      } else {
        return nullptr;
      }
      pos = next;
    }
    return cur;
  }

  Opt ref_expr(const std::string& refstr, const std::string& ptr) {
    auto it = ref_rules_.find(refstr);
    if (it != ref_rules_.end()) return ref(it->second);
    const Json* target = resolve(refstr);
    if (!target) return fail("cannot resolve $ref '" + refstr + "' at " + ptr);
    std::string hint = "ref";
    const size_t slash = refstr.rfind('/');
    if (slash != std::string::npos && slash + 1 < refstr.size()) hint = refstr.substr(slash + 1);
    for (char& c : hint) {
      if (!isalnum(static_cast<unsigned char>(c))) c = '-';
    }
    const int32_t r = b_.fresh_rule(hint);
    ref_rules_.emplace(refstr, r);
    auto e = schema(*target, refstr);
    if (!e) return std::nullopt;
    b_.define(r, std::move(*e));
    return ref(r);
  }

  static bool constrains(const std::string& key) { return kAnnotations.count(key) == 0; }

  Opt schema(const Json& s, const std::string& ptr) {
    // Subschemas nest through the JSON and through chains of distinct $refs (a flat $defs of
    // 20,000 refs each to the next recursed 20,000 deep): bounded like the other front ends.
    struct DepthGuard {
      int& depth;
      ~DepthGuard() { --depth; }
    } guard{++depth_};
    if (depth_ > kMaxNesting) {
      return fail(
          fmt::format("schema at {} nested deeper than {} levels (through subschemas and "
                      "$refs)",
                      ptr, kMaxNesting));
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return ref(value_rule());
      return fail("schema 'false' at " + ptr + " allows no value");
    }
    if (!s.is_object()) return fail("schema at " + ptr + " is not an object");
    static const std::set<std::string> kKnown = {"type",
                                                 "properties",
                                                 "required",
                                                 "additionalProperties",
                                                 "items",
                                                 "prefixItems",
                                                 "minItems",
                                                 "maxItems",
                                                 "enum",
                                                 "const",
                                                 "anyOf",
                                                 "oneOf",
                                                 "allOf",
                                                 "$ref",
                                                 "pattern",
                                                 "format",
                                                 "minLength",
                                                 "maxLength",
                                                 "minimum",
                                                 "maximum",
                                                 "exclusiveMinimum",
                                                 "exclusiveMaximum",
                                                 "nullable",
                                                 "uniqueItems",
                                                 "minProperties"};
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (kKnown.count(k) || kAnnotations.count(k)) continue;
      return fail("unsupported keyword '" + k + "' at " + ptr + "/" + escape_pointer(k));
    }
    if (auto u = s.find("uniqueItems"); u != s.end() && !(u->is_boolean() && !u->get<bool>())) {
      return fail("unsupported keyword 'uniqueItems' (true) at " + ptr + "/uniqueItems");
    }
    if (auto m = s.find("minProperties");
        m != s.end() && !(m->is_number_integer() && m->get<int64_t>() <= 0)) {
      return fail("unsupported keyword 'minProperties' at " + ptr + "/minProperties");
    }
    const bool nullable =
        s.contains("nullable") && s["nullable"].is_boolean() && s["nullable"].get<bool>();
    auto with_null = [&](Opt e) -> Opt {
      if (!e || !nullable) return e;
      return alt({std::move(*e), literal("null")});
    };

    if (s.contains("$ref")) {
      for (auto it = s.begin(); it != s.end(); ++it) {
        if (it.key() != "$ref" && it.key() != "nullable" && constrains(it.key())) {
          return fail("keyword '" + it.key() + "' beside $ref at " + ptr +
                      " is not supported (use allOf)");
        }
      }
      if (!s["$ref"].is_string()) return fail("$ref at " + ptr + " is not a string");
      return with_null(ref_expr(s["$ref"].get<std::string>(), ptr + "/$ref"));
    }
    if (s.contains("const")) return with_null(literal(s["const"].dump()));
    if (s.contains("enum")) {
      const Json& en = s["enum"];
      if (!en.is_array() || en.empty()) return fail("enum at " + ptr + " is not a non-empty array");
      std::vector<Expr> alts;
      for (const Json& v : en) alts.push_back(literal(v.dump()));
      return with_null(alt(std::move(alts)));
    }
    if (s.contains("allOf")) return with_null(all_of(s, ptr));
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const Json& br = s[key];
      if (!br.is_array() || br.empty()) return fail(std::string(key) + " at " + ptr + " is empty");
      // Sibling keywords apply to every branch (a common way to share "type").
      Json base = s;
      base.erase(key);
      base.erase("nullable");
      std::vector<Expr> alts;
      for (size_t i = 0; i < br.size(); ++i) {
        const std::string bp = ptr + "/" + key + "/" + std::to_string(i);
        Opt e;
        bool has_siblings = false;
        for (auto it = base.begin(); it != base.end(); ++it) has_siblings |= constrains(it.key());
        if (has_siblings && br[i].is_object() && !br[i].contains("$ref")) {
          Json merged = base;
          for (auto it = br[i].begin(); it != br[i].end(); ++it) merged[it.key()] = it.value();
          e = schema(merged, bp);
        } else if (has_siblings) {
          return fail("keywords beside '" + std::string(key) + "' at " + ptr +
                      " with a $ref branch are not supported");
        } else {
          e = schema(br[i], bp);
        }
        if (!e) return std::nullopt;
        alts.push_back(std::move(*e));
      }
      return with_null(alt(std::move(alts)));
    }

    std::vector<std::string> types;
    if (auto t = s.find("type"); t != s.end()) {
      if (t->is_string()) {
        types.push_back(t->get<std::string>());
      } else if (t->is_array()) {
        for (const Json& x : *t) {
          if (!x.is_string()) return fail("type at " + ptr + " must be strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return fail("type at " + ptr + " must be a string or an array");
      }
    } else {
      // No type: infer it from the keywords, else any value.
      if (s.contains("properties") || s.contains("additionalProperties") ||
          s.contains("required")) {
        types.push_back("object");
      } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") ||
                 s.contains("maxItems")) {
        types.push_back("array");
      } else if (s.contains("pattern") || s.contains("format") || s.contains("minLength") ||
                 s.contains("maxLength")) {
        types.push_back("string");
      } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
                 s.contains("exclusiveMaximum")) {
        types.push_back("number");
      } else {
        return with_null(ref(value_rule()));
      }
    }
    std::vector<Expr> alts;
    for (const std::string& t : types) {
      Opt e = typed(s, t, ptr);
      if (!e) return std::nullopt;
      alts.push_back(std::move(*e));
    }
    return with_null(alt(std::move(alts)));
  }

  Opt all_of(const Json& s, const std::string& ptr) {
    const Json& parts = s["allOf"];
    if (!parts.is_array() || parts.empty()) return fail("allOf at " + ptr + " is empty");
    Json merged = s;
    merged.erase("allOf");
    for (size_t i = 0; i < parts.size(); ++i) {
      const std::string pp = ptr + "/allOf/" + std::to_string(i);
      const Json* part = &parts[i];
      for (int depth = 0; part->is_object() && part->contains("$ref") && depth < 16; ++depth) {
        const Json* t = resolve((*part)["$ref"].get<std::string>());
        if (!t) return fail("cannot resolve $ref at " + pp);
        part = t;
      }
      if (!part->is_object()) return fail("allOf part at " + pp + " is not an object");
      for (auto it = part->begin(); it != part->end(); ++it) {
        const std::string& k = it.key();
        if (!constrains(k)) continue;
        if (k == "properties") {
          for (auto p = it->begin(); p != it->end(); ++p) {
            if (merged["properties"].contains(p.key()) && merged["properties"][p.key()] != *p) {
              return fail("allOf at " + ptr + ": property '" + p.key() + "' defined twice");
            }
            merged["properties"][p.key()] = *p;
          }
        } else if (k == "required") {
          for (const Json& r : *it) {
            bool have = false;
            for (const Json& x : merged["required"]) have |= x == r;
            if (!have) merged["required"].push_back(r);
          }
        } else if (!merged.contains(k)) {
          merged[k] = *it;
        } else if (merged[k] != *it) {
          return fail("allOf at " + ptr + ": keyword '" + k + "' conflicts (" + pp + ")");
        }
      }
    }
    return schema(merged, ptr);
  }

  Opt typed(const Json& s, const std::string& t, const std::string& ptr) {
    if (t == "string") return string_schema(s, ptr);
    if (t == "integer") return integer_schema(s, ptr);
    if (t == "number") return number_schema(s, ptr);
    if (t == "boolean") return alt({literal("true"), literal("false")});
    if (t == "null") return literal("null");
    if (t == "object") return object_schema(s, ptr);
    if (t == "array") return array_schema(s, ptr);
    return fail("unknown type '" + t + "' at " + ptr + "/type");
  }

  std::optional<int64_t> get_int(const Json& s, const char* key, const std::string& ptr,
                                 bool* bad) {
    auto it = s.find(key);
    if (it == s.end()) return std::nullopt;
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      *bad = true;
      fail(std::string(key) + " at " + ptr + " must be a non-negative integer");
      return std::nullopt;
    }
    return it->get<int64_t>();
  }

  Opt string_schema(const Json& s, const std::string& ptr) {
    bool bad = false;
    auto min_len = get_int(s, "minLength", ptr, &bad);
    auto max_len = get_int(s, "maxLength", ptr, &bad);
    if (bad) return std::nullopt;
    if (max_len && *max_len > 100000) return fail("maxLength at " + ptr + " above 100000");
    std::string pattern;
    bool anchored = false;
    if (auto f = s.find("format"); f != s.end() && f->is_string()) {
      auto it = kFormats.find(f->get<std::string>());
      if (it != kFormats.end()) {
        pattern = it->second;
        anchored = true;
      }
    }
    if (auto p = s.find("pattern"); p != s.end()) {
      if (!pattern.empty()) return fail("pattern and format together at " + ptr);
      if (!p->is_string()) return fail("pattern at " + ptr + " is not a string");
      pattern = p->get<std::string>();
    }
    if (!pattern.empty()) {
      if (min_len || max_len) {
        return fail("minLength/maxLength together with pattern or format at " + ptr +
                    " is not supported");
      }
      auto r = parse_regex(pattern, true);
      if (!r.ok()) return fail(r.error().message + " (pattern at " + ptr + ")");
      Expr body = std::move(r->expr);
      // JSON Schema patterns are not anchored: unanchored ends admit any characters.
      if (!anchored && !r->anchored_start) body = seq({star(string_char()), std::move(body)});
      if (!anchored && !r->anchored_end) body = seq({std::move(body), star(string_char())});
      return seq({literal("\""), std::move(body), literal("\"")});
    }
    if (!min_len && !max_len) return any_string();
    const int32_t lo = static_cast<int32_t>(min_len.value_or(0));
    const int32_t hi = max_len ? static_cast<int32_t>(*max_len) : kUnbounded;
    if (hi != kUnbounded && hi < lo) return fail("maxLength < minLength at " + ptr);
    return seq({literal("\""), repeat(string_char(), lo, hi), literal("\"")});
  }

  // Integer bounds from minimum/maximum/exclusive* (numbers, or draft-4 booleans).
  bool int_bounds(const Json& s, const std::string& ptr, std::optional<int64_t>* lo,
                  std::optional<int64_t>* hi) {
    auto num = [&](const char* k, double* v) {
      auto it = s.find(k);
      if (it == s.end() || !it->is_number()) return false;
      *v = it->get<double>();
      return true;
    };
    double v;
    const bool ex4_min =
        s.value("exclusiveMinimum", Json(false)).is_boolean() && s.value("exclusiveMinimum", false);
    const bool ex4_max =
        s.value("exclusiveMaximum", Json(false)).is_boolean() && s.value("exclusiveMaximum", false);
    auto clamp = [](double x) { return static_cast<int64_t>(std::max(-1e15, std::min(1e15, x))); };
    if (num("minimum", &v)) {
      *lo = ex4_min ? clamp(std::floor(v) + 1) : clamp(std::ceil(v));
    }
    if (num("exclusiveMinimum", &v)) {
      const int64_t x = clamp(std::floor(v) + 1);
      *lo = *lo ? std::max(**lo, x) : x;
    }
    if (num("maximum", &v)) *hi = ex4_max ? clamp(std::ceil(v) - 1) : clamp(std::floor(v));
    if (num("exclusiveMaximum", &v)) {
      const int64_t x = clamp(std::ceil(v) - 1);
      *hi = *hi ? std::min(**hi, x) : x;
    }
    if (*lo && *hi && **lo > **hi) {
      fail("no integer satisfies the bounds at " + ptr);
      return false;
    }
    return true;
  }

  Expr int_expr(std::optional<int64_t> lo, std::optional<int64_t> hi) {
    std::vector<Expr> alts;
    if (!hi || *hi >= 0) {
      alts.push_back(uint_range(lo ? static_cast<uint64_t>(std::max<int64_t>(*lo, 0)) : 0,
                                hi ? std::optional<uint64_t>(*hi) : std::nullopt));
    }
    if (!lo || *lo < 0) {
      const uint64_t nlo = (hi && *hi < 0) ? static_cast<uint64_t>(-*hi) : 1;
      std::optional<uint64_t> nhi;
      if (lo) nhi = static_cast<uint64_t>(-*lo);
      alts.push_back(seq({literal("-"), uint_range(nlo, nhi)}));
    }
    return alt(std::move(alts));
  }

  // One rule per distinct range (a tool's schema often has many integer fields; each range's
  // expression is ~150 elements lowered).
  Opt integer_schema(const Json& s, const std::string& ptr) {
    std::optional<int64_t> lo, hi;
    if (!int_bounds(s, ptr, &lo, &hi)) return std::nullopt;
    const auto key = std::make_pair(lo, hi);
    if (auto it = int_rules_.find(key); it != int_rules_.end()) return ref(it->second);
    const int32_t r = b_.fresh_rule("integer");
    b_.define(r, int_expr(lo, hi));
    int_rules_.emplace(key, r);
    return ref(r);
  }

  Opt number_schema(const Json& s, const std::string& ptr) {
    const bool has_bounds = s.contains("minimum") || s.contains("maximum") ||
                            s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum");
    if (!has_bounds) return any_number();
    for (const char* k : {"exclusiveMinimum", "exclusiveMaximum"}) {
      if (auto it = s.find(k); it != s.end() && !(it->is_boolean() && !it->get<bool>())) {
        return fail(std::string("unsupported keyword '") + k + "' on a number at " + ptr + "/" + k +
                    " (only integers take exclusive bounds)");
      }
    }
    std::optional<int64_t> lo, hi;
    for (const char* k : {"minimum", "maximum"}) {
      auto it = s.find(k);
      if (it == s.end()) continue;
      const double v = it->is_number() ? it->get<double>() : 0.5;
      if (v != std::floor(v) || std::fabs(v) > 1e15) {
        return fail(std::string("unsupported keyword '") + k +
                    "' with a non-integer value on a "
                    "number at " +
                    ptr + "/" + k);
      }
      (k[1] == 'i' ? lo : hi) = static_cast<int64_t>(v);
    }
    if (lo && hi && *lo > *hi) return fail("no number satisfies the bounds at " + ptr);
    // x = sign int . frac, without exponent: an integer part strictly inside the bounds takes
    // any fraction; the bound itself only without one.
    ByteSet d;
    d.add_range('0', '9');
    Expr frac = opt(seq({literal("."), repeat(byte_set(d), 1, kMaxDigits)}));
    std::vector<Expr> alts;
    if (!hi || *hi >= 0) {  // x >= 0
      const int64_t a = lo ? std::max<int64_t>(*lo, 0) : 0;
      if (!hi) {
        alts.push_back(seq({uint_range(static_cast<uint64_t>(a), std::nullopt), frac}));
      } else {
        if (*hi - 1 >= a) alts.push_back(seq({uint_range(a, *hi - 1), frac}));
        alts.push_back(uint_range(static_cast<uint64_t>(*hi), static_cast<uint64_t>(*hi)));
      }
    }
    if (!lo || *lo < 0) {  // x < 0: x = -(i.f)
      const uint64_t a = (hi && *hi < 0) ? static_cast<uint64_t>(-*hi) : 0;
      if (!lo) {
        alts.push_back(
            seq({literal("-"), uint_range(std::max<uint64_t>(a, 0), std::nullopt), frac}));
      } else {
        const uint64_t m = static_cast<uint64_t>(-*lo);
        if (m >= a + 1) alts.push_back(seq({literal("-"), uint_range(a, m - 1), frac}));
        alts.push_back(seq({literal("-"), uint_range(m, m)}));
      }
    }
    return alt(std::move(alts));
  }

  Opt object_schema(const Json& s, const std::string& ptr) {
    std::vector<std::pair<Expr, bool>> props;  // (key":"value, required)
    std::set<std::string> required;
    if (auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) return fail("required at " + ptr + " is not an array");
      for (const Json& x : *r) {
        if (x.is_string()) required.insert(x.get<std::string>());
      }
    }
    std::set<std::string> listed;
    if (auto p = s.find("properties"); p != s.end()) {
      if (!p->is_object()) return fail("properties at " + ptr + " is not an object");
      for (auto it = p->begin(); it != p->end(); ++it) {
        auto v = schema(*it, ptr + "/properties/" + escape_pointer(it.key()));
        if (!v) return std::nullopt;
        listed.insert(it.key());
        Expr pair = seq({literal(Json(it.key()).dump()), punct(":"), std::move(*v)});
        const bool is_required = required.count(it.key()) > 0;
        if (!is_required) {
          // An optional property is written in two rules below (after a comma or not): one
          // rule of its own keeps that a reference, not two copies of its value's expression
          // (8,000 optional integers took 195 MB as copies).
          const int32_t r = b_.fresh_rule("prop");
          b_.define(r, std::move(pair));
          pair = ref(r);
        }
        props.emplace_back(std::move(pair), is_required);
      }
    }
    for (const std::string& r : required) {
      if (!listed.count(r)) {
        // A required property the schema does not describe: any value.
        props.emplace_back(seq({literal(Json(r).dump()), punct(":"), ref(value_rule())}), true);
      }
    }
    std::optional<Expr> extra;  // one additional "key": value
    if (auto a = s.find("additionalProperties"); a != s.end()) {
      if (a->is_boolean()) {
        if (a->get<bool>()) extra = seq({any_string(), punct(":"), ref(value_rule())});
      } else {
        auto v = schema(*a, ptr + "/additionalProperties");
        if (!v) return std::nullopt;
        extra = seq({any_string(), punct(":"), std::move(*v)});
      }
    } else if (!s.contains("properties")) {
      extra = seq({any_string(), punct(":"), ref(value_rule())});  // {"type":"object"}
    }
    // rules[i][comma]: properties i.. given whether one was written already. Made for the
    // pairs the object's start reaches, from the last property back, so each definition's
    // references exist (a recursion over the properties nested as deep as the object is wide:
    // 8,000 properties ran out of stack).
    const int32_t n = static_cast<int32_t>(props.size());
    std::vector<std::array<bool, 2>> reached(n + 1, {false, false});
    reached[0][0] = true;
    for (int32_t i = 0; i < n; ++i) {
      for (int comma = 0; comma < 2; ++comma) {
        if (!reached[i][comma]) continue;
        reached[i + 1][1] = true;
        if (!props[i].second) reached[i + 1][comma] = true;  // optional: may be left out
      }
    }
    std::vector<std::array<int32_t, 2>> rules(n + 1, {-1, -1});
    for (int32_t i = n; i >= 0; --i) {
      for (int comma = 0; comma < 2; ++comma) {
        if (!reached[i][comma]) continue;
        Expr e;
        if (i == n) {
          if (!extra) {
            e = empty();
          } else if (comma) {
            e = star(seq({punct(","), *extra}));
          } else {
            e = opt(seq({*extra, star(seq({punct(","), *extra}))}));
          }
        } else {
          Expr take = seq({comma ? punct(",") : empty(), props[i].first, ref(rules[i + 1][1])});
          e = props[i].second ? std::move(take) : alt({std::move(take), ref(rules[i + 1][comma])});
        }
        rules[i][comma] = b_.fresh_rule("obj");
        b_.define(rules[i][comma], std::move(e));
      }
    }
    return seq({literal("{"), ws(), ref(rules[0][0]), ws(), literal("}")});
  }

  // A string schema with nothing but its type (and annotations).
  static bool plain_string(const Json& s) {
    if (!s.is_object() || !s.contains("type") || s["type"] != "string") return false;
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (it.key() != "type" && constrains(it.key())) return false;
    }
    return true;
  }

  // A string parameter of the XML body written raw, as Qwen3-Coder writes it (its template
  // renders strings with |string): text that the parser (chat/parsers/hermes.cpp) reads back as
  // that very string. The parser takes the text between "<parameter=K>" and the first
  // "</parameter>", drops one newline at each end, and reads it as JSON when the trimmed text is
  // JSON; so the raw text
  //  - holds neither "</parameter>" nor "</tool_call>" (the call's block ends at the first),
  //  - starts with a character that cannot start JSON that parses: not whitespace, a byte-order
  //    mark, '{', '[', '"', '-' or a digit (such strings take the quoted form), and is not
  //    exactly true, false or null (with trailing whitespace).
  // Rules: xml-text-K reads on after a text whose longest suffix that begins a closing word is
  // that word's prefix of length K (an automaton over the words, as Aho-Corasick's).
  Expr raw_xml_string() {
    if (raw_text_rule_ >= 0) return ref(raw_text_rule_);
    const std::vector<std::string> words = {"</parameter>", "</tool_call>"};
    // States: the distinct proper prefixes of the words ("" first).
    std::vector<std::string> states = {""};
    for (const std::string& w : words) {
      for (size_t n = 1; n < w.size(); ++n) {
        if (std::find(states.begin(), states.end(), w.substr(0, n)) == states.end())
          states.push_back(w.substr(0, n));
      }
    }
    ByteSet word_chars;
    for (const std::string& w : words)
      for (char c : w) word_chars.add(static_cast<uint8_t>(c));
    // The state after `c` from `st` (-1: a word is complete).
    auto next = [&](const std::string& st, char c) -> int32_t {
      const std::string t = st + c;
      for (const std::string& w : words) {
        if (t.size() >= w.size() && t.compare(t.size() - w.size(), w.size(), w) == 0) return -1;
      }
      for (size_t k = 0; k < t.size(); ++k) {  // the longest suffix that is a state
        auto it = std::find(states.begin(), states.end(), t.substr(k));
        if (it != states.end()) return static_cast<int32_t>(it - states.begin());
      }
      return 0;
    };
    std::vector<int32_t> rules;
    for (size_t i = 0; i < states.size(); ++i) rules.push_back(b_.fresh_rule("xml-text"));
    // One character c (a code point) from `from`, then on from its state.
    auto after_char = [&](const std::string& from, const ByteSet& allowed_ascii,
                          bool any_multibyte) {
      std::vector<Expr> alts;
      std::map<int32_t, ByteSet> by_target;
      for (int c = 0; c < 0x80; ++c) {
        if (!allowed_ascii.has(static_cast<uint8_t>(c))) continue;
        const int32_t t = word_chars.has(static_cast<uint8_t>(c)) ? next(from, char(c)) : 0;
        if (t >= 0) by_target[t].add(static_cast<uint8_t>(c));
      }
      for (auto& [t, bytes] : by_target) alts.push_back(seq({byte_set(bytes), ref(rules[t])}));
      if (any_multibyte) {
        alts.push_back(seq({codepoints({{0x80, kMaxCodepoint}}), ref(rules[0])}));
      }
      return alts;
    };
    ByteSet all_ascii;
    all_ascii.add_range(0, 0x7F);
    for (size_t i = 0; i < states.size(); ++i) {
      std::vector<Expr> alts = after_char(states[i], all_ascii, true);
      alts.push_back(empty());
      b_.define(rules[i], alt(std::move(alts)));
    }
    // The first character, and true / false / null.
    ByteSet space;
    for (char c : std::string(" \t\n\r")) space.add(static_cast<uint8_t>(c));
    ByteSet first = all_ascii;
    for (char c : std::string(" \t\n\r{[\"-0123456789tfn"))
      first.bits[c >> 6] &= ~(uint64_t{1} << (c & 63));
    std::vector<Expr> starts = after_char("", first, false);
    starts.push_back(seq({codepoints({{0x80, 0xFEFE}, {0xFF00, kMaxCodepoint}}), ref(rules[0])}));
    for (const std::string kw : {"true", "false", "null"}) {
      // kw[0..i) read: end, go on with kw[i], or any other character and free text.
      int32_t tail = b_.fresh_rule("xml-not-" + kw);
      {
        // The whole keyword read: whitespace, then a character that is not (not JSON).
        ByteSet nonspace = all_ascii;
        for (int w = 0; w < 4; ++w) nonspace.bits[w] &= ~space.bits[w];
        std::vector<Expr> alts = after_char("", nonspace, true);
        alts.push_back(seq({byte_set(space), ref(tail)}));
        b_.define(tail, alt(std::move(alts)));
      }
      for (size_t i = kw.size() - 1; i >= 1; --i) {
        const int32_t r = b_.fresh_rule("xml-not-" + kw);
        ByteSet other = all_ascii;
        other.bits[kw[i] >> 6] &= ~(uint64_t{1} << (kw[i] & 63));
        std::vector<Expr> alts = after_char("", other, true);
        alts.push_back(seq({literal(kw.substr(i, 1)), ref(tail)}));
        alts.push_back(empty());
        b_.define(r, alt(std::move(alts)));
        tail = r;
      }
      starts.push_back(seq({literal(kw.substr(0, 1)), ref(tail)}));
    }
    raw_text_rule_ = b_.fresh_rule("xml-raw");
    b_.define(raw_text_rule_, alt(std::move(starts)));
    return ref(raw_text_rule_);
  }

  // Qwen3-Coder's call body: <function=NAME>\n, each parameter as
  // <parameter=KEY>\nVALUE\n</parameter>\n (VALUE compact JSON, or a plain string raw), then
  // </function>.
  Opt xml_call(const Json& s, const std::string& ptr, const std::string& name) {
    std::vector<Expr> parts;
    parts.push_back(literal("<function=" + name + ">\n"));
    auto param = [&](const std::string& key, Expr value) {
      return seq(
          {literal("<parameter=" + key + ">\n"), std::move(value), literal("\n</parameter>\n")});
    };
    if (s.is_object()) {
      for (auto it = s.begin(); it != s.end(); ++it) {
        const std::string& k = it.key();
        if (k == "properties" || k == "required" || k == "additionalProperties" || !constrains(k))
          continue;
        if (k == "type" && it.value() == "object") continue;
        return fail("'" + k + "' at " + ptr +
                    " (the XML tool-call format takes parameters as an object with properties)");
      }
      std::set<std::string> required;
      if (auto r = s.find("required"); r != s.end() && r->is_array()) {
        for (const Json& x : *r) {
          if (x.is_string()) required.insert(x.get<std::string>());
        }
      }
      std::set<std::string> listed;
      if (auto p = s.find("properties"); p != s.end()) {
        if (!p->is_object()) return fail("properties at " + ptr + " is not an object");
        for (auto it = p->begin(); it != p->end(); ++it) {
          if (it.key().empty() || it.key().find_first_of("<>\n") != std::string::npos)
            return fail("property name '" + it.key() + "' at " + ptr +
                        " cannot be written in the XML tool-call format");
          auto v = schema(*it, ptr + "/properties/" + escape_pointer(it.key()));
          if (!v) return std::nullopt;
          // A plain string as the model writes it (raw text), or quoted JSON.
          if (plain_string(*it)) v = alt({raw_xml_string(), std::move(*v)});
          listed.insert(it.key());
          Expr e = param(it.key(), std::move(*v));
          parts.push_back(required.count(it.key()) ? std::move(e) : opt(std::move(e)));
        }
      }
      for (const std::string& r : required) {
        if (!listed.count(r)) parts.push_back(param(r, ref(value_rule())));
      }
    } else if (!(s.is_boolean() && s.get<bool>())) {
      return fail("parameters at " + ptr + " is not an object schema");
    }
    parts.push_back(literal("</function>"));
    return seq(std::move(parts));
  }

  Opt array_schema(const Json& s, const std::string& ptr) {
    bool bad = false;
    auto min_items = get_int(s, "minItems", ptr, &bad);
    auto max_items = get_int(s, "maxItems", ptr, &bad);
    if (bad) return std::nullopt;
    if (max_items && *max_items > 10000) return fail("maxItems at " + ptr + " above 10000");
    std::vector<Expr> prefix;
    if (auto p = s.find("prefixItems"); p != s.end()) {
      if (!p->is_array()) return fail("prefixItems at " + ptr + " is not an array");
      for (size_t i = 0; i < p->size(); ++i) {
        auto e = schema((*p)[i], ptr + "/prefixItems/" + std::to_string(i));
        if (!e) return std::nullopt;
        prefix.push_back(std::move(*e));
      }
    }
    std::optional<Expr> item;
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_array()) return fail("items as an array at " + ptr + " (use prefixItems)");
      if (!(it->is_boolean() && !it->get<bool>())) {
        auto e = schema(*it, ptr + "/items");
        if (!e) return std::nullopt;
        item = std::move(*e);
      }
    } else {
      item = ref(value_rule());
    }
    const int64_t k = static_cast<int64_t>(prefix.size());
    const int64_t lo = min_items.value_or(0);
    std::optional<int64_t> hi = max_items;
    if (!item) hi = hi ? std::min(*hi, k) : k;
    if (hi && *hi < lo) return fail("no array satisfies minItems/maxItems at " + ptr);
    // elements(i): items from position i on (a comma before each but the first).
    std::function<Expr(int64_t)> elements = [&](int64_t i) -> Expr {
      Expr sep = i == 0 ? empty() : punct(",");
      if (i < k) {
        if (hi && i >= *hi) return empty();
        Expr take = seq({sep, prefix[i], elements(i + 1)});
        return i >= lo ? opt(std::move(take)) : std::move(take);
      }
      if (!item) return empty();
      const int64_t need = std::max<int64_t>(lo - i, 0);
      const int32_t max_more = hi ? static_cast<int32_t>(*hi - i) : kUnbounded;
      if (max_more == 0) return empty();
      if (i == 0) {
        // item ("," item){need-1, max-1}, optional when need == 0
        Expr rest =
            repeat(seq({punct(","), *item}), static_cast<int32_t>(std::max<int64_t>(need - 1, 0)),
                   max_more == kUnbounded ? kUnbounded : max_more - 1);
        Expr all = seq({*item, std::move(rest)});
        return need == 0 ? opt(std::move(all)) : std::move(all);
      }
      return repeat(seq({punct(","), *item}), static_cast<int32_t>(need), max_more);
    };
    const int32_t r = b_.fresh_rule("arr");
    b_.define(r, elements(0));
    return seq({literal("["), ws(), ref(r), ws(), literal("]")});
  }

  const Json& root_;
  JsonSchemaOptions opt_;
  GrammarBuilder b_;
  std::string error_;
  std::map<std::string, int32_t> ref_rules_;
  int32_t ws_rule_ = -1, char_rule_ = -1, string_rule_ = -1, number_rule_ = -1;
  int32_t value_rule_ = -1, object_rule_ = -1, raw_text_rule_ = -1;
  int depth_ = 0;  // schema() calls open
  std::map<std::pair<std::optional<int64_t>, std::optional<int64_t>>, int32_t> int_rules_;
};

}  // namespace

Expected<Grammar> compile_json_schema(std::string_view schema_text,
                                      const JsonSchemaOptions& options) {
  Json root = Json::parse(schema_text, nullptr, false);
  if (root.is_discarded()) return err("json schema: not valid JSON");
  return SchemaCompiler(root, options).compile();
}

Expected<Grammar> compile_tool_calls(std::string_view tools_json, std::string_view arguments_key,
                                     JsonSchemaOptions options) {
  Json tools = Json::parse(tools_json, nullptr, false);
  if (tools.is_discarded() || !tools.is_array() || tools.empty()) {
    return err("tool calls: 'tools' must be a non-empty array");
  }
  Json any = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const Json* fn = t.is_object() && t.contains("function") ? &t["function"] : &t;
    if (!fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
      return err("tool calls: tools[{}] has no function name", i);
    }
    Json params = fn->contains("parameters") ? (*fn)["parameters"] : Json::object();
    if (params.is_object() && params.empty()) params = {{"type", "object"}};
    // Each tool's schema is checked alone, so an error names the tool, not an anyOf branch.
    auto alone = compile_json_schema(params.dump(), options);
    if (!alone.ok()) {
      return err("tool calls: tools[{}] ('{}') parameters: {}", i, (*fn)["name"].get<std::string>(),
                 alone.error().message);
    }
    Json props = Json::object();
    props["name"] = {{"const", (*fn)["name"]}};
    props[std::string(arguments_key)] = params;
    any.push_back({{"type", "object"},
                   {"properties", props},
                   {"required", {"name", std::string(arguments_key)}},
                   {"additionalProperties", false}});
  }
  Json schema = {{"anyOf", any}};
  // $defs of the tools' parameters stay reachable under their own $refs only if those
  // point inside the parameters; the schema of a tool that refers to "#/$defs/.." is moved
  // along so the pointers resolve from the new root.
  for (const Json& t : tools) {
    const Json* fn = t.is_object() && t.contains("function") ? &t["function"] : &t;
    const Json& params = fn->contains("parameters") ? (*fn)["parameters"] : Json::object();
    for (const char* defs : {"$defs", "definitions"}) {
      if (params.is_object() && params.contains(defs)) {
        for (auto it = params[defs].begin(); it != params[defs].end(); ++it) {
          schema[defs][it.key()] = it.value();
        }
      }
    }
  }
  options.compact = false;
  options.max_whitespace = 1;  // `{"name": "f", "arguments": {..}}`, no runs of spaces
  return compile_json_schema(schema.dump(), options);
}

Expected<Grammar> compile_tool_call_syntax(std::string_view tools_json,
                                           const ToolCallSyntax& syntax) {
  Json tools = Json::parse(tools_json, nullptr, false);
  if (tools.is_discarded() || !tools.is_array() || tools.empty()) {
    return err("tool calls: 'tools' must be a non-empty array");
  }
  const bool json_body = syntax.body == ToolCallSyntax::Body::kJson;
  Json root = Json::object();
  Json items = Json::array();
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const Json* fn = t.is_object() && t.contains("function") ? &t["function"] : &t;
    if (!fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
      return err("tool calls: tools[{}] has no function name", i);
    }
    const std::string name = (*fn)["name"].get<std::string>();
    if (!json_body && (name.empty() || name.find_first_of(" \t\r\n<>`{") != std::string::npos)) {
      return err("tool calls: tools[{}] ('{}'): this tool-call format cannot write that name", i,
                 name);
    }
    Json params = fn->contains("parameters") ? (*fn)["parameters"] : Json::object();
    if (params.is_null() || (params.is_object() && params.empty())) params = {{"type", "object"}};
    // Each tool's schema is checked alone, so an error names the tool, not a branch.
    if (auto alone = compile_json_schema(params.dump()); !alone.ok()) {
      return err("tool calls: tools[{}] ('{}') parameters: {}", i, name, alone.error().message);
    }
    for (const char* defs : {"$defs", "definitions"}) {
      if (params.is_object() && params.contains(defs) && params[defs].is_object()) {
        for (auto it = params[defs].begin(); it != params[defs].end(); ++it) {
          root[defs][it.key()] = it.value();
        }
      }
    }
    if (json_body) {
      Json props = Json::object();
      props["name"] = {{"const", name}};
      props[syntax.arguments_key] = params;
      items.push_back({{"type", "object"},
                       {"properties", props},
                       {"required", {"name", syntax.arguments_key}},
                       {"additionalProperties", false}});
    } else {
      items.push_back(params);
    }
    names.push_back(name);
  }
  root["x-kiln-tools"] = std::move(items);
  JsonSchemaOptions options;
  options.escape_lt = !json_body;  // their parsers end a call at the first closing tag
  if (json_body) {
    options.compact = false;
    options.max_whitespace = std::max<int32_t>(1, syntax.max_whitespace);
  }
  return SchemaCompiler(root, options).tool_calls(syntax, names);
}

Grammar json_object_grammar(const JsonSchemaOptions& options) {
  Json root = Json::object();
  return SchemaCompiler(root, options).any_object();
}

}  // namespace kiln::grammar
