// Mutation tests: damaged .npy, .npz and .pb bytes must either read or throw
// fusebox::Error; never crash, hang or throw anything else (this also runs under ASan).
#include <cstdio>
#include <functional>
#include <random>

#include "fusebox/io/tensor_file.h"
#include "io/tensor_proto.h"
#include "io_test_util.h"
#include "testing.h"

namespace fusebox {
namespace {

constexpr int kMutations = 500;

// Damages `bytes`: flips 1-8 random bytes, truncates, or both.
std::string mutate(const std::string& bytes, std::mt19937_64& rng) {
  std::string out = bytes;
  const int kind = int(rng() % 3);
  if (kind != 1) {
    const int flips = 1 + int(rng() % 8);
    for (int i = 0; i < flips && !out.empty(); ++i) {
      out[rng() % out.size()] = char(rng() % 4 == 0 ? 0xff : rng());
    }
  }
  if (kind != 0) out.resize(rng() % (out.size() + 1));
  return out;
}

// Runs `read` on kMutations damaged copies of `good`; returns how many still read.
int fuzz(const std::string& good, uint64_t seed,
         const std::function<void(const std::string&)>& read) {
  std::mt19937_64 rng(seed);
  int succeeded = 0, refused = 0;
  for (int i = 0; i < kMutations; ++i) {
    const std::string damaged = mutate(good, rng);
    try {
      read(damaged);
      ++succeeded;
    } catch (const Error&) {
      ++refused;  // the expected outcome for most mutations
    } catch (const std::exception& e) {
      ADD_FAILURE() << "mutation " << i << " threw a non-fusebox exception: " << e.what();
    }
  }
  std::printf("%d of %d damaged copies read, %d refused\n", succeeded, kMutations, refused);
  EXPECT_EQ(succeeded + refused, kMutations);
  return succeeded;
}

TEST(Fuzz, Npy) {
  const std::string good = serialize_npy(testing::random_tensor(DType::f32, {3, 4}, 1));
  const int ok = fuzz(good, 11, [](const std::string& b) { parse_npy(b, "fuzz"); });
  // Flips that land in the data still read; flips in the header or truncation do not.
  EXPECT_GT(ok, 0);
  EXPECT_LT(ok, kMutations);
  const std::string fortran = std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
                              "{'descr': '>i8', 'fortran_order': True, 'shape': (2, 3, 2), }" +
                              std::string(56, ' ') + "\n" + std::string(96, '\x01');
  ASSERT_EQ(parse_npy(fortran, "t").numel(), 12);
  fuzz(fortran, 12, [](const std::string& b) { parse_npy(b, "fuzz"); });
}

TEST(Fuzz, Npz) {
  const std::map<std::string, Tensor> arrays = {
      {"a", testing::random_tensor(DType::f32, {3, 4}, 1)},
      {"b", testing::random_tensor(DType::i64, {5}, 2, -9, 9)},
      {"c", testing::random_tensor(DType::boolean, {2, 2}, 3)}};
  for (bool compress : {false, true}) {
    const std::string good = serialize_npz(arrays, compress);
    const int ok =
        fuzz(good, compress ? 21 : 22, [](const std::string& b) { parse_npz(b, "fuzz"); });
    EXPECT_LT(ok, kMutations);
  }
  const std::string numpy = read_file(iotest::fixture("savez_compressed.npz"));
  fuzz(numpy, 23, [](const std::string& b) { parse_npz(b, "fuzz"); });
}

TEST(Fuzz, TensorProto) {
  onnx::TensorProto p;
  tensor_to_proto(testing::random_tensor(DType::f32, {2, 3}, 1), "x", &p);
  const std::string good = p.SerializeAsString();
  fuzz(good, 31, [](const std::string& b) {
    onnx::TensorProto q;
    if (q.ParseFromString(b)) tensor_from_proto(q, "fuzz");
  });
}

}  // namespace
}  // namespace fusebox
