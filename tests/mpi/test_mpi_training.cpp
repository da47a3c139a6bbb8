// Data-parallel training on the CPU backend across the processes mpirun starts (ctest runs it
// with 2 and 3 ranks), each rank on its own shard of every step's samples:
//   - after 20 steps every rank holds rank 0's parameters and optimizer state, bit for bit
//     (f32 and bf16 gradient buckets);
//   - the losses (the ranks' mean) and parameters match one process training on the whole
//     step's samples (batch world * B), within f32 rounding: the averaged gradient of B-sample
//     shards is the gradient of the world * B batch;
//   - with synchronized batch norm, a batch-norm model on B-image shards trains as one
//     process with plain batch norm on the world * B batch.
// The model is linear (no batch norm, whose batch statistics would differ by shard) but in the
// sync batch norm check. Exits non-zero on the first failure, naming the rank and the check.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fusebox/dist/communicator.h"
#include "fusebox/ir/builder.h"
#include "fusebox/train/data.h"
#include "fusebox/train/data_parallel.h"
#include "fusebox/train/session.h"
#include "fusebox/zoo.h"

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

// small_cnn (two batch norms) with synchronized batch norm on B-image shards against one
// process with plain batch norm on the whole n * B batch: the same statistics, so the same
// losses and parameters up to rounding; every rank's parameters and running statistics rank 0's.
void train_sync_batch_norm(const std::shared_ptr<dist::Communicator>& world) {
  const int rank = world->rank(), n = world->world_size();
  const int64_t shard = 4;
  auto model = [](int64_t batch) {
    return build_zoo_model(
        "small_cnn",
        {.batch = batch, .image_size = 8, .num_classes = 10, .seed = 3, .training = true});
  };
  const Dataset data = synthetic_dataset(48, 3, 8, 10, 7);
  const BatchSampler shards(data, shard, false, 0), whole_batches(data, shard * n, false, 0);
  SessionOptions opts;
  opts.data_parallel = {.world = world, .sync_batch_norm = true};
  const SgdOptions sgd{.lr = 0.05, .momentum = 0.9};
  TrainingSession parallel(model(shard), LossSpec{}, sgd, opts);
  TrainingSession whole(model(shard * n), LossSpec{}, sgd);
  for (int64_t step = 0; step < 10; ++step) {
    auto [x, y] = shards.batch(shard_batch_index(step, rank, n));
    auto [wx, wy] = whole_batches.batch(step);
    const float mine = parallel.step({{"input", x}, {"labels", y}});
    const float all = whole.step({{"input", wx}, {"labels", wy}});
    expect(relative(mine, all) <= 1e-4,
           cat("sync batch norm: step ", step + 1, " loss ", mine, " vs one process's ", all));
  }
  auto close = [&](const NamedTensors& got, const NamedTensors& want, const char* kind) {
    for (const auto& [name, p] : got) {
      expect(same_everywhere(*world, p), cat("sync batch norm: ", kind, " ", name, " differs"));
      const Tensor& q = want.at(name);
      double diff = 0, norm = 0;
      for (int64_t i = 0; i < p.numel(); ++i) {
        const double a = p.data<float>()[i], b = q.data<float>()[i];
        diff += (a - b) * (a - b);
        norm += b * b;
      }
      expect(std::sqrt(diff) <= 1e-4 * std::sqrt(norm) + 1e-7,
             cat("sync batch norm: ", kind, " ", name, " is ", std::sqrt(diff / norm),
                 " of its norm from one process's"));
    }
  };
  close(parallel.parameters(), whole.parameters(), "parameter");
  close(parallel.buffers(), whole.buffers(), "running statistic");
}

}  // namespace

int main() {
  auto world = dist::mpi_world();
  g_rank = world->rank();
  expect(world->world_size() >= 2, "run under mpirun with 2 or more processes");
  train_and_check(world, DType::f32, SgdOptions{.lr = 0.2, .momentum = 0.9});
  train_and_check(world, DType::f32, AdamWOptions{.lr = 0.01});
  train_and_check(world, DType::bf16, SgdOptions{.lr = 0.2, .momentum = 0.9});
  train_sync_batch_norm(world);
  world->barrier();
  if (g_rank == 0)
    std::printf(
        "mpi training: %d ranks: parameters identical on every rank, losses as one "
        "process's (sync batch norm too)\n",
        world->world_size());
  return 0;
}
