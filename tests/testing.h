// Helpers shared by the tests: seeded random tensors, closeness checks, and
// running one node on the CPU backend.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "fusebox/core/error.h"
#include "fusebox/core/memory.h"

#include "fusebox/ir/builder.h"
#include "fusebox/runtime/executor.h"

namespace fusebox::testing {

// Uniform in [lo, hi), rounded to `dtype`. Integer dtypes get integers in [lo, hi).
Tensor random_tensor(DType dtype, const Shape& shape, uint64_t seed, double lo = -1.0,
                     double hi = 1.0);

// |a - b| <= atol + rtol * |b| elementwise, same dtype and shape; NaN only matches NaN.
// On failure, reports the count of mismatches and the worst element with its index.
::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol,
                                     double atol);

// Builds a one-node graph over `inputs` (each becomes a graph input, or kNoValue when
// undefined), runs it on the CPU backend and returns every output.
std::vector<Tensor> run_op(OpKind op, Attrs attrs, const std::vector<Tensor>& inputs);

// ||got - want|| / ||want|| over all elements, in f64.
inline double relative_l2(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = got.to_doubles(), w = want.to_doubles();
  EXPECT_EQ(g.size(), w.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g.size() && i < w.size(); ++i) {
    diff += (g[i] - w[i]) * (g[i] - w[i]);
    norm += w[i] * w[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-300);
}

// How many nodes of `op` the graph holds.
inline int count_ops(const Graph& g, OpKind op) {
  int n = 0;
  for (const Node& node : g.nodes()) n += node.op == op;
  return n;
}

// A fresh empty directory under the system's temporary directory ("fusebox_<tag>_XXXXXX"),
// removed with everything in it at the end of the scope (owner permissions restored first,
// so a test may make it read-only).
class TempDir {
 public:
  explicit TempDir(std::string_view tag = "test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// Sets (or, with std::nullopt, unsets) an environment variable until the end of the scope.
// Settings read once per process (the CUDA backend's, FUSEBOX_LAYOUT) are read again at their
// next use, on entry and on exit; FUSEBOX_NUM_THREADS is not (the pool has started).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Sets the host memory budget's limit (core/memory.h) until the end of the scope, then puts the
// default back.
class ScopedHostMemoryLimit {
 public:
  explicit ScopedHostMemoryLimit(size_t bytes) { set_host_memory_limit(bytes); }
  ~ScopedHostMemoryLimit() { set_host_memory_limit(std::nullopt); }
  ScopedHostMemoryLimit(const ScopedHostMemoryLimit&) = delete;
  ScopedHostMemoryLimit& operator=(const ScopedHostMemoryLimit&) = delete;
};

// The message of the fusebox::Error that `f` throws; otherwise a text saying what happened
// instead (which no expectation matches).
template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a fusebox::Error: ") + e.what() + ">";
  }
  return "<no error>";
}

}  // namespace fusebox::testing
