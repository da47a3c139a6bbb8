#include "backends/cuda/runtime/env.h"

#include <cstdio>
#include <cstdlib>
#include <limits>

#include "fusebox/core/error.h"

namespace fusebox::cuda {
namespace {

// Parses all of `digits` as a decimal number; false on anything else or on overflow.
bool parse_decimal(std::string_view digits, size_t& value) {
  if (digits.empty()) return false;
  value = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
    size_t d = size_t(c - '0');
    if (value > (std::numeric_limits<size_t>::max() - d) / 10) return false;
    value = value * 10 + d;
  }
  return true;
}

}  // namespace

std::optional<std::string> env_text(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

size_t parse_count(std::string_view text, std::string_view setting) {
  size_t value = 0;
  FUSEBOX_CHECK(parse_decimal(text, value), "cuda", setting, "='", text,
                "' is not a count: expected a non-negative decimal integer");
  return value;
}

bool parse_switch(std::string_view text, std::string_view setting) {
  FUSEBOX_CHECK(text == "0" || text == "1", "cuda", setting, "='", text, "' must be 0 or 1");
  return text == "1";
}

}  // namespace fusebox::cuda
