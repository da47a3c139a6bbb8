#include "fusebox/core/build_info.h"

#include <cstdlib>

namespace fusebox {

std::string source_commit() {
  if (const char* commit = std::getenv("GPU_CHECK_COMMIT"); commit != nullptr && *commit)
    return commit;
  const std::string configured = FUSEBOX_SOURCE_COMMIT;
  return configured.empty() ? "unknown" : configured;
}

}  // namespace fusebox
