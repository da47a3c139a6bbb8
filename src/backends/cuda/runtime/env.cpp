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

size_t parse_byte_count(std::string_view text, std::string_view setting) {
  size_t multiplier = 1;
  std::string_view digits = text;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'k':
      case 'K':
        multiplier = size_t(1) << 10;
        break;
      case 'm':
      case 'M':
        multiplier = size_t(1) << 20;
        break;
      case 'g':
      case 'G':
        multiplier = size_t(1) << 30;
        break;
      default:
        break;
    }
    if (multiplier != 1) digits.remove_suffix(1);
  }
  size_t value = 0;
  bool ok =
      parse_decimal(digits, value) && value <= std::numeric_limits<size_t>::max() / multiplier;
  FUSEBOX_CHECK(ok, "cuda", setting, "='", text,
                "' is not a byte count: expected digits with an optional K, M or G suffix "
                "(powers of 1024), e.g. 4096, 512M or 2G");
  FUSEBOX_CHECK(value > 0, "cuda", setting, "='", text, "' must be more than 0 bytes");
  return value * multiplier;
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

std::string format_bytes(size_t bytes) {
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return cat(bytes, " B");
  double value = double(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", value, units[unit]);
  return text;
}

}  // namespace fusebox::cuda
