// What a report says about the build that made it.
#pragma once

#include <string>

namespace fusebox {

// The commit the build is from: $GPU_CHECK_COMMIT (scripts/gpu_check.sh sets it where the copy's
// .git is missing or stale), else the checkout's commit when CMake configured the build
// (src/CMakeLists.txt), else "unknown".
std::string source_commit();

}  // namespace fusebox
