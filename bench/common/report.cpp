#include "report.h"

#include <cstdlib>
#include <fstream>

#include "backends/cuda/runtime/device.h"
#include "fusebox/core/error.h"

namespace fusebox::bench {

std::string source_commit() {
  if (const char* commit = std::getenv("GPU_CHECK_COMMIT"); commit != nullptr && *commit)
    return commit;
  // FUSEBOX_BENCH_COMMIT: `git rev-parse --short HEAD` at configure time (bench/CMakeLists.txt).
  const std::string configured = FUSEBOX_BENCH_COMMIT;
  return configured.empty() ? "unknown" : configured;
}

Json report(std::string_view bench) {
  return Json::object({{"schema_version", kReportSchemaVersion},
                       {"bench", std::string(bench)},
                       {"device", cuda::Device::get(0).properties().name},
                       {"commit", source_commit()}});
}

void write_report(const std::string& path, const Json& report) {
  if (path.empty()) return;
  std::ofstream file(path);
  file << report.dump();
  FUSEBOX_CHECK(file.good(), "bench report", "cannot write ", path);
}

}  // namespace fusebox::bench
