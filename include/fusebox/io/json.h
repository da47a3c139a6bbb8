// A small JSON value for reports (the benchmarks', `fusebox bench --json`): null, bool, integers,
// doubles, strings, arrays and objects, written with indentation. Objects keep their keys in
// insertion order, so that a report reads top down as the benchmark ran.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace fusebox {

class Json {
 public:
  using Array = std::vector<Json>;
  using Object = std::vector<std::pair<std::string, Json>>;

  Json() = default;  // null
  Json(bool value) : value_(value) {}
  template <std::integral T>
  requires(!std::same_as<T, bool>) Json(T value) {
    if constexpr (std::signed_integral<T>) {
      value_ = int64_t(value);
    } else {
      value_ = uint64_t(value);
    }
  }
  Json(double value) : value_(value) {}
  Json(std::string value) : value_(std::move(value)) {}
  Json(const char* value) : value_(std::string(value)) {}

  static Json object(Object members = {}) { return Json(std::move(members)); }
  static Json array(Array items = {}) { return Json(std::move(items)); }

  // An object's member `key`, replacing an earlier value of it.
  Json& set(std::string_view key, Json value);
  // Appends to an array.
  Json& push(Json value);

  // The text, indented by two spaces a level, an array or object that holds no other on one
  // line (one result a line, as the reports were read before); non-finite numbers as null.
  std::string dump() const;

 private:
  explicit Json(Object members) : value_(std::move(members)) {}
  explicit Json(Array items) : value_(std::move(items)) {}
  void dump(std::string& out, int depth) const;
  bool is_container() const;
  bool holds_only_scalars() const;  // of an array or object

  std::variant<std::nullptr_t, bool, int64_t, uint64_t, double, std::string, Array, Object> value_;
};

}  // namespace fusebox
