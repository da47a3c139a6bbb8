// Data-parallel training in one process (docs/distributed.md): the all_reduce op (ops.h) on
// the CPU and the GPU, the step graph's buckets and their places, and sessions over worlds
// whose ranks all hold this process's values ("mirror" worlds: a sum is world-size times the
// values, so a mean gives them back exactly for 2 and 4 ranks) trained against sessions
// without a world, bit for bit. Several real ranks: tests/mpi (CPU, mpirun) and the GPU runs
// of `fusebox train --gpus N` (bench/results).
#include <gtest/gtest.h>

#include <algorithm>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "fusebox/backends/cuda.h"
#include "fusebox/runtime/executable.h"
#include "fusebox/train/data_parallel.h"
#include "train_test_util.h"

namespace fusebox::testing {
namespace {

// `ranks` ranks, every one holding this process's tensors: the sum of `t` is ranks * t,
// computed in f32 and rounded once (the Communicator contract).
// The Error the statement (the arguments after `text`) throws holds `text`.
#define EXPECT_THROW_WITH(text, ...)                                                   \
  EXPECT_NE(error_message([&] { (void)(__VA_ARGS__); }).find(text), std::string::npos) \
      << error_message([&] { (void)(__VA_ARGS__); })

class MirrorWorld final : public dist::Communicator {
 public:
  explicit MirrorWorld(int ranks) : ranks_(ranks) {}
  int rank() const override { return 0; }
  int world_size() const override { return ranks_; }
  void all_reduce_sum(Tensor& t) override {
    ++sums;
    const Tensor wide = t.cast(DType::f32);
    std::vector<double> values;
    for (int64_t i = 0; i < wide.numel(); ++i)
      values.push_back(double(float(ranks_) * wide.data<float>()[i]));
    const Tensor sum = Tensor::from_doubles(DType::f32, t.shape(), values).cast(t.dtype());
    std::memcpy(t.raw(), sum.raw(), sum.nbytes());
  }
  Tensor all_gather(const Tensor& t) override {  // every rank holds this rank's t
    ++gathers;
    Shape shape = t.shape();
    shape.insert(shape.begin(), ranks_);
    Tensor all = Tensor::empty(t.dtype(), shape);
    for (int r = 0; r < ranks_; ++r)
      std::memcpy(static_cast<char*>(all.raw()) + size_t(r) * t.nbytes(), t.raw(), t.nbytes());
    return all;
  }
  void broadcast(Tensor&, int) override { ++broadcasts; }
  void barrier() override {}
  void abort() override {}
  int sums = 0, gathers = 0, broadcasts = 0;

 private:
  int ranks_;
};

Graph all_reduce_graph(DType dtype, const Shape& a_shape, const Shape& b_shape,
                       AllReduceAttrs attrs) {
  Graph g("all_reduce");
  const ValueId a = g.add_input("a", dtype, a_shape);
  const ValueId b = g.add_input("b", DType::f32, b_shape);
  const std::vector<ValueId> outs =
      g.add_node(OpKind::all_reduce, attrs, {a, b}, "bucket", {"a_sum", "b_sum"});
  g.mark_output(outs[0]);
  g.mark_output(outs[1]);
  return g;
}

TEST(AllReduce, InfersItsInputsTypesAndRefusesWhatItCannotSum) {
  Graph g = all_reduce_graph(DType::bf16, {2, 3}, {7}, {});
  EXPECT_EQ(g.value(g.outputs()[0]).type, (TensorType{DType::bf16, {2, 3}}));
  EXPECT_EQ(g.value(g.outputs()[1]).type, (TensorType{DType::f32, {7}}));
  EXPECT_THROW_WITH("bucket", all_reduce_graph(DType::i64, {2}, {2}, {}));
  EXPECT_THROW_WITH("reduce_dtype f64 must be f32, bf16 or f16",
                    all_reduce_graph(DType::f32, {2}, {2}, {.reduce_dtype = DType::f64}));
}

TEST(AllReduce, CpuSumsThroughTheWorldRoundingThroughTheReduceDtype) {
  const Tensor a = random_tensor(DType::f32, {4, 5}, 1), b = random_tensor(DType::f32, {9}, 2);
  // No world: the values come back, rounded through reduce_dtype.
  for (DType reduce : {DType::f32, DType::bf16}) {
    NamedTensors out = run_graph(
        all_reduce_graph(DType::f32, {4, 5}, {9}, {.reduce_dtype = reduce}), {{"a", a}, {"b", b}});
    EXPECT_TRUE(same_bits(out["a_sum"], a.cast(reduce).cast(DType::f32))) << dtype_name(reduce);
    EXPECT_TRUE(same_bits(out["b_sum"], b.cast(reduce).cast(DType::f32))) << dtype_name(reduce);
  }
  // Three mirrored ranks: sum = bf16(3 * bf16(x)); mean = that times f32(1/3).
  for (bool mean : {false, true}) {
    auto world = std::make_shared<MirrorWorld>(3);
    CompileOptions co{.communicator = world};
    auto exe = Executable::compile(
        all_reduce_graph(DType::f32, {4, 5}, {9}, {.mean = mean, .reduce_dtype = DType::bf16}), co);
    NamedTensors out = exe->run({{"a", a}, {"b", b}});
    EXPECT_EQ(world->sums, 1);  // one bucket, one collective
    const Tensor a16 = a.cast(DType::bf16).cast(DType::f32);
    for (int64_t i = 0; i < a.numel(); ++i) {
      const float sum = float(Tensor::scalar(DType::bf16, 3.0f * a16.data<float>()[i]).get(0));
      const float want = mean ? sum * (1.0f / 3.0f) : sum;
      ASSERT_EQ(out["a_sum"].data<float>()[i], want) << i << (mean ? " mean" : " sum");
    }
  }
}

// The step graph of a data-parallel session: buckets in the order the backward pass writes
// the gradients, each right after its last gradient's writer, the loss averaged too, and
// every update reading an average.
TEST(DataParallelStepGraph, BucketsFollowTheBackwardPassAndFeedEveryUpdate) {
  for (size_t bucket_bytes : {size_t(1), size_t(25) << 20}) {
    SessionOptions opts;
    opts.data_parallel = {.world = std::make_shared<MirrorWorld>(2), .bucket_bytes = bucket_bytes};
    TrainingSession session(small_cnn(2, 8), LossSpec{}, SgdOptions{.lr = 0.1, .momentum = 0.9},
                            opts);
    const Graph& g = session.step_graph();
    const size_t params = session.parameter_names().size();
    // One bucket per gradient (1 byte closes every bucket) or one in all; plus the loss.
    EXPECT_EQ(count_ops(g, OpKind::all_reduce), bucket_bytes == 1 ? int(params) + 1 : 2);
    for (const Node& n : g.nodes()) {
      if (n.op == OpKind::all_reduce) {
        NodeId last = -1;
        for (ValueId v : n.inputs) last = std::max(last, g.value(v).producer);
        for (NodeId k = last + 1; k < n.id; ++k)  // only collectives in between
          EXPECT_EQ(g.node(k).op, OpKind::all_reduce) << n.name << " after " << g.node(k).name;
      }
      if (n.op == OpKind::sgd_update) {
        const ValueId grad = n.inputs[1];
        EXPECT_EQ(g.node(g.value(grad).producer).op, OpKind::all_reduce) << n.name;
      }
    }
    const ValueId loss = *g.find_value("__loss__");
    EXPECT_EQ(g.node(g.value(loss).producer).op, OpKind::all_reduce);
  }
}

// Two and four mirrored ranks average to this process's own gradients exactly: the same
// losses and parameters as a session without a world, bit for bit, for each optimizer and
// f16's loss scaling; the initial state is broadcast from rank 0.
TEST(DataParallelSession, MirroredRanksTrainBitForBitAsOneProcess) {
  struct Case {
    OptimizerSpec optimizer;
    Precision precision;
    int ranks;
  };
  const Case cases[] = {{SgdOptions{.lr = 0.1, .momentum = 0.9}, Precision::f32, 2},
                        {AdamWOptions{.lr = 0.01}, Precision::f32, 4},
                        {SgdOptions{.lr = 0.05, .momentum = 0.9}, Precision::f16, 2}};
  const Dataset data = synthetic_dataset(16, 3, 8, 10, 7);
  const BatchSampler sampler(data, 4, false, 0);
  for (const Case& c : cases) {
    SCOPED_TRACE(
        cat(optimizer_name(c.optimizer), " ", precision_name(c.precision), " ", c.ranks, " ranks"));
    auto world = std::make_shared<MirrorWorld>(c.ranks);
    SessionOptions parallel{.precision = c.precision};
    parallel.data_parallel = {.world = world, .bucket_bytes = 2048};
    TrainingSession a(small_cnn(4, 8), LossSpec{}, c.optimizer, {.precision = c.precision});
    TrainingSession b(small_cnn(4, 8), LossSpec{}, c.optimizer, parallel);
    EXPECT_EQ(world->broadcasts, int(a.parameter_names().size() + a.buffers().size()));
    for (int64_t i = 0; i < 4; ++i) {
      const float la = a.step(zoo_batch(sampler, i)), lb = b.step(zoo_batch(sampler, i));
      EXPECT_TRUE(same_bits(la, lb)) << "step " << i << ": " << la << " vs " << lb;
    }
    EXPECT_TRUE(same_tensors(a.parameters(), b.parameters()));
    EXPECT_TRUE(same_tensors(a.optimizer_state(), b.optimizer_state()));
    EXPECT_GT(world->sums, 4 * 2);  // buckets and the loss, every step
  }
}

// Synchronized batch norm in a mirror world (every rank the same shard: the whole batch's
// statistics are this process's) trains as plain batch norm, up to the f64 merge's rounding:
// every batch norm and its backward carry `sync`, and each exchanges its per-channel totals
// (one all_gather forward, one backward, per batch norm); the running statistics follow.
TEST(DataParallelSession, SyncBatchNormInAMirrorWorldTrainsAsPlainBatchNorm) {
  const Dataset data = synthetic_dataset(16, 3, 8, 10, 7);
  const BatchSampler sampler(data, 4, false, 0);
  for (Precision precision : {Precision::f32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(precision));
    auto world = std::make_shared<MirrorWorld>(2);
    SessionOptions sync{.precision = precision};
    sync.data_parallel = {.world = world, .sync_batch_norm = true};
    TrainingSession a(small_cnn(4, 8), LossSpec{}, SgdOptions{.lr = 0.1, .momentum = 0.9},
                      {.precision = precision});
    TrainingSession b(small_cnn(4, 8), LossSpec{}, SgdOptions{.lr = 0.1, .momentum = 0.9}, sync);
    const Graph& g = b.step_graph();
    int synced = 0;
    for (const Node& n : g.nodes())
      if (n.op == OpKind::batch_norm || n.op == OpKind::batch_norm_backward)
        synced += std::get<BatchNormAttrs>(n.attrs).sync ? 1 : 0;
    EXPECT_EQ(synced, 2 * 2);                            // 2 batch norms, forward and backward
    EXPECT_EQ(count_ops(g, OpKind::all_reduce), 1 + 1);  // a gradient bucket and the loss
    const double tolerance = precision == Precision::f32 ? 1e-6 : 1e-2;
    for (int64_t i = 0; i < 4; ++i) {
      const float la = a.step(zoo_batch(sampler, i)), lb = b.step(zoo_batch(sampler, i));
      EXPECT_NEAR(lb, la, tolerance * std::abs(la)) << "step " << i;
    }
    for (const auto& [name, t] : a.parameters())
      EXPECT_TRUE(all_close(b.parameters().at(name), t, 10 * tolerance, 10 * tolerance)) << name;
    for (const auto& [name, t] : a.buffers())
      EXPECT_TRUE(all_close(b.buffers().at(name), t, 10 * tolerance, 10 * tolerance)) << name;
    EXPECT_EQ(world->gathers, 4 * 2 * 2);  // 4 steps, 2 batch norms, forward and backward
  }
}

TEST(DataParallelSession, RefusesAReduceDtypeItDoesNotOffer) {
  SessionOptions opts;
  opts.data_parallel = {.world = std::make_shared<MirrorWorld>(2), .reduce_dtype = DType::f16};
  EXPECT_THROW_WITH("data_parallel.reduce_dtype must be f32 or bf16, got f16",
                    TrainingSession(small_cnn(2, 8), LossSpec{}, SgdOptions{.lr = 0.1}, opts));
}

TEST(StepWatchdog, CallsOutAStallNamingTheRankAndTheStepAndNotBefore) {
  using namespace std::chrono;
  std::mutex m;
  std::condition_variable cv;
  std::string message;
  {
    StepWatchdog dog(3, milliseconds(150), [&](const std::string& text) {
      std::lock_guard<std::mutex> lock(m);
      message = text;
      cv.notify_all();
    });
    for (int64_t step = 1; step <= 6; ++step) {  // progress every 50 ms: no stall
      std::this_thread::sleep_for(milliseconds(50));
      dog.progress(step);
    }
    {
      std::lock_guard<std::mutex> lock(m);
      EXPECT_EQ(message, "");
    }
    std::unique_lock<std::mutex> lock(m);  // then none: a stall within about 150 ms
    ASSERT_TRUE(cv.wait_for(lock, seconds(5), [&] { return !message.empty(); }));
  }
  EXPECT_NE(message.find("rank 3: step 7 has not completed within 0.15 s"), std::string::npos)
      << message;
}

// ---- the GPU ---------------------------------------------------------------------------------

// An NCCL world of one rank on this process's GPU, or skips saying why there is none.
std::shared_ptr<dist::Communicator> nccl_world_of_one() {
  if (!cuda_available()) return nullptr;
  try {
    return dist::nccl_communicator(dist::nccl_unique_id(), 0, 1, cuda_device());
  } catch (const Error& e) {
    if (std::string(e.what()).find("cannot load") != std::string::npos) return nullptr;
    throw;
  }
}

#define REQUIRE_NCCL(world)                                                             \
  std::shared_ptr<dist::Communicator> world = nccl_world_of_one();                      \
  if (!world)                                                                           \
  GTEST_SKIP() << "no CUDA device, or libnccl.so.2 not on the library path: the GPU's " \
                  "data-parallel tests need both"

// The GPU's all_reduce (pack, NCCL, unpack) against the CPU's for each dtype and reduce dtype,
// the NCCL call captured into the executable's graph and replayed. (Channels-last gradients:
// the data-parallel session below, whose convolution filters' gradients are.)
TEST(AllReduceCuda, MatchesTheCpuThroughNcclInTheStepGraph) {
  REQUIRE_NCCL(world);
  for (DType reduce : {DType::f32, DType::bf16}) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE(cat(dtype_name(dtype), " reduced as ", dtype_name(reduce)));
      const Graph g = all_reduce_graph(dtype, {4, 6, 3, 5}, {1000}, {.reduce_dtype = reduce});
      const NamedTensors feeds = {{"a", random_tensor(dtype, {4, 6, 3, 5}, 3)},
                                  {"b", random_tensor(DType::f32, {1000}, 4)}};
      const NamedTensors want = run_graph(g, feeds);
      auto exe =
          Executable::compile(g, {.device = Device::cuda, .poison = true, .communicator = world});
      for (int run = 0; run < 2; ++run) {
        NamedTensors got = exe->run(feeds);
        EXPECT_TRUE(same_tensors(got, want)) << "run " << run;
      }
    }
  }
}

TEST(AllReduceCuda, RefusesAWorldThatIsNotNccl) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Graph g = all_reduce_graph(DType::f32, {2}, {2}, {});
  EXPECT_THROW_WITH("the CUDA backend's collectives run on NCCL",
                    Executable::compile(g, {.device = Device::cuda,
                                            .communicator = std::make_shared<MirrorWorld>(2)}));
}

// A data-parallel session on the GPU in an NCCL world of one: the same bits as without a
// world (the sum of one rank is a copy; the mean's scale is 1), with sync batch norm too (the
// ranks' totals gathered through NCCL and merged: one rank's, exactly).
TEST(DataParallelSessionCuda, AWorldOfOneTrainsAsOneProcess) {
  REQUIRE_NCCL(world);
  const Dataset data = synthetic_dataset(16, 3, 8, 10, 7);
  const BatchSampler sampler(data, 4, false, 0);
  for (Precision precision : {Precision::f32, Precision::bf16}) {
    for (bool sync : {false, true}) {
      SCOPED_TRACE(cat(precision_name(precision), sync ? " sync batch norm" : ""));
      SessionOptions parallel{.device = Device::cuda, .precision = precision};
      parallel.data_parallel = {.world = world, .bucket_bytes = 4096, .sync_batch_norm = sync};
      TrainingSession a(small_cnn(4, 8), LossSpec{}, SgdOptions{.lr = 0.1, .momentum = 0.9},
                        {.device = Device::cuda, .precision = precision});
      TrainingSession b(small_cnn(4, 8), LossSpec{}, SgdOptions{.lr = 0.1, .momentum = 0.9},
                        parallel);
      for (int64_t i = 0; i < 4; ++i) {
        const float la = a.step(zoo_batch(sampler, i)), lb = b.step(zoo_batch(sampler, i));
        EXPECT_TRUE(same_bits(la, lb)) << "step " << i << ": " << la << " vs " << lb;
      }
      EXPECT_TRUE(same_tensors(a.parameters(), b.parameters()));
      EXPECT_TRUE(same_tensors(a.buffers(), b.buffers()));
    }
  }
}

}  // namespace
}  // namespace fusebox::testing
