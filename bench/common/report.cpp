#include "report.h"

#include <fstream>

#include "backends/cuda/runtime/device.h"
#include "fusebox/core/build_info.h"
#include "fusebox/core/error.h"

namespace fusebox::bench {

Json report(std::string_view bench) {
  return Json::object({{"schema_version", kReportSchemaVersion},
                       {"bench", std::string(bench)},
                       {"device", cuda::device_present() ? cuda::Device::get(0).properties().name
                                                         : std::string("cpu (no CUDA device)")},
                       {"commit", source_commit()}});
}

void write_report(const std::string& path, const Json& report) {
  if (path.empty()) return;
  std::ofstream file(path);
  file << report.dump();
  FUSEBOX_CHECK(file.good(), "bench report", "cannot write ", path);
}

}  // namespace fusebox::bench
