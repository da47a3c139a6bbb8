// The parsers of the CUDA backend's settings. runtime/settings.cpp, the one reader of the
// environment, uses them: a malformed value is an error naming the variable, never ignored.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace fusebox::cuda {

// The variable's value; nullopt when unset or empty. For runtime/settings.cpp only: the
// rest of the backend takes its settings from settings().
std::optional<std::string> env_text(const char* name);

// "4096", "64K", "512M", "2G" (suffixes are powers of 1024, either case) -> bytes, > 0.
// `setting` names the source in the error ("FUSEBOX_CUDA_MEMORY_LIMIT").
size_t parse_byte_count(std::string_view text, std::string_view setting);

// A non-negative decimal integer.
size_t parse_count(std::string_view text, std::string_view setting);

// "0" or "1".
bool parse_switch(std::string_view text, std::string_view setting);

// Human-readable size for messages: "512 B", "1.5 KiB", "256.0 MiB", "79.1 GiB".
std::string format_bytes(size_t bytes);

}  // namespace fusebox::cuda
