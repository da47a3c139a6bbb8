// Data-parallel training on the CPU backend across the processes mpirun starts (ctest runs it
// with 2 and 3 ranks), each rank on its own shard of every step's samples:
//   - after 20 steps every rank holds rank 0's parameters and optimizer state, bit for bit
//     (f32 and bf16 gradient buckets);
//   - the losses (the ranks' mean) and parameters match one process training on the whole
//     step's samples (batch world * B), within f32 rounding: the averaged gradient of B-sample
//     shards is the gradient of the world * B batch.
// The model is linear (no batch norm, whose batch statistics would differ by shard). Exits
// non-zero on the first failure, naming the rank and the check.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fusebox/dist/communicator.h"
#include "fusebox/ir/builder.h"
#include "fusebox/train/session.h"

namespace {

using namespace fusebox;

int g_rank = -1;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "rank %d: FAILED: %s\n", g_rank, what.c_str());
  std::exit(1);
}

constexpr int64_t kFeatures = 24, kClasses = 5, kSamples = 96, kShard = 4;

Tensor wave(const Shape& shape, double phase) {
  std::vector<double> v(size_t(numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5 * std::sin(0.37 * double(i) + phase);
  return Tensor::from_doubles(DType::f32, shape, v);
}

// logits = x W^T + b, batch `batch`.
Graph linear(int64_t batch) {
  Graph g("linear");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {batch, kFeatures});
  const ValueId w = g.add_constant("fc.weight", wave({kClasses, kFeatures}, 0.1));
  const ValueId bias = g.add_constant("fc.bias", wave({kClasses}, 0.7));
  const ValueId logits = b.name("fc").gemm(x, w, bias, GemmAttrs{.trans_b = true});
  g.mark_output(logits);
  return g;
}

// Samples [first, first + count) of a fixed set (wrapping around), as feeds.
NamedTensors samples(int64_t first, int64_t count) {
  std::vector<double> x, y;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t s = (first + k) % kSamples;
    for (int64_t f = 0; f < kFeatures; ++f) x.push_back(std::sin(double(s * kFeatures + f)));
    y.push_back(double(s % kClasses));
  }
  return {{"x", Tensor::from_doubles(DType::f32, {count, kFeatures}, x)},
          {"labels", Tensor::from_doubles(DType::i64, {count}, y)}};
}

bool same_everywhere(dist::Communicator& world, const Tensor& t) {
  Tensor root = t.clone();
  world.broadcast(root, 0);
  return std::memcmp(root.raw(), t.raw(), t.nbytes()) == 0;
}

double relative(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-6);
}

void train_and_check(const std::shared_ptr<dist::Communicator>& world, DType reduce,
                     const OptimizerSpec& optimizer) {
  const int rank = world->rank(), n = world->world_size();
  const std::string what = cat(optimizer_name(optimizer), ", ", dtype_name(reduce), " buckets");
  SessionOptions opts;
  opts.data_parallel = {.world = world, .bucket_bytes = 256, .reduce_dtype = reduce};
  TrainingSession parallel(linear(kShard), LossSpec{}, optimizer, opts);
  TrainingSession whole(linear(kShard * n), LossSpec{}, optimizer);  // one process, batch n*B
  for (int64_t step = 0; step < 20; ++step) {
    const int64_t first = step * n * kShard;
    const float mine = parallel.step(samples(first + rank * kShard, kShard));
    const float all = whole.step(samples(first, n * kShard));
    expect(relative(mine, all) <= (reduce == DType::f32 ? 2e-6 : 2e-3),
           cat(what, ": step ", step + 1, " loss ", mine, " vs one process's ", all));
  }
  for (const auto& [name, p] : parallel.parameters()) {
    expect(same_everywhere(*world, p), cat(what, ": ", name, " differs from rank 0's"));
    // f32: each element within rounding; bf16 (each step's gradient rounded to 8 bits, 20 steps
    // of momentum): the tensor within 2% of its norm.
    const Tensor& q = whole.parameters().at(name);
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < p.numel(); ++i) {
      const double a = p.data<float>()[i], b = q.data<float>()[i];
      if (reduce == DType::f32)
        expect(std::abs(a - b) <= 1e-5 * (1 + std::abs(b)),
               cat(what, ": ", name, "[", i, "] ", a, " vs one process's ", b));
      diff += (a - b) * (a - b);
      norm += b * b;
    }
    expect(
        std::sqrt(diff) <= 2e-2 * std::sqrt(norm),
        cat(what, ": ", name, " is ", std::sqrt(diff / norm), " of its norm from one process's"));
  }
  for (const auto& [name, t] : parallel.optimizer_state())
    expect(same_everywhere(*world, t), cat(what, ": optimizer state ", name, " differs"));
}

}  // namespace

int main() {
  auto world = dist::mpi_world();
  g_rank = world->rank();
  expect(world->world_size() >= 2, "run under mpirun with 2 or more processes");
  train_and_check(world, DType::f32, SgdOptions{.lr = 0.2, .momentum = 0.9});
  train_and_check(world, DType::f32, AdamWOptions{.lr = 0.01});
  train_and_check(world, DType::bf16, SgdOptions{.lr = 0.2, .momentum = 0.9});
  world->barrier();
  if (g_rank == 0)
    std::printf(
        "mpi training: %d ranks: parameters identical on every rank, losses as one "
        "process's\n",
        world->world_size());
  return 0;
}
