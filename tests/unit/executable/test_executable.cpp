// The compiled executable's contract on both backends: runs with new feeds, aliased
// (in-place) state, bound arrays, and clear errors for bad options and feeds. The CUDA
// tests skip without a GPU.
#include <gtest/gtest.h>

#include <cstring>

#include "backends/cuda/runtime/encoder.h"
#include "executable_test_util.h"
#include "fusebox/train/session.h"
#include "fusebox/zoo.h"

namespace fusebox::testing {
namespace {

class Executables : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam() == Device::cuda) FUSEBOX_RUNTIME_REQUIRE_GPU();
  }
  Device device() const { return GetParam(); }
};

TEST_P(Executables, RunsAgainWithNewFeedsAsTheCpuOracle) {
  const Graph g = chain_graph(40, 3000);
  auto exe = Executable::compile(g, {.device = device(), .poison = true});
  for (uint64_t seed = 1; seed < 5; ++seed) {
    const NamedTensors feeds = chain_feeds(3000, seed);
    const NamedTensors want = run_graph(g, feeds, {.device = Device::cpu});
    EXPECT_TRUE(all_close(exe->run(feeds).at("y"), want.at("y"), 1e-5, 1e-6)) << seed;
  }
}

TEST_P(Executables, LargeHostOutputsOfQueuedRunsAreEachTheirRuns) {
  // 12 MB of f32: on the GPU copied out on the readback stream while the next run computes,
  // whose writes of the output wait for that copy; get() hands over the pinned buffer
  // itself, which later runs must not reuse while it is held (cuda_executable.h,
  // executable.h). Five runs queued before any is read: each result must be its own run's.
  const int64_t n = 3000000;
  const Graph g = chain_graph(4, n);
  auto exe = Executable::compile(g, {.device = device(), .poison = true});
  std::vector<PendingTensor> pending;
  std::vector<Tensor> want;
  for (uint64_t seed = 1; seed < 6; ++seed) {
    const NamedTensors feeds = chain_feeds(n, seed);
    want.push_back(run_graph(g, feeds, {.device = Device::cpu}).at("y"));
    pending.push_back(exe->run_async(Feeds(feeds.begin(), feeds.end()), {"y"}).host.at("y"));
  }
  std::vector<Tensor> held;
  for (const PendingTensor& p : pending) held.push_back(p.get());
  const NamedTensors last = chain_feeds(n, 9);
  const Tensor again = exe->run_async(Feeds(last.begin(), last.end()), {"y"}).host.at("y").get();
  EXPECT_EQ(again.numel(), n);
  for (size_t i = 0; i < held.size(); ++i)
    EXPECT_TRUE(all_close(held[i], want[i], 1e-5, 1e-6)) << "run " << i;
}

TEST_P(Executables, StagedInputsOfQueuedRunsAreEachTheirRuns) {
  // 4 MB inputs: on the GPU each batch goes through one staging buffer, copied in just
  // before its step, while the step before still runs (cuda_executable.h). Runs queued
  // before any is read, fed from pinned and from pageable memory in turn, then a run that
  // feeds no x (it reads the last batch again) and one fed from a device array.
  const int64_t n = 1000000;
  const Graph g = chain_graph(4, n);
  auto exe = Executable::compile(g, {.device = device(), .poison = true});
  std::vector<PendingTensor> pending;
  std::vector<Tensor> want;
  std::vector<Tensor> pinned;  // each run's own, unchanged until its run is done
  NamedTensors feeds;
  for (uint64_t seed = 1; seed < 7; ++seed) {
    feeds = chain_feeds(n, seed);
    want.push_back(run_graph(g, feeds, {.device = Device::cpu}).at("y"));
    if (seed % 2) {
      Tensor p = pinned_host_tensor(DType::f32, {n});
      std::memcpy(p.raw(), feeds.at("x").raw(), feeds.at("x").nbytes());
      feeds.at("x") = p;
      pinned.push_back(p);
    }
    pending.push_back(exe->run_async(Feeds(feeds.begin(), feeds.end()), {"y"}).host.at("y"));
  }
  const Tensor no_x = exe->run_async({{"a", feeds.at("a")}}, {"y"}).host.at("y").get();
  EXPECT_TRUE(all_close(no_x, want.back(), 1e-5, 1e-6)) << "a run that feeds no x";
  const NamedTensors last = chain_feeds(n, 11);
  Feeds from_device(last.begin(), last.end());
  from_device["x"] = DeviceArray::upload(last.at("x"), device());
  const Tensor on_device = exe->run_async(from_device, {"y"}).host.at("y").get();
  EXPECT_TRUE(all_close(on_device, run_graph(g, last, {.device = Device::cpu}).at("y"), 1e-5, 1e-6))
      << "fed from a device array";
  for (size_t i = 0; i < pending.size(); ++i)
    EXPECT_TRUE(all_close(pending[i].get(), want[i], 1e-5, 1e-6)) << "run " << i;
}

TEST_P(Executables, AnAliasedInputKeepsItsStateAcrossRuns) {
  const int64_t n = 1000;
  auto exe = Executable::compile(
      accumulate_graph(n), {.device = device(), .poison = true, .aliases = {{"next_w", "w"}}});
  const Tensor w0 = random_tensor(DType::f32, {n}, 1);
  const Tensor x = random_tensor(DType::f32, {n}, 2);
  exe->input("w").copy_from(w0);
  std::vector<double> w = w0.to_doubles();
  const std::vector<double> xs = x.to_doubles();
  for (int run = 0; run < 3; ++run) {
    double dot = 0;
    for (int64_t i = 0; i < n; ++i) dot += w[size_t(i)] * xs[size_t(i)];
    StepResult r = exe->run_async({{"x", x}}, {"dot"});
    EXPECT_NEAR(r.host.at("dot").get().get(0), dot, 1e-3) << "run " << run;
    EXPECT_TRUE(r.outputs.at("next_w").same_storage(exe->input("w")));
    for (int64_t i = 0; i < n; ++i) w[size_t(i)] += xs[size_t(i)];
  }
  EXPECT_TRUE(
      all_close(exe->input("w").to_host(), Tensor::from_doubles(DType::f32, {n}, w), 1e-5, 1e-5));
}

TEST_P(Executables, BoundArraysAreReadWhereTheyAre) {
  const int64_t n = 512;
  DeviceArray w = DeviceArray::upload(random_tensor(DType::f32, {n}, 3), device());
  auto exe = Executable::compile(accumulate_graph(n), {.device = device(), .bound = {{"w", w}}});
  const Tensor x = random_tensor(DType::f32, {n}, 4);
  const Tensor first = exe->run({{"x", x}}).at("dot");
  const Tensor w2 = random_tensor(DType::f32, {n}, 5);
  w.copy_from(w2);  // the next run reads the new contents
  const Tensor second = exe->run({{"x", x}}).at("dot");
  const NamedTensors want = run_graph(accumulate_graph(n), {{"w", w2}, {"x", x}});
  EXPECT_TRUE(all_close(second, want.at("dot"), 1e-4, 1e-4));
  EXPECT_FALSE(all_close(first, second, 1e-4, 1e-4));
}

TEST_P(Executables, BadOptionsAndFeedsAreErrorsNamingWhat) {
  const Graph g = accumulate_graph(8);
  expect_error(
      [&] {
        Executable::compile(g, {.device = device(), .aliases = {{"nope", "w"}}});
      },
      {"'nope' is not an output"});
  expect_error(
      [&] {
        Executable::compile(g, {.device = device(), .aliases = {{"next_w", "z"}}});
      },
      {"'z' is not an input"});
  expect_error(
      [&] {
        Executable::compile(g, {.device = device(), .aliases = {{"dot", "w"}}});
      },
      {"'dot'", "f32[]", "f32[8]"});
  DeviceArray wrong = DeviceArray::upload(Tensor::zeros(DType::f32, {9}), device());
  expect_error(
      [&] {
        Executable::compile(g, {.device = device(), .bound = {{"w", wrong}}});
      },
      {"'w'", "f32[8]", "f32[9]"});
  DeviceArray right = DeviceArray::upload(Tensor::zeros(DType::f32, {8}), device());
  auto exe = Executable::compile(g, {.device = device(), .bound = {{"w", right}}});
  expect_error([&] { exe->run({{"w", Tensor::zeros(DType::f32, {8})}}); }, {"'w'", "bound"});
  expect_error([&] { exe->run({}); }, {"no tensor given for input 'x'"});
  expect_error(
      [&] {
        exe->run({{"x", Tensor::zeros(DType::f32, {7})}});
      },
      {"'x'", "f32[8]", "f32[7]"});
  expect_error([&] { exe->run({{"y", Tensor::zeros(DType::f32, {8})}}); }, {"'y'", "not an input"});
}

// A label outside [0, C): the run that met it reports it, naming the label; the next run
// with good labels is clean (the error records are zeroed by every run).
TEST_P(Executables, KernelErrorsAreReportedByTheirRun) {
  Graph g("loss");
  Builder b(g);
  ValueId logits = g.add_input("logits", DType::f32, {4, 5});
  ValueId labels = g.add_input("labels", DType::i64, {4});
  ValueId loss = b.cross_entropy(logits, labels, kNoValue, {}).at(0);
  g.rename_value(loss, "loss");
  g.mark_output(loss);
  auto exe = Executable::compile(g, {.device = device()});
  const Tensor x = random_tensor(DType::f32, {4, 5}, 6);
  const Tensor good = Tensor::from_vector<int64_t>({4}, {0, 1, 2, 3});
  const Tensor bad = Tensor::from_vector<int64_t>({4}, {0, 1, 7, 3});
  const Tensor want = run_graph(g, {{"logits", x}, {"labels", good}}).at("loss");
  EXPECT_TRUE(all_close(exe->run({{"logits", x}, {"labels", good}}).at("loss"), want, 1e-5, 1e-6));
  expect_error([&] { exe->run({{"logits", x}, {"labels", bad}}); }, {"7"});
  // Queued: the CPU finds it at once, the GPU when the loss is read; both name the run.
  expect_error(
      [&] {
        exe->run_async({{"logits", x}, {"labels", bad}}, {"loss"}, "step 9").host.at("loss").get();
      },
      {"step 9", "7"});
  EXPECT_TRUE(all_close(exe->run({{"logits", x}, {"labels", good}}).at("loss"), want, 1e-5, 1e-6));
}

// Poisoned outputs in every run, shared arena against a buffer per value: the same
// results, and both match the CPU (a buffer reused while still read would differ).
TEST_P(Executables, ResNet18StepSharesMemoryWithoutChangingResults) {
  const Graph model = build_zoo_model(
      "resnet18", {.batch = 4, .image_size = 32, .num_classes = 10, .training = true});
  TrainingSession session(model, LossSpec{}, SgdOptions{.lr = 0.1, .momentum = 0.9});
  const Graph& g = session.step_graph();
  NamedTensors feeds;
  for (ValueId v : g.inputs()) {
    const Value& in = g.value(v);
    feeds[in.name] = in.type.dtype == DType::i64
                         ? random_tensor(DType::i64, in.type.shape, 7, 0, 10)
                         : random_tensor(in.type.dtype, in.type.shape, 8 + uint64_t(v), -0.5, 0.5);
  }
  feeds["__lr__"] = Tensor::scalar(DType::f32, 0.1);
  auto shared = Executable::compile(g, {.device = device(), .poison = true});
  auto unshared =
      Executable::compile(g, {.device = device(), .poison = true, .reuse_memory = false});
  if (device() == Device::cuda) {  // (the CPU executable has no arena)
    EXPECT_LT(shared->stats().arena_bytes, unshared->stats().arena_bytes);
    // The arena holds at least what is live at once. (The step's batch-norm partial sums
    // share the arena's gaps and the encoder's overflow buffer: the results below check it.)
    EXPECT_GT(shared->stats().peak_live_bytes, 0u);
    EXPECT_LE(shared->stats().peak_live_bytes, shared->stats().arena_bytes);
  }
  const NamedTensors a = shared->run(feeds), b = unshared->run(feeds);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : b) EXPECT_TRUE(all_close(a.at(name), t, 1e-4, 1e-5)) << name;
  // A second run of the same feeds repeats the first (the first run starts from whatever its
  // buffers held; later ones from the run before: a read before the write shows here).
  const NamedTensors again = shared->run(feeds);
  for (const auto& [name, t] : a) EXPECT_TRUE(all_close(again.at(name), t, 1e-4, 1e-5)) << name;
  // Against the CPU, the loss (the gradients of layer4, whose batch norms see 1x1 maps of 4
  // images, amplify the backends' rounding differences: test_session_cuda.cpp).
  const NamedTensors cpu = run_graph(g, feeds, {.device = Device::cpu});
  EXPECT_TRUE(all_close(a.at("__loss__"), cpu.at("__loss__"), 1e-3, 1e-4));
}

// profile() runs the step once more node by node: a time per node in the graph's order,
// and the outputs it leaves are a run's (each node read what the node before it wrote;
// resnet18 has views, a concat-free chain of convolutions, pools and a gemm).
TEST_P(Executables, ProfileTimesEachNodeAndComputesTheRunsOutputs) {
  const Graph g =
      build_zoo_model("resnet18", {.batch = 2, .image_size = 32, .num_classes = 10, .seed = 3});
  auto exe = Executable::compile(g, {.device = device()});
  expect_error([&] { exe->profile(); }, {"input"});  // nothing fed yet
  const Tensor x = random_tensor(DType::f32, {2, 3, 32, 32}, 11);
  StepResult r = exe->run_async({{"input", x}}, {"logits"});
  const Tensor want = r.host.at("logits").get();
  // The run's output overwritten: the profile must compute it again.
  r.outputs.at("logits").copy_from(Tensor::full(DType::f32, {2, 10}, std::nan("")));
  const std::vector<NodeTime> times = exe->profile(3);
  ASSERT_EQ(times.size(), g.nodes().size());
  double sum = 0;
  for (size_t i = 0; i < times.size(); ++i) {
    EXPECT_EQ(times[i].node, g.nodes()[i].name);
    EXPECT_EQ(times[i].op, g.nodes()[i].op);
    EXPECT_GE(times[i].ms, 0) << times[i].node;
    sum += times[i].ms;
  }
  EXPECT_GT(sum, 0);
  EXPECT_TRUE(all_close(r.outputs.at("logits").to_host(), want, 1e-6, 1e-7));
  // Runs after a profile are as before.
  EXPECT_TRUE(all_close(exe->run({{"input", x}}).at("logits"), want, 1e-6, 1e-7));
  expect_error([&] { exe->profile(0); }, {"repeats"});
  auto stateful =
      Executable::compile(accumulate_graph(64), {.device = device(), .aliases = {{"next_w", "w"}}});
  expect_error([&] { stateful->profile(); }, {"aliased state"});
}

// ViT's q, k and v: slices of one block each of a [3, T, B, E] value, which the CUDA executable
// plans as views of it (no copy); the results are the CPU oracle's on both backends.
TEST_P(Executables, BlockSlicesComputeAsCopies) {
  Graph g("block_slices");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {3, 5, 2, 64});
  const ValueId qkv = b.relu(x);
  for (int64_t i = 0; i < 3; ++i) {
    const ValueId part =
        b.slice(qkv, SliceAttrs{.starts = {i}, .ends = {i + 1}, .axes = {0}, .steps = {1}});
    const ValueId y = b.mul(b.reshape(part, {10, 64}),
                            g.add_constant(cat("k", i), Tensor::scalar(DType::f32, double(i + 2))));
    g.rename_value(y, cat("y", i));
    g.mark_output(y);
  }
  auto exe = Executable::compile(g, {.device = device()});
  const Tensor feed = random_tensor(DType::f32, {3, 5, 2, 64}, 5);
  const NamedTensors got = exe->run({{"x", feed}}), want = run_graph(g, {{"x", feed}});
  for (const char* name : {"y0", "y1", "y2"})
    EXPECT_TRUE(all_close(got.at(name), want.at(name), 0, 0)) << name;
  if (device() == Device::cuda) EXPECT_GE(exe->stats().views, 3u);  // the slices (and reshapes)
}

// torch.nn.MultiheadAttention's head split as its ONNX export spells it ([T, B, 3E] ->
// [T, B, 3, E] -> ... -> [T, B*H, d] -> [B*H, T, d] -> [B, H, T, d]) feeding attention and its
// backward, whose dy comes through a transpose too: the CUDA executable reads q, k, v and dy
// as strided views of the projection (layout_views.h; cuDNN takes them in bf16) and computes
// what the CPU oracle does. With `o_through_rows`, the backward reads the attention output O as
// a training step does after attention_output_from_layout_copy: through the inverse transpose of
// the rows [T*B, E] the output projection reads, a view of those rows (O dies in the forward).
void head_split_into_attention(Device device, int64_t t, bool o_through_rows) {
  SCOPED_TRACE(cat(t, " tokens", o_through_rows ? ", o through the rows" : ""));
  const int64_t b = 2, h = 2, d = 64, e = h * d;
  Graph g("head_split");
  const ValueId x = g.add_input("x", DType::bf16, {t, b, 3 * e});
  const ValueId up = g.add_input("up", DType::bf16, {t, b, e});
  const ValueId packed = g.add_node(OpKind::relu, {}, {x})[0];
  auto node = [&](OpKind op, Attrs a, ValueId in) { return g.add_node(op, std::move(a), {in})[0]; };
  ValueId split = node(OpKind::reshape, ReshapeAttrs{{t, b, 3, e}}, packed);
  split = node(OpKind::unsqueeze, AxesAttrs{{0}}, split);
  split = node(OpKind::transpose, TransposeAttrs{{3, 1, 2, 0, 4}}, split);
  split = node(OpKind::squeeze, AxesAttrs{{3}}, split);
  std::vector<ValueId> qkv;
  for (int64_t i = 0; i < 3; ++i) {
    ValueId v = node(OpKind::slice, SliceAttrs{{i}, {i + 1}, {0}, {1}}, split);
    v = node(OpKind::squeeze, AxesAttrs{{0}}, v);
    v = node(OpKind::reshape, ReshapeAttrs{{t, b * h, d}}, v);
    v = node(OpKind::transpose, TransposeAttrs{{1, 0, 2}}, v);
    qkv.push_back(node(OpKind::reshape, ReshapeAttrs{{b, h, t, d}}, v));
  }
  const AttentionAttrs attrs{.scale = 0.125, .with_lse = true};
  const std::vector<ValueId> fwd = g.add_node(OpKind::attention, attrs, qkv, "attention");
  ValueId dy = g.add_node(OpKind::relu, {}, {up})[0];
  dy = node(OpKind::reshape, ReshapeAttrs{{t, b, h, d}}, dy);
  dy = node(OpKind::transpose, TransposeAttrs{{1, 2, 0, 3}}, dy);
  ValueId o = fwd[0], projected = kNoValue;
  if (o_through_rows) {
    const ValueId rows = node(OpKind::reshape, ReshapeAttrs{{t * b, e}},
                              node(OpKind::transpose, TransposeAttrs{{2, 0, 1, 3}}, o));
    const ValueId w = g.add_input("w", DType::bf16, {e, 16});
    projected = g.add_node(OpKind::matmul, {}, {rows, w}, "projection")[0];
    o = node(OpKind::transpose, TransposeAttrs{{1, 2, 0, 3}},
             node(OpKind::reshape, ReshapeAttrs{{t, b, h, d}}, rows));
  }
  const std::vector<ValueId> grads =
      g.add_node(OpKind::attention_backward, attrs, {dy, qkv[0], qkv[1], qkv[2], o, fwd[1]},
                 "attention_backward");
  const ValueId checked = o_through_rows ? projected : fwd[0];
  g.mark_output(checked);
  for (ValueId v : grads) g.mark_output(v);
  auto exe = Executable::compile(g, {.device = device, .poison = true});
  NamedTensors feeds = {{"x", random_tensor(DType::bf16, {t, b, 3 * e}, 7, -1, 1)},
                        {"up", random_tensor(DType::bf16, {t, b, e}, 8, -1, 1)}};
  if (o_through_rows) feeds.emplace("w", random_tensor(DType::bf16, {e, 16}, 9, -1, 1));
  const NamedTensors got = exe->run(feeds), want = run_graph(g, feeds);
  EXPECT_TRUE(all_close(got.at(g.value(checked).name), want.at(g.value(checked).name), 3e-2, 3e-2));
  for (size_t i = 0; i < 3; ++i) {
    const std::string& name = g.value(grads[i]).name;
    EXPECT_TRUE(all_close(got.at(name), want.at(name), 5e-2, 5e-2)) << name;
  }
  // Nothing of the split is copied: 3 x 5 steps to q, k, v and 4 shared before, dy's 2; and
  // with the rows, O's transpose they are copied from and the 2 steps back onto them.
  if (device == Device::cuda)
    EXPECT_GE(exe->stats().views, 3u * 5 + 4 + 2 + (o_through_rows ? 3 : 0));
}

TEST_P(Executables, HeadSplitViewsFeedAttention) {
  // 19 tokens: the short-sequence kernel's forward (on copies); 80: cuDNN's, on the views.
  for (const int64_t t : {19, 80})
    for (const bool o_through_rows : {false, true})
      head_split_into_attention(device(), t, o_through_rows);
}

INSTANTIATE_TEST_SUITE_P(Backends, Executables, ::testing::Values(Device::cpu, Device::cuda),
                         [](const auto& info) { return std::string(device_name(info.param)); });

// The host memory budget on the CPU backend: a step whose intermediates cannot fit what the
// budget has left is refused at compile time, naming its need and largest value; an allocation
// refused part way through a run names the node; nothing of the refused run remains counted.
TEST(CpuExecutable, HostMemoryBudgetRefusesByNameAndKeepsNothing) {
  constexpr size_t MiB = size_t(1) << 20;
  Graph g = chain_graph(2, int64_t(MiB / 4));  // x [256 Ki] f32: each value 1 MiB
  const NamedTensors feeds = chain_feeds(int64_t(MiB / 4), 3);
  const size_t in_use = host_memory_stats().in_use;
  {
    // Two node outputs live at once (a node's input and output): 2 MiB, 1.5 left.
    ScopedHostMemoryLimit limit(in_use + 3 * MiB / 2);
    expect_error(
        [&] { Executable::compile(g, {.device = Device::cpu}); },
        {"[run chain] a run needs 2.0 MiB of host memory", "1.0 MiB)", "host memory limit"});
  }
  auto exe = Executable::compile(g, {.device = Device::cpu});
  const Tensor want = exe->run(feeds).at("y");
  {
    ScopedHostMemoryLimit limit(host_memory_stats().in_use + MiB / 2);
    try {
      exe->run(feeds);
      ADD_FAILURE() << "a run past the host memory limit succeeded";
    } catch (const OutOfMemory& e) {
      // The run takes the blocks its first run freed (the executable keeps them) and fails at
      // the first node that needs another: the output `want` still holds its first block.
      const std::string message = e.what();
      EXPECT_EQ(message.rfind("[mul 'mul_1'] out of host memory: f32[262144] needs 1.0 MiB", 0), 0u)
          << message;
    }
  }
  EXPECT_TRUE(all_close(exe->run(feeds).at("y"), want, 0, 0));
  EXPECT_LE(host_memory_stats().in_use, in_use + 4 * MiB);  // the executable's outputs, feeds
}

// Outputs of 1 MiB or more take the blocks earlier outputs of their size had, once nothing
// holds them: a run after the first allocates nothing more, and a tensor the caller keeps
// is never written by a later run.
TEST(CpuExecutable, LargeOutputsReuseFreedBlocksButNotHeldOnes) {
  constexpr int64_t n = int64_t(1) << 18;  // 1 MiB of f32 per value
  auto exe = Executable::compile(chain_graph(6, n), {.device = Device::cpu});
  const Tensor first = exe->run(chain_feeds(n, 1)).at("y");
  const Tensor first_copy = first.clone();
  const size_t held = host_memory_stats().in_use;
  for (uint64_t seed = 2; seed < 9; ++seed) {
    const NamedTensors feeds = chain_feeds(n, seed);
    const Tensor y = exe->run(feeds).at("y");
    EXPECT_TRUE(all_close(y, run_graph(chain_graph(6, n), feeds).at("y"), 0, 0)) << seed;
    EXPECT_FALSE(all_close(y, first_copy, 0, 0)) << seed;
  }
  // `first` was held throughout: its bytes are the first run's.
  EXPECT_TRUE(all_close(first, first_copy, 0, 0));
  // The loop's outputs were dropped each time: the blocks went round. Two more than the first
  // run's: `first` holds one, and the executable's own handle on its last outputs another
  // while a run makes the next; 7 runs kept no more than that.
  EXPECT_LE(host_memory_stats().in_use, held + 2 * size_t(n) * 4);
}

// compile(Graph&&) (the given graph's constants released once the pipeline has made its graph,
// before the backend prepares its own copies: `fusebox run` of ResNet-50 b1 on the CPU peaked at
// 381.6 -> 289.0 MiB) runs what compile(const Graph&) runs: the batch norm folded into the
// convolution, the same outputs bit for bit.
TEST(CpuExecutable, CompilingAGivenGraphRunsAsCompilingACopy) {
  auto make = [] {
    Graph g("folded");
    const ValueId x = g.add_input("x", DType::f32, {1, 32, 12, 12});
    const ValueId w = g.add_constant("w", random_tensor(DType::f32, {64, 32, 3, 3}, 1, -0.1, 0.1));
    ConvAttrs same;
    same.pads_begin = {1, 1};
    same.pads_end = {1, 1};
    std::vector<ValueId> norm = {g.add_node(OpKind::conv, same, {x, w}, "conv")[0]};
    for (uint64_t i = 0; i < 4; ++i)
      norm.push_back(g.add_constant(cat("p", i), random_tensor(DType::f32, {64}, 2 + i, 0.5, 1.5)));
    const ValueId y =
        g.add_node(OpKind::batch_norm, BatchNormAttrs{.epsilon = 1e-5}, norm, "bn")[0];
    g.rename_value(y, "y");
    g.mark_output(y);
    return g;
  };
  const CompileOptions options{
      .device = Device::cpu,
      .cpu_kernels = CpuKernels::fast,
      .pipeline = {.kind = PipelineKind::inference, .precision = Precision::f32}};
  const NamedTensors feeds{{"x", random_tensor(DType::f32, {1, 32, 12, 12}, 9)}};
  const Graph kept = make();
  const auto from_copy = Executable::compile(kept, options);
  const auto from_given = Executable::compile(make(), options);
  EXPECT_EQ(from_given->graph().nodes().size(), from_copy->graph().nodes().size());
  EXPECT_EQ(from_given->graph().nodes().size(), size_t(1));  // the norm folded into the conv
  EXPECT_TRUE(all_close(from_given->run(feeds).at("y"), from_copy->run(feeds).at("y"), 0, 0));
  EXPECT_TRUE(
      all_close(from_given->run(feeds).at("y"), run_graph(kept, feeds).at("y"), 1e-4, 1e-5));
}

TEST(CudaExecutable, ARunRecordsNothing) {
  FUSEBOX_RUNTIME_REQUIRE_GPU();
  cuda::CommandEncoder& encoder = cuda::CommandEncoder::for_device(0);
  if (!encoder.options().use_graphs) GTEST_SKIP() << "FUSEBOX_CUDA_GRAPHS=0: every run records";
  auto exe = Executable::compile(chain_graph(40, 3000), {.device = Device::cuda});
  exe->run(chain_feeds(3000, 1));
  const cuda::CommandEncoder::Stats first = encoder.stats();
  for (uint64_t seed = 2; seed < 5; ++seed) exe->run(chain_feeds(3000, seed));
  const cuda::CommandEncoder::Stats later = encoder.stats();
  EXPECT_EQ(later.ops_recorded, first.ops_recorded);
  EXPECT_EQ(later.graph_cache.lookups, first.graph_cache.lookups);
  EXPECT_EQ(later.replays, first.replays + 3);
}

// An elementwise node's output is computed in the bytes of an input that dies there: a chain
// of 40 adds and muls (the first reads the graph's input, outside the arena) runs in one
// 4000-byte buffer, not two in turn, with the CPU's bits; a profile, which repeats each node,
// computes those outputs into buffers of their own and leaves the run's result.
TEST(CudaExecutable, ElementwiseOutputsAreComputedInTheirDyingInputsBytes) {
  FUSEBOX_RUNTIME_REQUIRE_GPU();
  const Graph g = chain_graph(40, 1000);
  auto exe = Executable::compile(g, {.device = Device::cuda, .poison = true});
  EXPECT_EQ(exe->stats().arena_bytes, 4096u);  // 4000 bytes rounded to 256, once
  auto unshared = Executable::compile(g, {.device = Device::cuda, .reuse_memory = false});
  EXPECT_GT(unshared->stats().arena_bytes, 30 * 4096u);
  const NamedTensors feeds = chain_feeds(1000, 3);
  const NamedTensors want = run_graph(g, feeds, {.device = Device::cpu});
  EXPECT_TRUE(all_close(exe->run(feeds).at("y"), want.at("y"), 0, 0));
  EXPECT_TRUE(all_close(exe->run(feeds).at("y"), want.at("y"), 0, 0)) << "a second run";
  EXPECT_TRUE(all_close(unshared->run(feeds).at("y"), want.at("y"), 0, 0));
  Feeds device_feeds;
  for (const auto& [name, t] : feeds) device_feeds[name] = t;
  StepResult r = exe->run_async(device_feeds, {"y"});
  r.host.at("y").get();
  r.outputs.at("y").copy_from(Tensor::full(DType::f32, {1000}, std::nan("")));
  exe->profile(3);
  EXPECT_TRUE(all_close(r.outputs.at("y").to_host(), want.at("y"), 0, 0)) << "after a profile";
  EXPECT_TRUE(all_close(exe->run(feeds).at("y"), want.at("y"), 0, 0)) << "a run after it";
}

// A value read only by the reshape that makes an output is computed in the output's buffer:
// a product's [8, 12] rows reshaped to [2, 4, 12] leave the arena empty, the reshape records
// nothing, and runs (poisoned first), a profile and a run after it give the CPU's values. A
// product that is also an output itself keeps its own buffer.
TEST(CudaExecutable, AnOutputMadeByAReshapeIsComputedInItsBuffer) {
  FUSEBOX_RUNTIME_REQUIRE_GPU();
  Graph g("rows");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {8, 16});
  const ValueId w = g.add_constant("w", random_tensor(DType::f32, {16, 12}, 4));
  ValueId y = b.reshape(b.matmul(x, w), {2, 4, 12});
  g.rename_value(y, "y");
  g.mark_output(y);
  auto exe = Executable::compile(g, {.device = Device::cuda, .poison = true});
  EXPECT_EQ(exe->stats().arena_bytes, 0u);
  for (uint64_t seed = 1; seed < 4; ++seed) {
    const NamedTensors feeds{{"x", random_tensor(DType::f32, {8, 16}, seed)}};
    const Tensor want = run_graph(g, feeds, {.device = Device::cpu}).at("y");
    EXPECT_TRUE(all_close(exe->run(feeds).at("y"), want, 1e-5, 1e-6)) << seed;
    if (seed == 2) {
      exe->profile(2);
      EXPECT_TRUE(all_close(exe->run(feeds).at("y"), want, 1e-5, 1e-6)) << "after a profile";
    }
  }
  Graph both("both");
  Builder bb(both);
  const ValueId p = bb.matmul(both.add_input("x", DType::f32, {8, 16}),
                              both.add_constant("w", random_tensor(DType::f32, {16, 12}, 4)));
  both.rename_value(p, "p");
  both.mark_output(p);
  const ValueId r = bb.reshape(p, {2, 4, 12});
  both.rename_value(r, "y");
  both.mark_output(r);
  auto exe2 = Executable::compile(both, {.device = Device::cuda, .poison = true});
  const NamedTensors feeds{{"x", random_tensor(DType::f32, {8, 16}, 7)}};
  const NamedTensors want = run_graph(both, feeds, {.device = Device::cpu});
  const NamedTensors got = exe2->run(feeds);
  for (const auto& [name, t] : want) EXPECT_TRUE(all_close(got.at(name), t, 1e-5, 1e-6)) << name;
}

// An output of 2 x 64 MiB or more is copied back in pieces, each with its own wait in the step
// (cuda_executable.h ReadbackPiece): 144 MB of f32 (two pieces), five runs queued before any
// is read, each result its own run's; then a run whose output is not read back, and one that
// is again.
TEST(CudaExecutable, HostOutputsReadBackInPiecesAreEachTheirRuns) {
  FUSEBOX_RUNTIME_REQUIRE_GPU();
  const int64_t n = 36000000;
  const Graph g = chain_graph(2, n);
  auto exe = Executable::compile(g, {.device = Device::cuda, .poison = true});
  std::vector<PendingTensor> pending;
  std::vector<Tensor> want;
  for (uint64_t seed = 1; seed < 6; ++seed) {
    const NamedTensors feeds = chain_feeds(n, seed);
    want.push_back(run_graph(g, feeds, {.device = Device::cpu}).at("y"));
    pending.push_back(exe->run_async(Feeds(feeds.begin(), feeds.end()), {"y"}).host.at("y"));
  }
  for (size_t i = 0; i < pending.size(); ++i)
    EXPECT_TRUE(all_close(pending[i].get(), want[i], 1e-5, 1e-6)) << "run " << i;
  const NamedTensors quiet = chain_feeds(n, 11);
  exe->run_async(Feeds(quiet.begin(), quiet.end()), {});
  const NamedTensors last = chain_feeds(n, 12);
  const Tensor again = exe->run_async(Feeds(last.begin(), last.end()), {"y"}).host.at("y").get();
  EXPECT_TRUE(all_close(again, run_graph(g, last, {.device = Device::cpu}).at("y"), 1e-5, 1e-6));
}

// A step's optimizer updates run as multi-tensor launches (kernels.h record_update_group):
// SGD with momentum and AdamW over parameters of 3 to 262,147 elements (vector tails, one
// block and many), AdamW also with bf16 gradients and low copies as bf16 training has them,
// give the CPU's values (SGD: its bits); a run of updates that read two learning rates is
// recorded node by node, with the same values.
TEST(CudaExecutable, OptimizerUpdatesRunAsMultiTensorLaunches) {
  FUSEBOX_RUNTIME_REQUIRE_GPU();
  const std::vector<int64_t> sizes = {3, 64, 1000, 4099, 262147};
  auto build = [&](OpKind op, bool two_rates, bool low) {
    Graph g(op_name(op));
    const ValueId lr = g.add_input("lr", DType::f32, {});
    const ValueId lr2 = two_rates ? g.add_input("lr2", DType::f32, {}) : lr;
    const ValueId step = g.add_input("step", DType::i64, {});
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::string p = "p" + std::to_string(i);
      const Shape shape = {sizes[i]};
      std::vector<ValueId> in = {g.add_input(p, DType::f32, shape),
                                 g.add_input(p + "/grad", low ? DType::bf16 : DType::f32, shape),
                                 g.add_input(p + "/m", DType::f32, shape)};
      if (op == OpKind::adamw_update) in.push_back(g.add_input(p + "/v", DType::f32, shape));
      in.push_back(i == 3 ? lr2 : lr);
      if (op == OpKind::adamw_update) in.push_back(step);
      if (low) {
        in.push_back(kNoValue);  // grad_scale
        in.push_back(kNoValue);  // skip
        in.push_back(g.add_input(p + "/low", DType::bf16, shape));
      }
      const Attrs attrs = op == OpKind::sgd_update
                              ? Attrs(SgdAttrs{.momentum = 0.9, .weight_decay = 1e-4})
                              : Attrs(AdamWAttrs{});
      for (ValueId v : g.add_node(op, attrs, in, "update/" + p)) g.mark_output(v);
    }
    return g;
  };
  auto feeds_of = [&](const Graph& g) {
    NamedTensors feeds;
    uint64_t seed = 40;
    for (ValueId v : g.inputs()) {
      const Value& in = g.value(v);
      feeds[in.name] = in.type.shape.empty()
                           ? Tensor::scalar(in.type.dtype, in.name == "step" ? 3.0 : 0.01)
                           : random_tensor(in.type.dtype, in.type.shape, seed++, 0.1, 1.0);
    }
    return feeds;
  };
  for (OpKind op : {OpKind::sgd_update, OpKind::adamw_update}) {
    for (bool low : {false, true}) {
      for (bool two_rates : {false, true}) {
        SCOPED_TRACE(
            cat(op_name(op), low ? " bf16 grads and copies" : "", two_rates ? " two rates" : ""));
        const Graph g = build(op, two_rates, low);
        const NamedTensors feeds = feeds_of(g);
        const NamedTensors want = run_graph(g, feeds, {.device = Device::cpu});
        auto exe = Executable::compile(g, {.device = Device::cuda, .poison = true});
        const NamedTensors got = exe->run(feeds);
        const double tol = op == OpKind::sgd_update ? 0 : 1e-6;
        for (const auto& [name, t] : want)
          EXPECT_TRUE(all_close(got.at(name), t, tol, tol)) << name;
      }
    }
  }
}

// The inputs and outputs the executable owns are one allocation: five 2.25 MiB tensors take
// 11.25 MiB, not five buffers rounded up to the allocator's 2 MiB step (20 MiB).
TEST(CudaExecutable, InputsAndOutputsShareOneAllocation) {
  FUSEBOX_RUNTIME_REQUIRE_GPU();
  constexpr size_t MiB = size_t(1) << 20;
  const int64_t n = 589824;  // 2.25 MiB of f32
  Graph g("io_pool");
  Builder b(g);
  std::vector<ValueId> xs;
  for (int i = 0; i < 4; ++i) xs.push_back(g.add_input("x" + std::to_string(i), DType::f32, {n}));
  g.mark_output(b.add(b.add(xs[0], xs[1]), b.add(xs[2], xs[3])));
  auto exe = Executable::compile(g, {.device = Device::cuda, .poison = true});
  const size_t tensor_bytes = size_t(n) * 4;
  EXPECT_EQ(exe->stats().io_bytes, 5 * tensor_bytes);
  EXPECT_LT(exe->stats().temporary_bytes, 4 * MiB) << "the allocator's rounding per buffer";
  NamedTensors feeds;
  for (int i = 0; i < 4; ++i)
    feeds["x" + std::to_string(i)] = random_tensor(DType::f32, {n}, uint64_t(20 + i));
  const NamedTensors want = run_graph(g, feeds, {.device = Device::cpu});
  const NamedTensors got = exe->run(feeds);
  for (const auto& [name, t] : want) EXPECT_TRUE(all_close(got.at(name), t, 0, 0)) << name;
}

TEST(CudaExecutable, DeviceArraysRoundTrip) {
  FUSEBOX_RUNTIME_REQUIRE_GPU();
  const Tensor t = random_tensor(DType::bf16, {2, 3, 4, 5}, 9);
  DeviceArray a = DeviceArray::upload(t, Device::cuda);
  EXPECT_TRUE(all_close(a.to_host(), t, 0, 0));
  DeviceArray c = a.clone();
  a.copy_from(random_tensor(DType::bf16, {2, 3, 4, 5}, 10));
  EXPECT_TRUE(all_close(c.to_host(), t, 0, 0));
  expect_error([&] { a.copy_from(Tensor::zeros(DType::f32, {2, 3, 4, 5})); }, {"bf16", "f32"});
}

}  // namespace
}  // namespace fusebox::testing
