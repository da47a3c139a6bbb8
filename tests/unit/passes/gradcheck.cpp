#include "gradcheck.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "fusebox/passes/autodiff.h"

namespace fusebox::testing::gradcheck {
namespace {

// One row of the results table.
struct Row {
  int cases = 0;
  int failed_cases = 0;
  int64_t elements = 0;
  double worst_ratio = 0;  // max |analytic - numeric| / (atol + rtol * |numeric|)
  double max_abs_error = 0;
};

std::map<std::string, Row>& results() {
  static std::map<std::string, Row> rows;
  return rows;
}

struct Built {
  Graph g{"gradcheck"};
  std::vector<ValueId> leaves;
  ValueId loss = kNoValue;
  NamedTensors feeds;
};

// The forward graph over `values` plus loss = sum_k sum(out_k * W_k).
Built build(const std::vector<Leaf>& leaves, const std::vector<Tensor>& values,
            const Forward& forward, uint64_t seed) {
  Built b;
  Builder builder(b.g);
  for (size_t i = 0; i < leaves.size(); ++i) {
    const Tensor& v = values[i];
    if (leaves[i].constant) {
      b.leaves.push_back(b.g.add_constant(leaves[i].name, v));
    } else {
      b.leaves.push_back(b.g.add_input(leaves[i].name, v.dtype(), v.shape()));
      b.feeds[leaves[i].name] = v;
    }
  }
  const std::vector<ValueId> outs = forward(builder, b.leaves);
  for (size_t k = 0; k < outs.size(); ++k) {
    ValueId out = outs[k];
    if (b.g.value(out).type.dtype != DType::f64) out = builder.cast(out, DType::f64);
    const Tensor w = random_tensor(DType::f64, b.g.value(out).type.shape, seed * 7919 + k);
    const ValueId weight = b.g.add_constant(cat("loss_weight_", k), w);
    const ValueId term = builder.reduce_sum(builder.mul(out, weight), {}, false);
    b.loss = b.loss == kNoValue ? term : builder.add(b.loss, term);
  }
  b.g.mark_output(b.loss);
  return b;
}

double run_loss(const Built& b) {
  return run_graph(b.g, b.feeds).at(b.g.value(b.loss).name).get(0);
}

// Which elements of a leaf to check: all, or a seeded random subset.
std::vector<int64_t> elements_to_check(int64_t numel, int max_elements, uint64_t seed) {
  std::vector<int64_t> idx(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) idx[size_t(i)] = i;
  if (numel > max_elements) {
    std::mt19937_64 rng(seed);
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(size_t(max_elements));
    std::sort(idx.begin(), idx.end());
  }
  return idx;
}

struct Mismatch {
  std::string leaf;
  int64_t index;
  double analytic, numeric, ratio;
};

}  // namespace

::testing::AssertionResult check_gradients(const std::vector<Leaf>& leaves, const Forward& forward,
                                           const CheckOptions& opts) {
  std::vector<Tensor> values;
  for (const Leaf& l : leaves) values.push_back(l.value);

  // Analytic: one run of forward + backward.
  Built b = build(leaves, values, forward, opts.seed);
  std::vector<ValueId> wrt;
  for (size_t i = 0; i < leaves.size(); ++i)
    if (leaves[i].differentiate) wrt.push_back(b.leaves[i]);
  GradOptions go;
  go.mark_outputs = true;
  const GradResult r = grad(b.g, b.loss, wrt, go);
  b.g.verify();  // the appended backward graph keeps every graph invariant
  const NamedTensors result = run_graph(b.g, b.feeds);

  Row& row = results()[opts.op];
  ++row.cases;
  std::vector<Mismatch> bad;
  int64_t checked = 0;
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (!leaves[i].differentiate) continue;
    const Tensor& analytic = result.at(b.g.value(r.of(b.leaves[i])).name);
    if (analytic.dtype() != values[i].dtype() || analytic.shape() != values[i].shape()) {
      ++row.failed_cases;
      return ::testing::AssertionFailure()
             << opts.config << ": the gradient of " << leaves[i].name << " is "
             << dtype_name(analytic.dtype()) << " " << shape_str(analytic.shape())
             << " but the leaf is " << dtype_name(values[i].dtype()) << " "
             << shape_str(values[i].shape());
    }
    for (int64_t j : elements_to_check(values[i].numel(), opts.max_elements, opts.seed + i)) {
      std::vector<Tensor> perturbed = values;
      perturbed[i] = values[i].clone();
      const double x = values[i].get(j);
      perturbed[i].set(j, x + opts.tol.h);
      const double x_plus = perturbed[i].get(j);  // as stored (f32 leaves round)
      const double loss_plus = run_loss(build(leaves, perturbed, forward, opts.seed));
      perturbed[i].set(j, x - opts.tol.h);
      const double x_minus = perturbed[i].get(j);
      const double loss_minus = run_loss(build(leaves, perturbed, forward, opts.seed));
      const double numeric = (loss_plus - loss_minus) / (x_plus - x_minus);
      const double a = analytic.get(j);
      const double err = std::fabs(a - numeric);
      const double ratio =
          std::isnan(err) ? INFINITY : err / (opts.tol.atol + opts.tol.rtol * std::fabs(numeric));
      row.worst_ratio = std::max(row.worst_ratio, ratio);
      row.max_abs_error = std::max(row.max_abs_error, std::isnan(err) ? INFINITY : err);
      ++checked;
      if (ratio > 1) bad.push_back({leaves[i].name, j, a, numeric, ratio});
    }
  }
  row.elements += checked;
  if (bad.empty()) return ::testing::AssertionSuccess();
  ++row.failed_cases;
  std::sort(bad.begin(), bad.end(),
            [](const Mismatch& x, const Mismatch& y) { return x.ratio > y.ratio; });
  auto failure = ::testing::AssertionFailure();
  failure << opts.config << ": " << bad.size() << " of " << checked
          << " gradient elements differ from finite differences (h " << opts.tol.h << ", rtol "
          << opts.tol.rtol << ", atol " << opts.tol.atol << "); worst:";
  for (size_t k = 0; k < std::min<size_t>(bad.size(), 6); ++k) {
    failure << "\n  " << bad[k].leaf << "[" << bad[k].index << "]: analytic " << bad[k].analytic
            << ", numeric " << bad[k].numeric;
  }
  return failure;
}

Leaf input(const std::string& name, const Shape& shape, uint64_t seed, double lo, double hi) {
  return {name, random_tensor(DType::f64, shape, seed, lo, hi), false, true};
}

Leaf param(const std::string& name, const Shape& shape, uint64_t seed, double lo, double hi) {
  return {name, random_tensor(DType::f64, shape, seed, lo, hi), true, true};
}

Tensor away_from_zero(const Shape& shape, uint64_t seed, double lo, double hi) {
  Tensor t = random_tensor(DType::f64, shape, seed, lo, hi);
  std::mt19937_64 rng(seed ^ 0x5bd1e995);
  for (int64_t i = 0; i < t.numel(); ++i)
    if (rng() & 1) t.set(i, -t.get(i));
  return t;
}

std::string results_table() {
  std::ostringstream os;
  os << "| op | cases | elements checked | worst error / tolerance | max abs error | result |\n";
  os << "|---|---:|---:|---:|---:|---|\n";
  for (const auto& [op, row] : results()) {
    char ratio[32], abs_err[32];
    std::snprintf(ratio, sizeof ratio, "%.3g", row.worst_ratio);
    std::snprintf(abs_err, sizeof abs_err, "%.2g", row.max_abs_error);
    os << "| " << op << " | " << row.cases << " | " << row.elements << " | " << ratio << " | "
       << abs_err << " | "
       << (row.failed_cases == 0 ? "pass" : cat("FAIL (", row.failed_cases, " cases)")) << " |\n";
  }
  return os.str();
}

namespace {

// With FUSEBOX_GRADCHECK_TABLE=<path>, writes the results table there at exit (the
// source of docs/gradient_checks.md).
class TableWriter : public ::testing::Environment {
 public:
  void TearDown() override {
    const char* path = std::getenv("FUSEBOX_GRADCHECK_TABLE");
    if (path == nullptr || *path == '\0') return;
    std::ofstream(path) << results_table();
  }
};

[[maybe_unused]] ::testing::Environment* const kTableWriter =
    ::testing::AddGlobalTestEnvironment(new TableWriter);

}  // namespace

}  // namespace fusebox::testing::gradcheck
