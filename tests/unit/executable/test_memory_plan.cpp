// The memory plan: values whose lives overlap never share bytes; sharing brings the arena
// near the most bytes live at once. Needs no GPU.
#include <gtest/gtest.h>

#include "executable/memory_plan.h"
#include "executable_test_util.h"
#include "fusebox/ir/op_groups.h"
#include "fusebox/train/session.h"
#include "fusebox/zoo.h"

namespace fusebox::testing {
namespace {

using runtime::MemoryPlan;

std::vector<size_t> intermediate_bytes(const Graph& g) {
  std::vector<size_t> bytes(g.values().size(), 0);
  std::vector<bool> outside(g.values().size(), false);
  for (ValueId v : g.inputs()) outside[size_t(v)] = true;
  for (ValueId v : g.outputs()) outside[size_t(v)] = true;
  for (const auto& [v, t] : g.constants()) outside[size_t(v)] = true;
  for (size_t v = 0; v < bytes.size(); ++v) {
    const TensorType& t = g.values()[v].type;
    if (!outside[v]) bytes[v] = size_t(numel(t.shape)) * dtype_size(t.dtype);
  }
  return bytes;
}

// Every pair of planned values that live at one node at the same time has disjoint bytes.
::testing::AssertionResult no_live_overlap(const Graph& g, const runtime::Liveness& life,
                                           const std::vector<size_t>& bytes,
                                           const MemoryPlan& plan) {
  std::vector<size_t> planned;
  for (size_t v = 0; v < bytes.size(); ++v)
    if (bytes[v] > 0) planned.push_back(v);
  for (size_t i = 0; i < planned.size(); ++i) {
    const size_t a = planned[i];
    const int a0 = life.first[a], a1 = std::max(life.first[a], life.last[a]);
    if (plan.offset[a] + bytes[a] > plan.arena_bytes)
      return ::testing::AssertionFailure() << g.values()[a].name << " ends past the arena";
    for (size_t j = i + 1; j < planned.size(); ++j) {
      const size_t b = planned[j];
      const int b0 = life.first[b], b1 = std::max(life.first[b], life.last[b]);
      if (a0 > b1 || b0 > a1) continue;  // never live together
      const bool disjoint = plan.offset[a] + bytes[a] <= plan.offset[b] ||
                            plan.offset[b] + bytes[b] <= plan.offset[a];
      if (!disjoint)
        return ::testing::AssertionFailure() << g.values()[a].name << " and " << g.values()[b].name
                                             << " share bytes while both live";
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(MemoryPlan, AChainPingPongsBetweenTwoBuffers) {
  const Graph g = chain_graph(40, 1000);
  const auto life = runtime::liveness(g);
  const auto bytes = intermediate_bytes(g);
  const MemoryPlan plan = runtime::plan_memory(g, life, bytes, true);
  EXPECT_TRUE(no_live_overlap(g, life, bytes, plan));
  EXPECT_EQ(plan.arena_bytes, 2 * 4096u);  // 4000 bytes rounded to 256, twice
  EXPECT_EQ(plan.unshared_bytes, 40 * 4096u);
}

// A small ResNet-18's SGD training step graph (batch 2, 32x32, 10 classes).
Graph resnet18_step() {
  const Graph model = build_zoo_model(
      "resnet18", {.batch = 2, .image_size = 32, .num_classes = 10, .training = true});
  return TrainingSession(model, LossSpec{}, SgdOptions{.lr = 0.1, .momentum = 0.9}).step_graph();
}

// The peak: the node where the most bytes are live, and exactly the values live there (the
// largest first), adding up to peak_live_bytes; note_peak names them for ExecutableStats.
TEST(MemoryPlan, NamesThePeakAndWhatIsLiveThere) {
  const Graph g = resnet18_step();
  const auto life = runtime::liveness(g);
  const auto bytes = intermediate_bytes(g);
  const MemoryPlan plan = runtime::plan_memory(g, life, bytes, true);
  ASSERT_GE(plan.peak_node, 0);
  ASSERT_FALSE(plan.peak_values.empty());
  size_t sum = 0, previous = SIZE_MAX;
  auto aligned = [](size_t b) {
    return (b + MemoryPlan::kAlignment - 1) / MemoryPlan::kAlignment * MemoryPlan::kAlignment;
  };
  for (ValueId v : plan.peak_values) {
    EXPECT_LE(life.first[size_t(v)], plan.peak_node) << g.value(v).name;
    EXPECT_GE(std::max(life.first[size_t(v)], life.last[size_t(v)]), plan.peak_node)
        << g.value(v).name;
    EXPECT_LE(bytes[size_t(v)], previous);
    previous = bytes[size_t(v)];
    sum += aligned(bytes[size_t(v)]);
  }
  EXPECT_EQ(sum, plan.peak_live_bytes);
  // Every planned value live at the peak node is listed.
  size_t live_there = 0;
  for (size_t v = 0; v < bytes.size(); ++v)
    live_there += bytes[v] > 0 && life.first[v] <= plan.peak_node &&
                  std::max(life.first[v], life.last[v]) >= plan.peak_node;
  EXPECT_EQ(live_there, plan.peak_values.size());
  ExecutableStats stats;
  runtime::note_peak(g, plan, bytes, stats);
  EXPECT_EQ(stats.peak_node, g.nodes()[size_t(plan.peak_node)].name);
  ASSERT_EQ(stats.peak_values.size(), std::min<size_t>(8, plan.peak_values.size()));
  EXPECT_EQ(stats.peak_values[0].first, g.value(plan.peak_values[0]).name);
  EXPECT_EQ(stats.peak_values[0].second, bytes[size_t(plan.peak_values[0])]);
}

TEST(MemoryPlan, ResNet18TrainingStepSharesSafelyAndNearTheBound) {
  const Graph g = resnet18_step();
  const auto life = runtime::liveness(g);
  const auto bytes = intermediate_bytes(g);
  const MemoryPlan shared = runtime::plan_memory(g, life, bytes, true);
  const MemoryPlan unshared = runtime::plan_memory(g, life, bytes, false);
  EXPECT_TRUE(no_live_overlap(g, life, bytes, shared));
  EXPECT_TRUE(no_live_overlap(g, life, bytes, unshared));
  EXPECT_EQ(unshared.arena_bytes, unshared.unshared_bytes);
  // At batch 2 the weight gradients (all live until the updates at the step's end) are most
  // of the bytes, so sharing saves little here; the plan must still reach the bound.
  EXPECT_GE(shared.arena_bytes, shared.peak_live_bytes);
  EXPECT_LE(double(shared.arena_bytes), 1.25 * double(shared.peak_live_bytes));
  std::printf("resnet18 step: arena %zu, lower bound %zu, unshared %zu bytes\n", shared.arena_bytes,
              shared.peak_live_bytes, shared.unshared_bytes);
}

// Inference: activations die as the next layer reads them, so the arena is a small part of
// what every value in its own buffer would take.
TEST(MemoryPlan, ResNet50InferenceSharesMostBytes) {
  const Graph g = build_zoo_model("resnet50", {.batch = 8, .image_size = 64});
  const auto life = runtime::liveness(g);
  const auto bytes = intermediate_bytes(g);
  const MemoryPlan plan = runtime::plan_memory(g, life, bytes, true);
  EXPECT_TRUE(no_live_overlap(g, life, bytes, plan));
  EXPECT_LT(plan.arena_bytes, plan.unshared_bytes / 8);
  EXPECT_LE(double(plan.arena_bytes), 1.25 * double(plan.peak_live_bytes));
}

// A reshape's output planned as a view of its input: the same offset, and the pair lives as
// one value (the input's bytes stay taken until the view's last reader), counted once.
TEST(MemoryPlan, ViewsShareTheirInputsBytes) {
  const int64_t n = 1024;
  Graph g("views");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {n});
  const ValueId a = b.op(OpKind::relu, {}, {x}).at(0);  // 0
  const ValueId a_view = b.op(OpKind::reshape, ReshapeAttrs{{n / 4, 4}, false}, {a}).at(0);
  const ValueId c = b.op(OpKind::relu, {}, {a_view}).at(0);                  // 2
  const ValueId c_view = b.op(OpKind::flatten, FlattenAttrs{0}, {c}).at(0);  // 3
  const ValueId z = b.op(OpKind::sigmoid, {}, {c_view}).at(0);               // 4
  const ValueId y = b.op(OpKind::add, {}, {a_view, c}).at(0);  // 5: the view read last
  g.mark_output(z);
  g.mark_output(y);
  const auto life = runtime::liveness(g);
  const auto bytes = intermediate_bytes(g);
  std::vector<ValueId> same(g.values().size(), kNoValue);
  same[size_t(a_view)] = a;
  same[size_t(c_view)] = c;
  const MemoryPlan plan = runtime::plan_memory(g, life, bytes, true, same);
  EXPECT_EQ(plan.offset[size_t(a_view)], plan.offset[size_t(a)]);
  EXPECT_EQ(plan.offset[size_t(c_view)], plan.offset[size_t(c)]);
  // a's bytes are live until node 5 through its view: c, written at node 2, goes elsewhere.
  EXPECT_NE(plan.offset[size_t(a)], plan.offset[size_t(c)]);
  EXPECT_EQ(plan.unshared_bytes, 2 * 4096u);  // a and c; the views are no buffers
  EXPECT_EQ(plan.arena_bytes, 2 * 4096u);
  // Without views each value is its own: four buffers, a's dead after node 1.
  const MemoryPlan copies = runtime::plan_memory(g, life, bytes, true);
  EXPECT_EQ(copies.unshared_bytes, 4 * 4096u);
  // A view of a value that is not planned is a bug of the caller's.
  std::vector<ValueId> bad(g.values().size(), kNoValue);
  bad[size_t(a)] = x;
  expect_error([&] { runtime::plan_memory(g, life, bytes, true, bad); }, {"view"});
}

// A view at an offset (a block slice): its bytes start that far into its root's, through a
// chain of views too; an offset past the root's bytes is the caller's bug.
TEST(MemoryPlan, ViewsAtAnOffsetStartInsideTheirRoot) {
  Graph g("offset_views");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {4, 256});
  const ValueId a = b.op(OpKind::relu, {}, {x}).at(0);
  const ValueId part =
      b.slice(a, SliceAttrs{.starts = {2}, .ends = {3}, .axes = {0}, .steps = {1}});
  const ValueId flat = b.op(OpKind::reshape, ReshapeAttrs{{256}, false}, {part}).at(0);
  g.mark_output(b.op(OpKind::sigmoid, {}, {flat}).at(0));
  const auto life = runtime::liveness(g);
  const auto bytes = intermediate_bytes(g);
  std::vector<ValueId> same(g.values().size(), kNoValue);
  std::vector<size_t> offset(g.values().size(), 0);
  same[size_t(part)] = a, offset[size_t(part)] = 2 * 256 * 4;
  same[size_t(flat)] = part;
  const MemoryPlan plan = runtime::plan_memory(g, life, bytes, true, same, offset);
  EXPECT_EQ(plan.offset[size_t(part)], plan.offset[size_t(a)] + 2048);
  EXPECT_EQ(plan.offset[size_t(flat)], plan.offset[size_t(a)] + 2048);
  offset[size_t(part)] = 4 * 256 * 4;  // past a's 4 KiB
  expect_error([&] { runtime::plan_memory(g, life, bytes, true, same, offset); }, {"view"});
}

// A view made late from a stored copy of its root (the layout-views plan maps a layout chain
// onto its first stored value: attention's output O -> transpose (stored) -> reshape -> ... ->
// a transpose back in the backward is a view of O itself): the root's bytes stay its own from
// its last reader in the forward to the view's reader, for the nodes' temporaries too.
TEST(MemoryPlan, FreeGapsKeepARootsBytesUntilItsViewsAreRead) {
  const int64_t n = 1024;
  Graph g("late_view");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {n});
  const ValueId a = b.op(OpKind::relu, {}, {x}).at(0);     // 0: the root
  const ValueId c = b.op(OpKind::sigmoid, {}, {a}).at(0);  // 1: a's last reader
  const ValueId d = b.op(OpKind::relu, {}, {c}).at(0);     // 2
  const ValueId e = b.op(OpKind::sigmoid, {}, {d}).at(0);  // 3
  const ValueId late = b.op(OpKind::neg, {}, {c}).at(0);   // 4: planned a view of a below
  g.mark_output(b.op(OpKind::add, {}, {late, e}).at(0));   // 5: the view's reader
  const auto life = runtime::liveness(g);
  const auto bytes = intermediate_bytes(g);
  std::vector<ValueId> same(g.values().size(), kNoValue);
  same[size_t(late)] = a;
  const MemoryPlan plan = runtime::plan_memory(g, life, bytes, true, same);
  EXPECT_EQ(plan.offset[size_t(late)], plan.offset[size_t(a)]);
  EXPECT_EQ(plan.held_from[size_t(a)], life.first[size_t(a)]);
  EXPECT_EQ(plan.held_to[size_t(a)], life.last[size_t(late)]);
  const std::vector<runtime::Gap> gaps = runtime::free_gaps(g, bytes, plan);
  const size_t at = plan.offset[size_t(a)];
  for (int i = 0; i <= life.last[size_t(late)]; ++i) {
    const runtime::Gap& gap = gaps[size_t(i)];
    if (gap.bytes == 0) continue;
    EXPECT_TRUE(at + bytes[size_t(a)] <= gap.offset || gap.offset + gap.bytes <= at)
        << "node " << i << "'s gap [" << gap.offset << ", " << gap.offset + gap.bytes
        << ") lies in a's bytes, which its view holds until node " << life.last[size_t(late)];
  }
}

// A node's temporaries go in the arena's largest gap at that node: inside the arena and
// clear of every value live while the node runs (its inputs and outputs included).
TEST(MemoryPlan, FreeGapsAvoidEveryLiveValue) {
  const Graph model = build_zoo_model(
      "resnet18", {.batch = 4, .image_size = 32, .num_classes = 10, .training = true});
  TrainingSession session(model, LossSpec{}, SgdOptions{.lr = 0.1, .momentum = 0.9});
  const Graph& g = session.step_graph();
  const auto life = runtime::liveness(g);
  const auto bytes = intermediate_bytes(g);
  const MemoryPlan plan = runtime::plan_memory(g, life, bytes, true);
  const std::vector<runtime::Gap> gaps = runtime::free_gaps(g, bytes, plan);
  ASSERT_EQ(gaps.size(), g.nodes().size());
  size_t lent = 0, with_gap = 0;
  for (size_t i = 0; i < gaps.size(); ++i) {
    const runtime::Gap& gap = gaps[i];
    if (gap.bytes == 0) continue;
    ++with_gap, lent = std::max(lent, gap.bytes);
    ASSERT_LE(gap.offset + gap.bytes, plan.arena_bytes) << "node " << i;
    for (size_t v = 0; v < bytes.size(); ++v) {
      if (bytes[v] == 0) continue;
      const int first = life.first[v], last = std::max(life.first[v], life.last[v]);
      if (int(i) < first || int(i) > last) continue;
      const bool clear =
          plan.offset[v] + bytes[v] <= gap.offset || gap.offset + gap.bytes <= plan.offset[v];
      ASSERT_TRUE(clear) << "node " << i << "'s gap overlaps " << g.values()[v].name;
    }
  }
  // Early in the forward pass most of the arena is free: some node must get room.
  EXPECT_GT(with_gap, g.nodes().size() / 4);
  EXPECT_GT(lent, plan.arena_bytes / 4);
}

}  // namespace
}  // namespace fusebox::testing

namespace fusebox::testing {
namespace {

// A collective's inputs live to the last node (so no later node writes their bytes and waits
// for it); its outputs and everything else keep their usual lives.
// Planned bytes by root (a view, or an output computed in an input's bytes, is its root's):
// two roots that are held at one node at the same time have disjoint bytes.
::testing::AssertionResult no_root_overlap(const Graph& g, const std::vector<size_t>& bytes,
                                           const std::vector<ValueId>& same,
                                           const MemoryPlan& plan) {
  std::vector<size_t> roots;
  for (size_t v = 0; v < bytes.size(); ++v)
    if (bytes[v] > 0 && same[v] == kNoValue) roots.push_back(v);
  for (size_t i = 0; i < roots.size(); ++i) {
    const size_t a = roots[i];
    for (size_t j = i + 1; j < roots.size(); ++j) {
      const size_t b = roots[j];
      if (plan.held_from[a] > plan.held_to[b] || plan.held_from[b] > plan.held_to[a]) continue;
      if (plan.offset[a] + bytes[a] > plan.offset[b] && plan.offset[b] + bytes[b] > plan.offset[a])
        return ::testing::AssertionFailure() << g.values()[a].name << " and " << g.values()[b].name
                                             << " share bytes while both are held";
    }
  }
  return ::testing::AssertionSuccess();
}

// Every value with bytes holds them, in one order.
std::vector<ValueId> in_place_of(const Graph& g, const runtime::Liveness& life,
                                 const std::vector<size_t>& bytes) {
  runtime::InPlaceCandidates c{std::vector<ValueId>(bytes.size(), kNoValue),
                               std::vector<int>(bytes.size(), -1)};
  for (size_t v = 0; v < bytes.size(); ++v)
    if (bytes[v] > 0) c.holder[v] = ValueId(v), c.order[v] = 0;
  return runtime::elementwise_in_place(g, life, bytes, c);
}

// An elementwise node's output may take the bytes of an input that dies there, the same dtype
// and shape: a chain of adds and muls then runs in one buffer. Not an input read later, nor
// one of another dtype or shape (a broadcast scale), nor one an output took already.
TEST(MemoryPlan, ElementwiseOutputsTakeTheirDyingInputsBytes) {
  const Graph chain = chain_graph(40, 1000);
  const auto chain_life = runtime::liveness(chain);
  const auto chain_bytes = intermediate_bytes(chain);
  const std::vector<ValueId> in = in_place_of(chain, chain_life, chain_bytes);
  size_t taken = 0;
  for (const Node& n : chain.nodes()) {
    const ValueId out = n.outputs[0];
    if (in[size_t(out)] == kNoValue) continue;
    EXPECT_EQ(in[size_t(out)], n.inputs[0]) << chain.value(out).name;
    ++taken;
  }
  EXPECT_EQ(taken, 39u);  // the first reads the graph's input, the last writes its output
  const MemoryPlan plan = runtime::plan_memory(chain, chain_life, chain_bytes, true, in);
  EXPECT_EQ(plan.arena_bytes, 4096u);
  EXPECT_TRUE(no_root_overlap(chain, chain_bytes, in, plan));

  Graph g("not_in_place");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {4, 8});
  const ValueId s = g.add_input("s", DType::f32, {4, 1});
  const ValueId a = b.op(OpKind::relu, {}, {x}).at(0);     // 0
  const ValueId c = b.op(OpKind::sigmoid, {}, {a}).at(0);  // 1: a is read again at 3
  const ValueId sc = b.op(OpKind::relu, {}, {s}).at(0);    // 2
  const ValueId d = b.op(OpKind::mul, {}, {c, a}).at(0);   // 3: in place of c (a taken? no)
  const ValueId e = b.op(OpKind::mul, {}, {d, sc}).at(0);  // 4: of d, not of sc [4, 1]
  const ValueId h = b.op(OpKind::cast, CastAttrs{DType::f16}, {e}).at(0);  // 5: a shape op
  g.mark_output(b.op(OpKind::relu, {}, {h}).at(0));
  const auto life = runtime::liveness(g);
  const auto bytes = intermediate_bytes(g);
  const std::vector<ValueId> got = in_place_of(g, life, bytes);
  EXPECT_EQ(got[size_t(c)], kNoValue) << "a is read after node 1";
  EXPECT_EQ(got[size_t(d)], c) << "the first operand that dies, of d's dtype and shape";
  EXPECT_EQ(got[size_t(e)], d) << "not the [4, 1] scale";
  EXPECT_EQ(got[size_t(h)], kNoValue) << "cast is not elementwise here (another dtype)";
}

// On a model, with its reshapes as views of their inputs (as the CUDA executable reads them
// through): the in-place plan is smaller and shares no held bytes. ConvNeXt's block holds its
// residual, the MLP's product (its rows reshaped: a view) and its GELU at once; in place, the
// GELU takes the product's bytes.
TEST(MemoryPlan, ElementwiseInPlaceShrinksAModelsArena) {
  const Graph g = build_zoo_model("convnext_test", {.batch = 4});
  const auto life = runtime::liveness(g);
  const auto bytes = intermediate_bytes(g);
  runtime::InPlaceCandidates c{std::vector<ValueId>(bytes.size(), kNoValue),
                               std::vector<int>(bytes.size(), -1)};
  std::vector<ValueId> views(g.values().size(), kNoValue);
  for (size_t v = 0; v < bytes.size(); ++v)
    if (bytes[v] > 0) c.holder[v] = ValueId(v), c.order[v] = 0;
  for (const Node& n : g.nodes()) {  // in node order: a view of a view has the first's root
    if (!is_reshape_family(n.op) || c.holder[size_t(n.inputs[0])] == kNoValue) continue;
    const ValueId out = n.outputs[0], root = c.holder[size_t(n.inputs[0])];
    views[size_t(out)] = root;
    c.holder[size_t(out)] = root;  // a reshape of a dense value: dense from byte 0, same order
  }
  const std::vector<ValueId> in = runtime::elementwise_in_place(g, life, bytes, c);
  std::vector<ValueId> same = views;
  size_t taken = 0;
  for (size_t v = 0; v < same.size(); ++v)
    if (in[v] != kNoValue) same[v] = in[v], ++taken;
  EXPECT_GT(taken, 0u);
  const MemoryPlan before = runtime::plan_memory(g, life, bytes, true, views);
  const MemoryPlan after = runtime::plan_memory(g, life, bytes, true, same);
  EXPECT_TRUE(no_root_overlap(g, bytes, same, after));
  EXPECT_LT(after.arena_bytes, before.arena_bytes);
  EXPECT_LT(after.peak_live_bytes, before.peak_live_bytes);
  std::printf(
      "convnext_test b4: %zu outputs in place; arena %zu -> %zu bytes (live at most %zu "
      "-> %zu)\n",
      taken, before.arena_bytes, after.arena_bytes, before.peak_live_bytes, after.peak_live_bytes);
  // A training step (relu masks, gradient sums, optimizer-side chains): never more live, and no
  // bytes shared while held.
  const Graph step = resnet18_step();
  const auto step_life = runtime::liveness(step);
  const auto step_bytes = intermediate_bytes(step);
  const std::vector<ValueId> step_in = in_place_of(step, step_life, step_bytes);
  const MemoryPlan step_before = runtime::plan_memory(step, step_life, step_bytes, true);
  const MemoryPlan step_after = runtime::plan_memory(step, step_life, step_bytes, true, step_in);
  EXPECT_TRUE(no_root_overlap(step, step_bytes, step_in, step_after));
  EXPECT_LE(step_after.peak_live_bytes, step_before.peak_live_bytes);
  EXPECT_GT(std::count_if(step_in.begin(), step_in.end(), [](ValueId v) { return v != kNoValue; }),
            0);
}

TEST(MemoryPlan, AllReduceInputsLiveToTheStepsEnd) {
  Graph g("collective");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {64});
  const ValueId grad = b.name("grad").op(OpKind::relu, {}, {x}).at(0);
  const ValueId avg = g.add_node(OpKind::all_reduce, AllReduceAttrs{}, {grad}, "bucket")[0];
  const ValueId later = b.name("later").op(OpKind::neg, {}, {x}).at(0);
  const ValueId last = b.name("last").op(OpKind::add, {}, {avg, later}).at(0);
  g.mark_output(last);
  const runtime::Liveness life = runtime::liveness(g);
  EXPECT_EQ(life.last[size_t(grad)], int(g.nodes().size()) - 1);
  EXPECT_EQ(life.last[size_t(avg)], g.value(last).producer);
  EXPECT_EQ(life.last[size_t(later)], g.value(last).producer);
  const std::vector<size_t> bytes = intermediate_bytes(g);
  const MemoryPlan plan = runtime::plan_memory(g, life, bytes, true);
  EXPECT_TRUE(no_live_overlap(g, life, bytes, plan));
  // `later` is written after the collective: it must not take the gradient's bytes.
  EXPECT_NE(plan.offset[size_t(later)], plan.offset[size_t(grad)]);
}

}  // namespace
}  // namespace fusebox::testing
