#include "fusebox/io/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "fusebox/core/error.h"

namespace fusebox {
namespace {

void append_string(std::string& out, std::string_view text) {
  out += '"';
  for (const char c : text) {
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
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", unsigned(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void append_number(std::string& out, double value) {
  if (!std::isfinite(value)) {
    out += "null";
    return;
  }
  char text[32];
  // The shortest text that reads back as the same double.
  const auto end = std::to_chars(text, text + sizeof text, value).ptr;
  out.append(text, end);
}

// Before an item of a container: a new indented line, or a space in a one-line container.
void separate(std::string& out, bool one_line, int depth) {
  if (one_line) {
    out += ' ';
    return;
  }
  out += '\n';
  out.append(size_t(2 * depth), ' ');
}

}  // namespace

Json& Json::set(std::string_view key, Json value) {
  auto* members = std::get_if<Object>(&value_);
  FUSEBOX_CHECK(members != nullptr, "bench json", "set('", key, "') on a value not an object");
  for (auto& [name, member] : *members) {
    if (name == key) {
      member = std::move(value);
      return *this;
    }
  }
  members->emplace_back(std::string(key), std::move(value));
  return *this;
}

Json& Json::push(Json value) {
  auto* items = std::get_if<Array>(&value_);
  FUSEBOX_CHECK(items != nullptr, "bench json", "push() on a value not an array");
  items->push_back(std::move(value));
  return *this;
}

std::string Json::dump() const {
  std::string out;
  dump(out, 0);
  out += '\n';
  return out;
}

void Json::dump(std::string& out, int depth) const {
  if (std::holds_alternative<std::nullptr_t>(value_)) {
    out += "null";
  } else if (const bool* b = std::get_if<bool>(&value_)) {
    out += *b ? "true" : "false";
  } else if (const int64_t* i = std::get_if<int64_t>(&value_)) {
    out += std::to_string(*i);
  } else if (const uint64_t* u = std::get_if<uint64_t>(&value_)) {
    out += std::to_string(*u);
  } else if (const double* d = std::get_if<double>(&value_)) {
    append_number(out, *d);
  } else if (const std::string* s = std::get_if<std::string>(&value_)) {
    append_string(out, *s);
  } else if (const Array* items = std::get_if<Array>(&value_)) {
    const bool one_line = holds_only_scalars();
    out += '[';
    for (size_t i = 0; i < items->size(); ++i) {
      if (i) out += ',';
      if (i || !one_line) separate(out, one_line, depth + 1);
      (*items)[i].dump(out, depth + 1);
    }
    if (!items->empty() && !one_line) separate(out, false, depth);
    out += ']';
  } else {
    const Object& members = std::get<Object>(value_);
    const bool one_line = holds_only_scalars();
    out += '{';
    for (size_t i = 0; i < members.size(); ++i) {
      if (i) out += ',';
      if (i || !one_line) separate(out, one_line, depth + 1);
      append_string(out, members[i].first);
      out += ": ";
      members[i].second.dump(out, depth + 1);
    }
    if (!members.empty() && !one_line) separate(out, false, depth);
    out += '}';
  }
}

bool Json::is_container() const {
  return std::holds_alternative<Array>(value_) || std::holds_alternative<Object>(value_);
}

bool Json::holds_only_scalars() const {
  if (const Array* items = std::get_if<Array>(&value_)) {
    return std::none_of(items->begin(), items->end(),
                        [](const Json& j) { return j.is_container(); });
  }
  const Object& members = std::get<Object>(value_);
  return std::none_of(members.begin(), members.end(),
                      [](const auto& member) { return member.second.is_container(); });
}

}  // namespace fusebox
