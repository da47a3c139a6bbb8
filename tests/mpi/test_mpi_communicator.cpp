// The CPU backend's collectives (dist/mpi_communicator.cpp) across the processes mpirun
// starts (ctest runs it with 2 and with 3): sums of every supported dtype against the sums
// computed here, the same bits on every rank (each compares its result with rank 0's),
// broadcast from a rank other than 0, all_gather, an unsupported dtype as an Error. Exits non-zero
// on the first failure, naming the rank and the check.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fusebox/core/error.h"
#include "fusebox/dist/communicator.h"

namespace {

using fusebox::DType;
using fusebox::Tensor;

int g_rank = -1;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "rank %d: FAILED: %s\n", g_rank, what.c_str());
  std::exit(1);
}

// Whether every rank's `t` has rank 0's bytes.
bool same_everywhere(fusebox::dist::Communicator& world, const Tensor& t) {
  Tensor root = Tensor::empty(t.dtype(), t.shape());
  std::memcpy(root.raw(), t.raw(), t.nbytes());
  world.broadcast(root, 0);
  return std::memcmp(root.raw(), t.raw(), t.nbytes()) == 0;
}

}  // namespace

int main() {
  auto world = fusebox::dist::mpi_world();
  g_rank = world->rank();
  const int n = world->world_size();
  expect(n >= 2, "run under mpirun with 2 or more processes");

  // f32: rank r holds (r + 1) * sin(i); the sum is (1 + ... + n) * sin(i) up to rounding.
  const int count = 100003;  // odd, not a power of two
  std::vector<float> mine(count);
  for (int i = 0; i < count; ++i) mine[size_t(i)] = float(g_rank + 1) * std::sin(float(i));
  Tensor f = Tensor::from_vector<float>({count}, mine);
  world->all_reduce_sum(f);
  const float ranks_sum = float(n * (n + 1) / 2);
  for (int i = 0; i < count; ++i) {
    const float want = ranks_sum * std::sin(float(i));
    expect(std::fabs(f.data<float>()[i] - want) <= 1e-5f * (1 + std::fabs(want)),
           "f32 sum at " + std::to_string(i));
  }
  expect(same_everywhere(*world, f), "f32 sums differ between ranks");

  // Exact cases: i64, f64 of integers, bf16 of small integers (summed in f32, rounded once).
  Tensor i = Tensor::from_vector<int64_t>({3}, {int64_t(g_rank), int64_t(1) << 40, -7});
  world->all_reduce_sum(i);
  expect(i.data<int64_t>()[0] == n * (n - 1) / 2 && i.data<int64_t>()[1] == (int64_t(n) << 40) &&
             i.data<int64_t>()[2] == -7 * n,
         "i64 sums");
  Tensor d = Tensor::from_vector<double>({2}, {0.5 * g_rank, 1e300});
  world->all_reduce_sum(d);
  expect(d.data<double>()[0] == 0.25 * n * (n - 1) && d.data<double>()[1] == n * 1e300, "f64 sums");
  Tensor b = Tensor::from_doubles(DType::bf16, {4}, {1, 2, 3, double(g_rank)});
  world->all_reduce_sum(b);
  const Tensor bf = b.cast(DType::f32);
  expect(bf.data<float>()[0] == float(n) && bf.data<float>()[2] == float(3 * n) &&
             bf.data<float>()[3] == float(n * (n - 1) / 2),
         "bf16 sums");

  // Broadcast from the last rank.
  Tensor v = Tensor::from_vector<float>({2}, {float(g_rank), -1.0f});
  world->broadcast(v, n - 1);
  expect(v.data<float>()[0] == float(n - 1), "broadcast from rank n - 1");

  // All-gather: [world, 2, 3] with rank r's values at [r] on every rank, f64 exactly.
  std::vector<double> own(6);
  for (size_t k = 0; k < own.size(); ++k) own[k] = g_rank * 10.0 + double(k) / 3.0;
  const Tensor gathered = world->all_gather(Tensor::from_doubles(DType::f64, {2, 3}, own));
  expect(gathered.shape() == fusebox::Shape({n, 2, 3}), "all_gather's shape is [world, 2, 3]");
  bool gathered_ok = true;
  for (int r = 0; r < n; ++r)
    for (size_t k = 0; k < own.size(); ++k)
      gathered_ok = gathered_ok && gathered.data<double>()[size_t(r) * own.size() + k] ==
                                       r * 10.0 + double(k) / 3.0;
  expect(gathered_ok, "all_gather puts rank r's values at [r]");

  // An unsupported dtype is an Error, on every rank alike (nothing was sent).
  bool threw = false;
  try {
    Tensor flags = Tensor::zeros(DType::boolean, {4});
    world->all_reduce_sum(flags);
  } catch (const fusebox::Error& e) {
    threw = std::string(e.what()).find("not supported") != std::string::npos;
  }
  expect(threw, "an all_reduce_sum of bools must be an Error naming it");

  world->barrier();
  if (g_rank == 0) std::printf("mpi communicator: %d ranks: all checks passed\n", n);
  return 0;
}
