// core/memory.h: checked tensor sizes (the one computation every shape goes through), byte
// counts read and written, the host memory budget.
#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "fusebox/core/memory.h"
#include "fusebox/core/tensor.h"
#include "testing.h"

namespace fusebox {
namespace {

using testing::error_message;

constexpr int64_t k2_31 = int64_t(1) << 31, k2_32 = int64_t(1) << 32, k2_62 = int64_t(1) << 62;
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

TEST(CheckedTensorSize, CountsElementsAndBytes) {
  EXPECT_EQ(checked_tensor_size({}, 4)->elements, 1);  // a scalar
  EXPECT_EQ(checked_tensor_size({}, 4)->bytes, 4u);
  EXPECT_EQ(checked_tensor_size({2, 3, 4}, 2)->elements, 24);
  EXPECT_EQ(checked_tensor_size({2, 3, 4}, 2)->bytes, 48u);
  // The limit itself is allowed, a byte past it is not.
  EXPECT_EQ(checked_tensor_size({int64_t(kMaxTensorBytes)}, 1)->bytes, kMaxTensorBytes);
  EXPECT_FALSE(checked_tensor_size({int64_t(kMaxTensorBytes) + 1}, 1));
  EXPECT_FALSE(checked_tensor_size({int64_t(kMaxTensorBytes) / 2 + 1}, 2));
  EXPECT_FALSE(checked_tensor_size({-1, 4}, 4));
}

TEST(CheckedTensorSize, ZeroExtentsDoNotExcuseTheOthers) {
  EXPECT_EQ(checked_tensor_size({0, 3}, 4)->bytes, 0u);
  EXPECT_EQ(checked_tensor_size({0, 3}, 4)->elements, 0);
  // [0, 2^40, 2^40]: empty, but its strides (2^80 elements) would wrap.
  EXPECT_FALSE(checked_tensor_size({0, int64_t(1) << 40, int64_t(1) << 40}, 1));
}

// Products that wrap 2^64 to a small remainder are the danger: [2^44 + 1, 2^20] of f32 is
// 2^66 + 2^22 bytes, which wraps to 4 MiB.
TEST(CheckedTensorSize, ProductsThatWrapAreRefused) {
  EXPECT_FALSE(checked_tensor_size({(int64_t(1) << 44) + 1, int64_t(1) << 20}, 4));
  EXPECT_FALSE(checked_tensor_size({k2_32, k2_32}, 1));
  EXPECT_FALSE(checked_tensor_size({k2_32, k2_32, 2}, 1));
  EXPECT_FALSE(checked_tensor_size({kInt64Max}, 1));
  EXPECT_FALSE(checked_tensor_size({kInt64Max, kInt64Max}, 8));
  EXPECT_FALSE(checked_tensor_size({k2_62, 4}, 1));
}

// Random shapes with extents near 2^31, 2^32 and 2^63: the answer is always the exact product
// (computed in 128 bits) when it fits the limit, and nullopt when it does not.
TEST(CheckedTensorSize, AgreesWithExactArithmeticNearPowersOfTwo) {
  std::mt19937_64 rng(7);
  const int64_t centres[] = {1, 2, 255, k2_31, k2_32, kInt64Max / 2, kInt64Max};
  for (int trial = 0; trial < 20000; ++trial) {
    const size_t rank = rng() % 5;
    Shape shape;
    for (size_t d = 0; d < rank; ++d) {
      const int64_t centre = centres[rng() % std::size(centres)];
      const int64_t offset = int64_t(rng() % 5) - 2;
      shape.push_back(std::clamp<int64_t>(centre + offset, 0, kInt64Max));
    }
    const size_t elem_size = size_t(1) << (rng() % 4);
    unsigned __int128 exact = elem_size;
    bool over = false, empty = false;
    for (int64_t d : shape) {
      if (d == 0) {
        empty = true;
        continue;
      }
      exact *= uint64_t(d);
      over = over || exact > kMaxTensorBytes;
      if (over) break;
    }
    const std::optional<TensorSize> size = checked_tensor_size(shape, elem_size);
    SCOPED_TRACE(shape_str(shape) + " x " + std::to_string(elem_size));
    ASSERT_EQ(size.has_value(), !over);
    if (size) {
      EXPECT_EQ(size->bytes, empty ? 0u : uint64_t(exact));
      EXPECT_EQ(size->elements, empty ? 0 : int64_t(uint64_t(exact) / elem_size));
    }
  }
}

TEST(CheckedTensorSize, TheErrorNamesWhatTheShapeAndTheLimit) {
  const std::string message = error_message([] {
    tensor_size_or_throw({(int64_t(1) << 44) + 1, int64_t(1) << 20}, DType::f32, "Expand 'e'",
                         "output 0");
  });
  EXPECT_NE(message.find("[Expand 'e'] output 0 would be f32[17592186044417, 1048576]"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("7.38e+19 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("1.0 TiB one tensor may hold"), std::string::npos) << message;
  EXPECT_NE(error_message([] {
              tensor_size_or_throw({2, -3}, DType::f32, "w", "x");
            }).find("negative extent"),
            std::string::npos);
}

TEST(Numel, ThrowsInsteadOfWrapping) {
  EXPECT_EQ(numel({}), 1);
  EXPECT_EQ(numel({3, 0, 5}), 0);
  EXPECT_EQ(numel({k2_31, 2}), k2_32);
  EXPECT_NE(error_message([] {
              numel({k2_32, k2_32});
            }).find("overflows int64"),
            std::string::npos);
  EXPECT_NE(error_message([] { numel({2, -1}); }).find("negative extent"), std::string::npos);
}

TEST(ByteCounts, ParseAndFormat) {
  EXPECT_EQ(parse_byte_count("1", "X"), 1u);
  EXPECT_EQ(parse_byte_count("4096", "X"), 4096u);
  EXPECT_EQ(parse_byte_count("4K", "X"), 4096u);
  EXPECT_EQ(parse_byte_count("4k", "X"), 4096u);
  EXPECT_EQ(parse_byte_count("512M", "X"), size_t(512) << 20);
  EXPECT_EQ(parse_byte_count("2G", "X"), size_t(2) << 30);
  EXPECT_EQ(parse_byte_count("3g", "X"), size_t(3) << 30);
  EXPECT_EQ(parse_byte_count("1T", "X"), size_t(1) << 40);
  for (const char* bad : {"", "G", "abc", "12X", "-5", "1.5G", " 5", "5 ", "5GB", "0", "0K",
                          "99999999999999999999", "99999999999G", "9999999999T"}) {
    const std::string message =
        error_message([&] { parse_byte_count(bad, "FUSEBOX_CUDA_MEMORY_LIMIT"); });
    EXPECT_NE(message.find(std::string("FUSEBOX_CUDA_MEMORY_LIMIT='") + bad + "'"),
              std::string::npos)
        << "'" << bad << "' gave: " << message;
  }
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.0 KiB");
  EXPECT_EQ(format_bytes(size_t(256) << 20), "256.0 MiB");
  EXPECT_EQ(format_bytes((size_t(3) << 30) / 2), "1.5 GiB");
  EXPECT_EQ(format_bytes(kMaxTensorBytes), "1.0 TiB");
}

TEST(HostMemoryBudget, CountsLiveTensorsAndRefusesPastTheLimit) {
  const size_t before = host_memory_stats().in_use;
  {
    Tensor t = Tensor::empty(DType::f32, {1024, 256});  // 1 MiB
    EXPECT_EQ(host_memory_stats().in_use, before + (size_t(1) << 20));
    EXPECT_GE(host_memory_stats().peak, before + (size_t(1) << 20));
  }
  EXPECT_EQ(host_memory_stats().in_use, before);

  testing::ScopedHostMemoryLimit limit(before + (size_t(3) << 20));  // 3 MiB more than is in use
  Tensor first = Tensor::empty(DType::f32, {1024, 512});             // 2 MiB: fits
  try {
    Tensor second = Tensor::empty(DType::f32, {1024, 512});  // 2 more: does not
    ADD_FAILURE() << "a tensor past the host memory limit was allocated";
  } catch (const OutOfMemory& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("f32[1024, 512] needs 2.0 MiB (2097152 bytes)"), std::string::npos)
        << message;
    EXPECT_NE(message.find("host memory limit (--memory-limit, or FUSEBOX_CPU_MEMORY_LIMIT)"),
              std::string::npos)
        << message;
  }
  // The refusal took nothing: what is in use is the first tensor's.
  EXPECT_EQ(host_memory_stats().in_use, before + (size_t(2) << 20));
}

// Adopted bytes (a parsed model's weights) are counted as allocated ones: while held, refused
// past the limit with nothing taken, released with the last handle; the data is not moved.
TEST(HostMemoryBudget, AdoptedBytesAreCountedLikeAllocatedOnes) {
  const size_t before = host_memory_stats().in_use;
  std::string bytes(size_t(1) << 20, 'x');
  bytes[7] = 'y';
  const char* data = bytes.data();
  {
    std::shared_ptr<std::byte[]> held = adopt_host_bytes(std::move(bytes), "f32[512, 512]");
    EXPECT_EQ(static_cast<const void*>(held.get()), static_cast<const void*>(data));
    EXPECT_EQ(char(held[7]), 'y');
    EXPECT_EQ(host_memory_stats().in_use, before + (size_t(1) << 20));
  }
  EXPECT_EQ(host_memory_stats().in_use, before);
  testing::ScopedHostMemoryLimit limit(before + (size_t(1) << 20));
  try {
    adopt_host_bytes(std::string(size_t(2) << 20, 'z'), "f32[1024, 512]");
    ADD_FAILURE() << "bytes past the host memory limit were adopted";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("f32[1024, 512] needs 2.0 MiB"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(host_memory_stats().in_use, before);
}

TEST(HostMemoryBudget, TheDefaultIsBelowThePhysicalMemory) {
  const size_t limit = host_memory_stats().limit;
  EXPECT_GT(limit, size_t(64) << 20);  // any machine that builds fusebox has more
  EXPECT_LT(limit, size_t(1) << 50);
}

}  // namespace
}  // namespace fusebox
