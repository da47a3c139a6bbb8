// Helpers for the io tests: scratch directories, fixture paths, error expectations and
// bit-exact tensor comparison.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "fusebox/core/tensor.h"

#include "testing.h"

namespace fusebox::iotest {

// A fresh directory for one test, removed with everything in it at destruction.
class ScratchDir {
 public:
  ScratchDir() {
    static int counter = 0;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::path(::testing::TempDir()) /
            cat("fusebox_io_", ::getpid(), "_", counter++, "_", info ? info->name() : "x");
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// A checked-in test file under tests/data/io/.
inline std::string fixture(const std::string& name) {
  return std::string(FUSEBOX_SOURCE_DIR) + "/tests/data/io/" + name;
}

using testing::error_message;  // tests/testing.h

// Expects `statement` to throw a fusebox::Error whose message contains `text`.
#define EXPECT_IO_ERROR(statement, text)                                                        \
  do {                                                                                          \
    const std::string io_error_message_ = ::fusebox::iotest::error_message([&] { statement; }); \
    EXPECT_NE(io_error_message_.find(text), std::string::npos)                                  \
        << "expected an Error containing \"" << (text) << "\", got: " << io_error_message_;     \
  } while (0)

// Same dtype, same shape, same bytes (so NaNs and signed zeros count).
inline ::testing::AssertionResult same_tensor(const Tensor& actual, const Tensor& expected) {
  if (!actual.defined() || !expected.defined()) {
    return ::testing::AssertionFailure() << "undefined tensor";
  }
  if (actual.dtype() != expected.dtype()) {
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(actual.dtype()) << " vs " << dtype_name(expected.dtype());
  }
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure()
           << "shape " << shape_str(actual.shape()) << " vs " << shape_str(expected.shape());
  }
  if (actual.nbytes() > 0 && std::memcmp(actual.raw(), expected.raw(), actual.nbytes()) != 0) {
    return ::testing::AssertionFailure() << "contents differ";
  }
  return ::testing::AssertionSuccess();
}

// Shapes of ranks 0 to 5, and zero-size ones, for round-trip tests.
inline std::vector<Shape> round_trip_shapes() {
  return {{},  {5},       {2, 3},          {2, 1, 3},      {1, 2, 3, 2}, {2, 1, 2, 1, 3},
          {0}, {2, 0, 3}, {0, 0, 0, 0, 0}, {1, 1, 1, 1, 0}};
}

inline constexpr DType kAllDTypes[] = {DType::f64, DType::f32, DType::f16,    DType::bf16,
                                       DType::i64, DType::i32, DType::boolean};

// Reads and writes little-endian fields of hand-built or patched byte strings.
inline uint32_t get_u32(const std::string& s, size_t pos) {
  uint32_t v;
  std::memcpy(&v, s.data() + pos, 4);
  return v;
}
inline void set_u16(std::string* s, size_t pos, uint16_t v) {
  std::memcpy(s->data() + pos, &v, 2);
}
inline void set_u32(std::string* s, size_t pos, uint32_t v) {
  std::memcpy(s->data() + pos, &v, 4);
}

}  // namespace fusebox::iotest
