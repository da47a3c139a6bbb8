// The parsers of the CUDA backend's settings. runtime/settings.cpp, the one reader of the
// environment, uses them: a malformed value is an error naming the variable, never ignored.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "fusebox/core/memory.h"  // parse_byte_count

namespace fusebox::cuda {

// The variable's value; nullopt when unset or empty. For runtime/settings.cpp only: the
// rest of the backend takes its settings from settings().
std::optional<std::string> env_text(const char* name);

// A non-negative decimal integer.
size_t parse_count(std::string_view text, std::string_view setting);

// "0" or "1".
bool parse_switch(std::string_view text, std::string_view setting);

}  // namespace fusebox::cuda
