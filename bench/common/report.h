// Every benchmark's JSON report starts with the same header, so that results from different
// runs and machines can be told apart and read by one set of scripts.
#pragma once

#include <string>
#include <string_view>

#include "fusebox/io/json.h"

namespace fusebox::bench {

using Json = fusebox::Json;

// Raised when a report's layout changes in a way its readers must know about.
inline constexpr int kReportSchemaVersion = 1;

// An object holding the header: schema_version, bench, device (CUDA device 0's name, or "cpu
// (no CUDA device)" on a machine without one: the CPU benchmarks) and
// commit (fusebox/core/build_info.h). The benchmark adds its own fields after them.
Json report(std::string_view bench);

// Writes `report` to `path`; nothing when `path` is empty (no --json given).
void write_report(const std::string& path, const Json& report);

}  // namespace fusebox::bench
