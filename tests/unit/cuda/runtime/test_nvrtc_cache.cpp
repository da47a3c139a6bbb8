// Kernels compiled at run time (runtime/nvrtc.h): the target, the cache key, NVRTC compiles
// and its errors, and the disk cache of images (a corrupt file is a miss with one warning,
// compiled again and replaced). NVRTC is a compiler library: none of this needs a GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "backends/cuda/runtime/nvrtc.h"
#include "fusebox/core/error.h"
#include "testing.h"

namespace fusebox::cuda {
namespace {

namespace fs = std::filesystem;
using fusebox::testing::TempDir;

const char* kSource = R"(extern "C" __global__ void fusebox_test_kernel(float* y, float a) {
  y[threadIdx.x] = a * (float)threadIdx.x;
})";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

TEST(Nvrtc, TargetsTheDevicesArchitecture) {
  const NvrtcTarget h100 = nvrtc_target(90);
  EXPECT_EQ(h100.arch, 90);
  EXPECT_TRUE(h100.cubin);
  EXPECT_EQ(h100.name(), "sm_90");
  // An architecture this NVRTC does not know: the newest one below it, as PTX.
  const NvrtcTarget future = nvrtc_target(990);
  EXPECT_FALSE(future.cubin);
  EXPECT_LT(future.arch, 990);
  EXPECT_EQ(future.name(), cat("compute_", future.arch));
  EXPECT_THROW(nvrtc_target(10), Error);
  const std::vector<std::string> options = nvrtc_options(h100);
  EXPECT_EQ(options[0], "--gpu-architecture=sm_90");
  for (const char* o : {"-default-device", "-std=c++17", "--fmad=true"})
    EXPECT_NE(std::find(options.begin(), options.end(), o), options.end()) << o;
}

TEST(Nvrtc, KeyHoldsSourceTargetAndVersion) {
  const NvrtcTarget sm90{90, true}, sm80{80, true};
  EXPECT_EQ(nvrtc_cache_key(kSource, sm90), nvrtc_cache_key(kSource, sm90));
  EXPECT_NE(nvrtc_cache_key(kSource, sm90), nvrtc_cache_key(kSource, sm80));
  EXPECT_NE(nvrtc_cache_key(kSource, sm90), nvrtc_cache_key(std::string(kSource) + " ", sm90));
  const std::string key = nvrtc_cache_key(kSource, sm90);
  EXPECT_NE(key.find(kSource), std::string::npos);  // the whole source, not a hash
  EXPECT_NE(key.find(nvrtc_version()), std::string::npos);
}

TEST(Nvrtc, CompilesACubin) {
  const std::vector<uint8_t> image = nvrtc_compile(kSource, {90, true}, "test kernel");
  ASSERT_GT(image.size(), 4u);
  EXPECT_EQ(std::string(image.begin(), image.begin() + 4),
            "\x7f"
            "ELF");
  const std::vector<uint8_t> ptx = nvrtc_compile(kSource, {80, false}, "test kernel");
  EXPECT_NE(std::string(ptx.begin(), ptx.end()).find(".target sm_80"), std::string::npos);
}

TEST(Nvrtc, CompileErrorNamesTheCallerAndHoldsTheLog) {
  try {
    nvrtc_compile("extern \"C\" __global__ void k() { undefined_thing(); }", {90, true},
                  "fused_pointwise 'block1/act'");
    ADD_FAILURE() << "compiled";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[fused_pointwise 'block1/act']"), std::string::npos) << what;
    EXPECT_NE(what.find("NVRTC's log"), std::string::npos) << what;
    EXPECT_NE(what.find("undefined_thing"), std::string::npos) << what;
  }
}

TEST(NvrtcDiskCache, LivesUnderTheCacheDir) {
  TempDir tmp;
  const NvrtcTarget target{90, true};
  EXPECT_EQ(nvrtc_disk_cache("", target), nullptr);
  const std::unique_ptr<DiskPlanCache> disk = nvrtc_disk_cache(tmp.path(), target);
  ASSERT_NE(disk, nullptr);
  EXPECT_EQ(disk->dir(), tmp.path() / "nvrtc" / cat("sm90-nvrtc", nvrtc_version()));
}

TEST(NvrtcDiskCache, StoresThenReusesTheImage) {
  TempDir tmp;
  const NvrtcTarget target{90, true};
  const std::unique_ptr<DiskPlanCache> disk = nvrtc_disk_cache(tmp.path(), target);
  bool from_disk = true;
  const std::vector<uint8_t> compiled = nvrtc_image(kSource, target, disk.get(), "k", &from_disk);
  EXPECT_FALSE(from_disk);
  const fs::path file = disk->path_of(nvrtc_cache_key(kSource, target));
  EXPECT_TRUE(fs::exists(file));
  // Another process, in effect: a fresh cache object finds it.
  const std::unique_ptr<DiskPlanCache> again = nvrtc_disk_cache(tmp.path(), target);
  EXPECT_EQ(nvrtc_image(kSource, target, again.get(), "k", &from_disk), compiled);
  EXPECT_TRUE(from_disk);
  EXPECT_EQ(again->stats().hits, 1u);
}

TEST(NvrtcDiskCache, CorruptFileIsRebuiltWithOneWarning) {
  TempDir tmp;
  const NvrtcTarget target{90, true};
  const std::vector<uint8_t> compiled =
      nvrtc_image(kSource, target, nvrtc_disk_cache(tmp.path(), target).get(), "k");
  const fs::path file =
      nvrtc_disk_cache(tmp.path(), target)->path_of(nvrtc_cache_key(kSource, target));
  const std::string good = read_file(file);
  std::string flipped = good;
  flipped[good.size() / 3] = char(flipped[good.size() / 3] ^ 0x10);
  for (const std::string& bad :
       {good.substr(0, good.size() / 2), std::string(good.size(), 'x'), flipped}) {
    write_file(file, bad);
    const std::unique_ptr<DiskPlanCache> disk = nvrtc_disk_cache(tmp.path(), target);
    bool from_disk = true;
    ::testing::internal::CaptureStderr();
    const std::vector<uint8_t> image = nvrtc_image(kSource, target, disk.get(), "k", &from_disk);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_FALSE(from_disk);
    EXPECT_EQ(image, compiled);
    EXPECT_NE(err.find(file.string()), std::string::npos) << err;
    EXPECT_NE(err.find("rebuilt and the file replaced"), std::string::npos) << err;
    EXPECT_EQ(disk->stats().corrupt, 1u);
    EXPECT_EQ(read_file(file), good);  // replaced by a whole, valid file
    // Warned once per file: the same cache object misses quietly after that.
    write_file(file, bad);
    ::testing::internal::CaptureStderr();
    nvrtc_image(kSource, target, disk.get(), "k", &from_disk);
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  }
}

}  // namespace
}  // namespace fusebox::cuda
