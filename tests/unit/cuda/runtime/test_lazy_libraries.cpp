// cuBLASLt and NVRTC are loaded at their first call (runtime/lazy_libraries.cpp), not at process
// start: the CLI does not link them, and their entry points load them when called. Neither
// needs a GPU (a status name, NVRTC's version).
#include <cublasLt.h>
#include <nvrtc.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

namespace fusebox::cuda {
namespace {

std::string command_output(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) out.append(buffer, n);
  ::pclose(pipe);
  return out;
}

bool mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  const std::string text((std::istreambuf_iterator<char>(maps)), {});
  return text.find(library) != std::string::npos;
}

TEST(LazyLibraries, TheToolDoesNotLinkThem) {
  const std::string dynamic = command_output(std::string("readelf -d ") + FUSEBOX_TOOL_PATH);
  if (dynamic.find("NEEDED") == std::string::npos)
    GTEST_SKIP() << "readelf -d " << FUSEBOX_TOOL_PATH << " listed no NEEDED entries (binutils?)";
  EXPECT_NE(dynamic.find("libcudart"), std::string::npos) << dynamic;  // linked: ~2 MB
  EXPECT_EQ(dynamic.find("libcublasLt"), std::string::npos) << dynamic;
  EXPECT_EQ(dynamic.find("libnvrtc"), std::string::npos) << dynamic;
}

TEST(LazyLibraries, AnEntryPointLoadsItsLibrary) {
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_TRUE(mapped("libcublasLt.so"));
  int major = 0, minor = -1;
  ASSERT_EQ(nvrtcVersion(&major, &minor), NVRTC_SUCCESS);
  EXPECT_EQ(major, CUDART_VERSION / 1000);
  EXPECT_GE(minor, 0);
  EXPECT_TRUE(mapped("libnvrtc.so"));
  EXPECT_STREQ(nvrtcGetErrorString(NVRTC_ERROR_INVALID_INPUT), "NVRTC_ERROR_INVALID_INPUT");
}

}  // namespace
}  // namespace fusebox::cuda
