#include "testing.h"

#include <stdlib.h>

#include <cstdlib>
#include <stdexcept>

#include <cmath>

#include "backends/cuda/runtime/settings.h"
#include "fusebox/passes/layout.h"

namespace fusebox::testing {
namespace {

// The settings each layer reads once per process are read again at their next use, so a
// changed variable takes effect as it would in a new process.
void reread_settings() {
  cuda::reread_settings();
  reread_layout_policy();
}

}  // namespace

Tensor random_tensor(DType dtype, const Shape& shape, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  Tensor t = Tensor::empty(dtype, shape);
  if (is_floating(dtype)) {
    std::uniform_real_distribution<double> d(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, d(rng));
  } else if (dtype == DType::boolean) {
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, double(rng() & 1));
  } else {
    std::uniform_int_distribution<int64_t> d(int64_t(std::ceil(lo)), int64_t(std::ceil(hi)) - 1);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, double(d(rng)));
  }
  return t;
}

::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol,
                                     double atol) {
  if (actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(actual.dtype()) << " vs " << dtype_name(expected.dtype());
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure()
           << "shape " << shape_str(actual.shape()) << " vs " << shape_str(expected.shape());
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    double a = actual.get(i), e = expected.get(i);
    if (std::isnan(a) || std::isnan(e)) {
      if (std::isnan(a) != std::isnan(e)) {
        ++bad;
        if (worst < 0) worst = i;
        worst_excess = INFINITY;
      }
      continue;
    }
    if (a == e) continue;  // equal infinities too
    double excess = std::fabs(a - e) - (atol + rtol * std::fabs(e));
    if (excess > 0 || std::isnan(excess)) {
      ++bad;
      if (worst < 0 || excess > worst_excess) {
        worst = i;
        worst_excess = excess;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << actual.numel() << " elements differ (rtol " << rtol << ", atol "
         << atol << "); worst at flat index " << worst << ": actual " << actual.get(worst)
         << ", expected " << expected.get(worst);
}

std::vector<Tensor> run_op(OpKind op, Attrs attrs, const std::vector<Tensor>& inputs) {
  Graph g("run_op");
  std::vector<ValueId> ids;
  NamedTensors feeds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      ids.push_back(kNoValue);
      continue;
    }
    std::string name = cat("in", i);
    ids.push_back(g.add_input(name, inputs[i].dtype(), inputs[i].shape()));
    feeds[name] = inputs[i];
  }
  std::vector<ValueId> outs = g.add_node(op, std::move(attrs), ids, "node");
  for (ValueId v : outs) g.mark_output(v);
  NamedTensors result = run_graph(g, feeds);
  std::vector<Tensor> out;
  for (ValueId v : outs) out.push_back(result.at(g.value(v).name));
  return out;
}

TempDir::TempDir(std::string_view tag) {
  std::string pattern =
      (std::filesystem::temp_directory_path() / ("fusebox_" + std::string(tag) + "_XXXXXX"))
          .string();
  if (::mkdtemp(pattern.data()) == nullptr)
    throw std::runtime_error("TempDir: mkdtemp(" + pattern + ") failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::add, ec);
  std::filesystem::remove_all(path_, ec);
}

ScopedEnv::ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
  if (const char* old = std::getenv(name)) old_ = old;
  if (value) {
    ::setenv(name, value->c_str(), 1);
  } else {
    ::unsetenv(name);
  }
  reread_settings();
}

ScopedEnv::~ScopedEnv() {
  if (old_) {
    ::setenv(name_.c_str(), old_->c_str(), 1);
  } else {
    ::unsetenv(name_.c_str());
  }
  reread_settings();
}

}  // namespace fusebox::testing
