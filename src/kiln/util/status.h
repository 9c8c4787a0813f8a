// Error values for kiln. Functions that can fail on input (files, requests, user flags)
// return Expected<T>; internal invariants are asserts (KILN_ASSERT). Nothing here throws.
#pragma once

#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace kiln {

// What went wrong, for a human: says what, where (path, field, offset) and why.
struct Error {
  std::string message;
};

// Build an Error with fmt formatting: return kiln::err("bad magic at offset {}", off);
template <typename... Args>
Error err(fmt::format_string<Args...> f, Args&&... args) {
  return Error{fmt::format(f, std::forward<Args>(args)...)};
}

// A value or an Error (a small stand-in for C++23 std::expected).
template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit
  Expected(Error e) : v_(std::in_place_index<1>, std::move(e)) {}      // NOLINT: implicit

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    check();
    return std::get<0>(v_);
  }
  const T& value() const& {
    check();
    return std::get<0>(v_);
  }
  T&& value() && {
    check();
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const { return std::get<1>(v_); }
  Error take_error() && { return std::get<1>(std::move(v_)); }

 private:
  void check() const {
    if (!ok()) {
      std::fprintf(stderr, "kiln: Expected::value() on error: %s\n",
                   std::get<1>(v_).message.c_str());
      std::abort();
    }
  }
  std::variant<T, Error> v_;
};

// Success or an Error.
template <>
class [[nodiscard]] Expected<void> {
 public:
  Expected() = default;
  Expected(Error e) : e_(std::move(e)), ok_(false) {}  // NOLINT: implicit

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return e_; }
  Error take_error() && { return std::move(e_); }

 private:
  Error e_;
  bool ok_ = true;
};

using Status = Expected<void>;

}  // namespace kiln

// Propagate an error: KILN_TRY(auto x, parse(...)); or KILN_TRY_STATUS(check(...));
#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)
#define KILN_TRY_IMPL(tmp, decl, expr)               \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return std::move(tmp).take_error(); \
  decl = std::move(tmp).value()
#define KILN_TRY(decl, expr) KILN_TRY_IMPL(KILN_CONCAT(kiln_try_, __LINE__), decl, expr)
#define KILN_TRY_STATUS(expr)                                                    \
  do {                                                                           \
    auto kiln_try_status_ = (expr);                                              \
    if (!kiln_try_status_.ok()) return std::move(kiln_try_status_).take_error(); \
  } while (0)

// Internal invariants: on in every build (Release keeps asserts).
#define KILN_ASSERT(cond)                                                                       \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "kiln: assertion failed: %s at %s:%d\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)
