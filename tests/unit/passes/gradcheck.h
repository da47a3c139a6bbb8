// Gradient checking for autodiff: the analytic gradient (grad() on the graph, run on
// the CPU backend) against central finite differences of the whole forward graph.
//
// The forward graph is built over "leaves" (graph inputs or constants). Its outputs
// are folded into one scalar loss = sum_k sum(out_k * W_k) with fixed random W_k, so
// every output element matters. For each leaf being differentiated, each checked
// element e is perturbed and the forward graph re-run (constants: the graph rebuilt
// with the perturbed tensor):
//   numeric = (loss(e + h) - loss(e - h)) / (2h)
// and |analytic - numeric| <= atol + rtol * |numeric| must hold.
//
// Tolerances (f64): h = 1e-6, rtol = 1e-5, atol = 1e-7. Central differences err by
// O(h^2 * f''') ~ 1e-12 (truncation) plus ~eps * |loss| / h ~ 1e-9 for |loss| ~ 10
// (rounding), far inside the bounds; a wrong rule errs by O(1). Non-smooth ops (relu,
// abs, clip, max, min, max_pool, reduce_max) are checked at random points, which lie
// farther than h from a kink with probability ~1 - 1e-6 per element. A check through
// an f32 value (cast) uses the looser tolerance it states.
#pragma once

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "testing.h"

namespace fusebox::testing::gradcheck {

struct Leaf {
  std::string name;
  Tensor value;
  bool constant = false;      // a graph constant (a parameter) rather than a graph input
  bool differentiate = true;  // ask for (and check) its gradient; float leaves only
};

// Builds the forward graph from the leaves' ids (in order); returns the float values
// the loss reads.
using Forward = std::function<std::vector<ValueId>(Builder& b, const std::vector<ValueId>& leaves)>;

struct Tolerance {
  double h = 1e-6;
  double rtol = 1e-5;
  double atol = 1e-7;
};

struct CheckOptions {
  std::string op;      // the row of the results table ("conv", ...)
  std::string config;  // what this case is, for messages
  Tolerance tol;
  int max_elements = 48;  // per leaf: all when it has no more, else a random subset
  uint64_t seed = 1;      // loss weights and the element subset
};

// Runs the check; the failure message lists the worst elements. Every call is
// recorded for the results table (see write_table).
::testing::AssertionResult check_gradients(const std::vector<Leaf>& leaves, const Forward& forward,
                                           const CheckOptions& opts);

// Leaf helpers: a random f64 tensor in [lo, hi), as a graph input or a constant.
Leaf input(const std::string& name, const Shape& shape, uint64_t seed, double lo = -1.0,
           double hi = 1.0);
Leaf param(const std::string& name, const Shape& shape, uint64_t seed, double lo = -1.0,
           double hi = 1.0);
// A random f64 tensor whose elements have magnitude in [lo, hi) and a random sign.
Tensor away_from_zero(const Shape& shape, uint64_t seed, double lo, double hi);

// Uniform integer in [lo, hi].
inline int64_t pick(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}
inline bool coin(std::mt19937_64& rng) {
  return pick(rng, 0, 1) == 1;
}

// The results recorded so far as a markdown table (one row per op).
std::string results_table();

}  // namespace fusebox::testing::gradcheck
