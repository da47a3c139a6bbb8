// The layout pass (passes/layout.h): which values are stored channels-last and where the
// plan converts, on a ResNet-like block, its training graph, and the edge cases.
#include "fusebox/passes/layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>

#include "fusebox/ir/builder.h"
#include "fusebox/passes/autodiff.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

constexpr MemoryFormat kCL = MemoryFormat::channels_last;
constexpr MemoryFormat kContig = MemoryFormat::contiguous;

ValueId param(Graph& g, const std::string& name, Shape shape, uint64_t seed) {
  return g.add_constant(name, random_tensor(DType::f32, shape, seed));
}

// x -> conv -> bn -> relu -> max_pool -> conv -> bn -> (+ pool) -> relu -> global_avg_pool
//   -> flatten -> gemm
struct Block {
  Graph g{"block"};
  ValueId x, w1, c1, b1, r1, p1, w2, c2, b2, sum, r2, gap, flat, logits;
};

Block make_block() {
  Block k;
  Graph& g = k.g;
  Builder b(g);
  k.x = g.add_input("x", DType::f32, {2, 8, 16, 16});
  k.w1 = param(g, "w1", {8, 8, 3, 3}, 1);
  auto bn = [&](ValueId v, const std::string& p) {
    return b.batch_norm(v, param(g, p + ".scale", {8}, 2), param(g, p + ".bias", {8}, 3),
                        param(g, p + ".mean", {8}, 4),
                        g.add_constant(p + ".var", random_tensor(DType::f32, {8}, 5, 0.5, 1.5)));
  };
  k.c1 = b.conv(k.x, k.w1, kNoValue, ConvAttrs{.pads_begin = {1, 1}, .pads_end = {1, 1}});
  k.b1 = bn(k.c1, "bn1");
  k.r1 = b.relu(k.b1);
  k.p1 = b.max_pool(k.r1, PoolAttrs{.kernel = {2, 2}, .strides = {2, 2}});
  k.w2 = param(g, "w2", {8, 8, 3, 3}, 6);
  k.c2 = b.conv(k.p1, k.w2, kNoValue, ConvAttrs{.pads_begin = {1, 1}, .pads_end = {1, 1}});
  k.b2 = bn(k.c2, "bn2");
  k.sum = b.add(k.b2, k.p1);
  k.r2 = b.relu(k.sum);
  k.gap = b.global_avg_pool(k.r2);
  k.flat = b.flatten(k.gap);
  k.logits = b.gemm(k.flat, param(g, "fc.w", {8, 5}, 7));
  g.mark_output(k.logits);
  return k;
}

TEST(LayoutPass, ConvolutionRegionIsChannelsLastWithoutConversions) {
  Block k = make_block();
  const LayoutPlan plan = plan_layouts(k.g);
  for (ValueId v : {k.x, k.w1, k.c1, k.b1, k.r1, k.p1, k.w2, k.c2, k.b2, k.sum, k.r2})
    EXPECT_EQ(plan.of(v), kCL) << k.g.value(v).name;
  // [2, 8, 1, 1] is the same memory either way: kept contiguous; so is everything 2-D.
  for (ValueId v : {k.gap, k.flat, k.logits}) EXPECT_EQ(plan.of(v), kContig) << k.g.value(v).name;
  // Per-channel vectors are never channels-last.
  for (const auto& [v, t] : k.g.constants()) {
    if (t.shape().size() < 3) {
      EXPECT_EQ(plan.of(v), kContig) << k.g.value(v).name;
    }
  }
  EXPECT_TRUE(plan.conversions.empty()) << plan.describe(k.g);
  EXPECT_EQ(plan.loads_converted, 3);  // x, w1, w2
  EXPECT_EQ(plan.channels_last_values, 11);
}

// all_reduce is pairwise: a channels-last filter gradient is reduced and returned channels-last,
// with no conversion at the bucket; a contiguous one beside it stays contiguous.
TEST(LayoutPass, AllReduceKeepsEachGradientInItsOrder) {
  Graph g("bucket");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {2, 4, 6, 6});
  const ValueId dy = g.add_input("dy", DType::f32, {2, 8, 6, 6});
  const ValueId dw = b.conv_backward_filter(
      x, dy,
      ConvBackwardFilterAttrs{.conv = {.pads_begin = {1, 1}, .pads_end = {1, 1}},
                              .filter_spatial = {3, 3}});
  const ValueId dx = b.op(OpKind::reshape, ReshapeAttrs{{2, 4, 36, 1}}, {x}).at(0);
  const std::vector<ValueId> avg = g.add_node(OpKind::all_reduce, AllReduceAttrs{}, {dw, dx}, "dp");
  g.mark_output(avg[0]);
  g.mark_output(avg[1]);
  const LayoutPlan plan = plan_layouts(g);
  EXPECT_EQ(plan.of(dw), kCL);
  EXPECT_EQ(plan.of(avg[0]), kCL);
  EXPECT_EQ(plan.of(avg[1]), kContig);
  for (const LayoutPlan::Conversion& c : plan.conversions)
    EXPECT_NE(c.node, g.value(avg[0]).producer) << plan.describe(g);
}

TEST(LayoutPass, ContiguousPolicyAndEnvironment) {
  Block k = make_block();
  const LayoutPlan plan = plan_layouts(k.g, LayoutPolicy::contiguous);
  for (MemoryFormat f : plan.format) EXPECT_EQ(f, kContig);
  EXPECT_TRUE(plan.conversions.empty());
  {
    ScopedEnv env("FUSEBOX_LAYOUT", "contiguous");
    EXPECT_EQ(layout_policy_from_env(), LayoutPolicy::contiguous);
  }
  {
    ScopedEnv env("FUSEBOX_LAYOUT", "auto");
    EXPECT_EQ(layout_policy_from_env(), LayoutPolicy::channels_last_convs);
  }
  {
    ScopedEnv env("FUSEBOX_LAYOUT", "nhwc");
    try {
      layout_policy_from_env();
      FAIL() << "a bad FUSEBOX_LAYOUT was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FUSEBOX_LAYOUT"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("contiguous"), std::string::npos) << e.what();
    }
  }
}

TEST(LayoutPass, NoConvolutionNoChannelsLast) {
  Graph g("mlp");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {2, 4, 6, 6});
  ValueId y = b.relu(b.max_pool(b.add(x, x), PoolAttrs{.kernel = {2, 2}}));
  g.mark_output(y);
  const LayoutPlan plan = plan_layouts(g);
  for (MemoryFormat f : plan.format) EXPECT_EQ(f, kContig);
  EXPECT_TRUE(plan.conversions.empty());
}

// A softmax inside the region needs contiguous data: one conversion, named; its output
// (written contiguous by its kernel) stays contiguous, and the conv reading it gets it
// converted to channels-last (a second conversion).
TEST(LayoutPass, ContiguousOpsInsideTheRegionAreConversions) {
  Graph g("mixed");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {1, 4, 8, 8});
  ValueId c = b.conv(x, param(g, "w", {4, 4, 1, 1}, 1));
  ValueId s = b.softmax(c, 1);  // needs contiguous input
  ValueId c2 = b.conv(s, param(g, "w2", {4, 4, 1, 1}, 2));
  ValueId out = b.relu(c2);
  g.mark_output(out);
  const LayoutPlan plan = plan_layouts(g);
  EXPECT_EQ(plan.of(c), kCL);
  EXPECT_EQ(plan.of(s), kContig);  // softmax writes contiguous
  EXPECT_EQ(plan.of(c2), kCL);
  EXPECT_EQ(plan.of(out), kCL);
  ASSERT_EQ(plan.conversions.size(), 3u) << plan.describe(g);
  EXPECT_EQ(plan.conversions[0].value, c);
  EXPECT_EQ(plan.conversions[0].to, kContig);
  EXPECT_EQ(plan.conversions[1].value, s);
  EXPECT_EQ(plan.conversions[1].to, kCL);
  EXPECT_EQ(layout_role(g.node(plan.conversions[1].node)), LayoutRole::convolution);
  EXPECT_EQ(plan.conversions[2].node, -1);  // the graph output, read back to the host
  EXPECT_EQ(plan.conversions[2].value, out);
  const std::string text = plan.describe(g);
  EXPECT_NE(text.find("softmax"), std::string::npos) << text;
  EXPECT_NE(text.find("the graph output"), std::string::npos) << text;
}

// max_pool with indices counts them in NCHW order: it stays contiguous, and so does the
// region behind it unless a convolution reaches it another way.
TEST(LayoutPass, MaxPoolWithIndicesIsContiguous) {
  Graph g("idx");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {1, 4, 8, 8});
  ValueId c = b.conv(x, param(g, "w", {4, 4, 3, 3}, 1));
  std::vector<ValueId> pooled =
      g.add_node(OpKind::max_pool, PoolAttrs{.kernel = {2, 2}, .return_indices = true}, {c});
  g.mark_output(pooled[0]);
  g.mark_output(pooled[1]);
  const LayoutPlan plan = plan_layouts(g);
  EXPECT_EQ(layout_role(g.node(g.value(pooled[0]).producer)), LayoutRole::contiguous);
  EXPECT_EQ(plan.of(c), kCL);
  EXPECT_EQ(plan.of(pooled[0]), kContig);
  EXPECT_EQ(plan.of(pooled[1]), kContig);
  ASSERT_EQ(plan.conversions.size(), 1u) << plan.describe(g);
  EXPECT_EQ(plan.conversions[0].value, c);
}

// The training graph of the block (autodiff): the backward convolutions, batch-norm
// backward, pool backward and the elementwise gradient ops stay in the region; the filter
// gradients are channels-last like the filters.
TEST(LayoutPass, TrainingGraphStaysChannelsLast) {
  Graph g("train");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {2, 3, 12, 12});
  ValueId w1 = g.add_input("w1", DType::f32, {8, 3, 3, 3});
  ValueId w2 = g.add_input("w2", DType::f32, {8, 8, 3, 3});
  auto bn = [&](ValueId v, const std::string& p) {
    return b.batch_norm_training(v, param(g, p + ".s", {8}, 2), param(g, p + ".b", {8}, 3),
                                 param(g, p + ".m", {8}, 4), param(g, p + ".v", {8}, 5),
                                 BatchNormAttrs{.training = true})[0];
  };
  ValueId h = b.relu(
      bn(b.conv(x, w1, kNoValue, ConvAttrs{.pads_begin = {1, 1}, .pads_end = {1, 1}}), "bn1"));
  h = b.max_pool(h, PoolAttrs{.kernel = {2, 2}, .strides = {2, 2}});
  ValueId h2 = b.relu(b.add(
      bn(b.conv(h, w2, kNoValue, ConvAttrs{.pads_begin = {1, 1}, .pads_end = {1, 1}}), "bn2"), h));
  ValueId loss = b.reduce_mean(b.global_avg_pool(h2), {}, false);
  g.mark_output(loss);
  GradResult r = grad(g, loss, {w1, w2});
  g.mark_output(r.of(w1));
  g.mark_output(r.of(w2));

  const LayoutPlan plan = plan_layouts(g);
  EXPECT_EQ(plan.of(r.of(w1)), kCL);
  EXPECT_EQ(plan.of(r.of(w2)), kCL);
  int64_t checked = 0;
  for (const Node& n : g.nodes()) {
    const LayoutRole role = layout_role(n);
    if (role == LayoutRole::contiguous) continue;
    for (ValueId v : n.outputs) {
      const Shape& s = g.value(v).type.shape;
      if (s.size() != 4 || s[1] == 1 || s[2] * s[3] == 1) continue;
      EXPECT_EQ(plan.of(v), kCL) << node_label(n) << " output " << g.value(v).name;
      ++checked;
    }
  }
  EXPECT_GT(checked, 15);
  std::cout << plan.describe(g);
  // What remains: the filter gradients read back to the host, and whatever the gradient
  // of global_avg_pool / reduce_mean feeds in (an expand of [2, 8, 1, 1], elementwise).
  for (const LayoutPlan::Conversion& c : plan.conversions) {
    if (c.node < 0) continue;
    ADD_FAILURE() << "conversion inside the training graph: " << plan.describe(g);
    break;
  }
}

// ConvNeXt's block: a depthwise convolution, a permute to NHWC for the layer norm and the
// linear layers, a permute back and a residual add. Both permutes are the input's bytes:
// the first reads the convolution's channels-last output as NHWC contiguous, the second
// writes the residual's channels-last order from NHWC contiguous; nothing is converted.
TEST(LayoutPass, ConvNextPermutesCopyNothing) {
  Graph g("convnext_block");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {2, 8, 6, 6});
  ValueId d = b.conv(x, param(g, "dw", {8, 1, 3, 3}, 1), param(g, "dw.b", {8}, 2),
                     ConvAttrs{.pads_begin = {1, 1}, .pads_end = {1, 1}, .groups = 8});
  ValueId nhwc = b.transpose(d, {0, 2, 3, 1});
  ValueId ln = b.layer_norm(nhwc, param(g, "ln.s", {8}, 3), param(g, "ln.b", {8}, 4));
  ValueId h = b.gelu(b.matmul(ln, param(g, "fc1", {8, 32}, 5)));
  ValueId o = b.matmul(h, param(g, "fc2", {32, 8}, 6));
  ValueId nchw = b.transpose(o, {0, 3, 1, 2});
  ValueId scaled = b.mul(nchw, param(g, "gamma", {8, 1, 1}, 7));
  ValueId sum = b.add(scaled, x);
  ValueId next = b.conv(sum, param(g, "w2", {8, 8, 1, 1}, 8));
  g.mark_output(next);
  const LayoutPlan plan = plan_layouts(g);
  EXPECT_EQ(plan.of(d), kCL);
  EXPECT_EQ(plan.of(nhwc), kContig);
  EXPECT_EQ(plan.of(o), kContig);
  EXPECT_EQ(plan.of(nchw), kCL);  // a transpose writes the order its readers' group has
  EXPECT_EQ(plan.of(sum), kCL);
  EXPECT_EQ(plan.transpose_views, 2) << plan.describe(g);
  for (const LayoutPlan::Conversion& c : plan.conversions)
    EXPECT_EQ(c.node, -1) << "conversion inside the block: " << plan.describe(g);
  EXPECT_NE(plan.describe(g).find("2 transposes copy nothing"), std::string::npos)
      << plan.describe(g);
}

// Which transposes are their input's bytes, by order.
TEST(LayoutPass, TransposeKeepsBytes) {
  const Shape nchw{2, 8, 6, 5}, nhwc{2, 6, 5, 8};
  EXPECT_TRUE(transpose_keeps_bytes(nchw, {0, 2, 3, 1}, kCL, kContig));
  EXPECT_FALSE(transpose_keeps_bytes(nchw, {0, 2, 3, 1}, kContig, kContig));
  EXPECT_FALSE(transpose_keeps_bytes(nchw, {0, 2, 3, 1}, kCL, kCL));
  EXPECT_TRUE(transpose_keeps_bytes(nhwc, {0, 3, 1, 2}, kContig, kCL));
  EXPECT_FALSE(transpose_keeps_bytes(nhwc, {0, 3, 1, 2}, kCL, kCL));
  EXPECT_TRUE(transpose_keeps_bytes(nchw, {0, 1, 2, 3}, kContig, kContig));
  // Dims of extent 1 move freely: [N, 1, L] -> [N, L, 1].
  EXPECT_TRUE(transpose_keeps_bytes({4, 1, 9}, {0, 2, 1}, kContig, kContig));
  EXPECT_FALSE(transpose_keeps_bytes({4, 3, 9}, {0, 2, 1}, kContig, kContig));
  EXPECT_FALSE(transpose_keeps_bytes(nchw, {0, 2, 3}, kCL, kContig));  // malformed perm
  EXPECT_FALSE(transpose_keeps_bytes(nchw, {0, 2, 3, 4}, kCL, kContig));
}

// DenseNet: the concatenation of channels-last convolution outputs is written channels-last
// for the convolution that reads it (no conversion on either side of the concat).
TEST(LayoutPass, ConcatOfConvolutionsIsChannelsLast) {
  Graph g("dense_block");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {2, 4, 6, 6});
  ValueId c1 = b.conv(x, param(g, "w1", {4, 4, 3, 3}, 1), kNoValue,
                      ConvAttrs{.pads_begin = {1, 1}, .pads_end = {1, 1}});
  ValueId cat = b.concat({x, c1}, 1);
  ValueId c2 = b.conv(b.relu(cat), param(g, "w2", {4, 8, 1, 1}, 2));
  g.mark_output(c2);
  const LayoutPlan plan = plan_layouts(g);
  EXPECT_EQ(plan.of(cat), kCL);
  EXPECT_EQ(plan.of(c1), kCL);
  for (const LayoutPlan::Conversion& c : plan.conversions)
    EXPECT_EQ(c.node, -1) << plan.describe(g);
}

// UNet's skip connection in training: the concat's gradient is sliced into its inputs'
// gradients, which the convolutions' backward ops read: the slices keep the concat
// gradient's channels-last order (a slice whose output were contiguous would transpose 512 MB
// and hand cuDNN NCHW gradients: 3.2 ms of UNet's step on an H200), and no convolution reads
// a converted operand.
TEST(LayoutPass, ConcatGradientSlicesStayChannelsLast) {
  Graph g("skip");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {2, 4, 8, 8});
  ValueId w1 = g.add_input("w1", DType::f32, {4, 4, 3, 3});
  ValueId w2 = g.add_input("w2", DType::f32, {4, 4, 1, 1});
  ValueId w3 = g.add_input("w3", DType::f32, {2, 8, 3, 3});
  const ConvAttrs same{.pads_begin = {1, 1}, .pads_end = {1, 1}};
  ValueId skip = b.relu(b.conv(x, w1, kNoValue, same));
  ValueId up = b.conv(skip, w2);
  ValueId y = b.conv(b.concat({skip, up}, 1), w3, kNoValue, same);
  ValueId loss = b.reduce_mean(b.mul(y, y), {}, false);
  g.mark_output(loss);
  GradResult r = grad(g, loss, {w1, w2, w3});
  for (ValueId v : {w1, w2, w3}) g.mark_output(r.of(v));

  const LayoutPlan plan = plan_layouts(g);
  int slices = 0;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::slice) continue;
    ++slices;
    EXPECT_EQ(plan.of(n.inputs[0]), kCL) << node_label(n) << "\n" << plan.describe(g);
    EXPECT_EQ(plan.of(n.outputs[0]), kCL) << node_label(n) << "\n" << plan.describe(g);
  }
  EXPECT_EQ(slices, 2) << "the concat's gradient should be sliced in two";
  for (const LayoutPlan::Conversion& c : plan.conversions) {
    if (c.node < 0) continue;
    EXPECT_NE(layout_role(g.node(c.node)), LayoutRole::convolution)
        << "a convolution reads a converted operand: " << plan.describe(g);
  }
}

// What still copies, with why: a transpose that is a view is not listed, one that is not is;
// a slice, a concat, a cast and the plan's conversions are.
TEST(LayoutPass, CopiesAreListedWithReasons) {
  Graph g("copies");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {2, 8, 6, 6});
  ValueId c = b.conv(x, param(g, "w", {8, 8, 1, 1}, 1));
  ValueId nhwc = b.transpose(c, {0, 2, 3, 1});        // a view: not listed
  ValueId swapped = b.transpose(nhwc, {0, 2, 1, 3});  // a copy
  ValueId sliced =
      b.slice(swapped, SliceAttrs{.starts = {1}, .ends = {5}, .axes = {1}, .steps = {1}});
  ValueId joined = b.concat({sliced, sliced}, 1);
  ValueId low = b.cast(joined, DType::bf16);
  g.mark_output(low);
  const LayoutPlan plan = plan_layouts(g);
  const std::vector<LayoutCopy> copies = layout_copies(g, plan);
  std::map<std::string, std::string> reason;  // by the first word of `what`
  for (const LayoutCopy& copy : copies) {
    reason[copy.what.substr(0, copy.what.find(' '))] += copy.reason + "; ";
    EXPECT_GT(copy.bytes, 0u) << copy.what;
  }
  const std::string text = describe_copies(copies);
  ASSERT_EQ(reason.count("transpose"), 1u) << text;
  EXPECT_NE(reason["transpose"].find("not its input's"), std::string::npos) << text;
  EXPECT_EQ(
      std::count_if(copies.begin(), copies.end(),
                    [](const LayoutCopy& copy) { return copy.what.rfind("transpose", 0) == 0; }),
      1)
      << text;
  EXPECT_EQ(reason.count("slice"), 1u) << text;
  EXPECT_EQ(reason.count("concat"), 1u) << text;
  EXPECT_EQ(reason.count("cast"), 1u) << text;
  EXPECT_NE(text.find("copies: " + std::to_string(copies.size()) + " nodes move data"),
            std::string::npos)
      << text;
  EXPECT_NE(describe_copies(copies, 1).find("... " + std::to_string(copies.size() - 1) + " more"),
            std::string::npos);
  // Nodes the executable reads through are no copies, whatever the plan says.
  const std::string swapped_node = g.node(g.value(swapped).producer).name;
  const std::vector<LayoutCopy> fewer = layout_copies(g, plan, {swapped_node});
  EXPECT_EQ(fewer.size(), copies.size() - 1);
  for (const LayoutCopy& copy : fewer)
    EXPECT_EQ(copy.what.rfind("transpose", 0), std::string::npos);
}

// block_slice_offset: one block of a contiguous input (the dims before the cut of extent 1, those
// after it whole, steps of 1) and where it starts; anything else is no block. The copy report
// counts an aligned block slice as no copy.
TEST(LayoutPass, BlockSlicesAndTheirOffsets) {
  Graph g("slices");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {3, 4, 64});
  const ValueId one = g.add_input("one", DType::f32, {1, 6, 64});
  auto slice = [&](ValueId v, int64_t axis, int64_t start, int64_t end, int64_t step = 1) {
    const ValueId out =
        b.slice(v, SliceAttrs{.starts = {start}, .ends = {end}, .axes = {axis}, .steps = {step}});
    g.mark_output(out);
    return g.node(g.value(out).producer);
  };
  EXPECT_EQ(block_slice_offset(g, slice(x, 0, 1, 2)), size_t(1 * 4 * 64 * 4));  // q, k or v
  EXPECT_EQ(block_slice_offset(g, slice(x, 0, 1, 3)), size_t(1 * 4 * 64 * 4));  // two blocks' run
  EXPECT_EQ(block_slice_offset(g, slice(one, 1, 2, 5)), size_t(2 * 64 * 4));    // leading 1
  EXPECT_EQ(block_slice_offset(g, slice(x, 1, 1, 2)), std::nullopt);  // dim 0 of 3 before it
  EXPECT_EQ(block_slice_offset(g, slice(x, 2, 0, 32)), std::nullopt);
  EXPECT_EQ(block_slice_offset(g, slice(x, 0, 0, 3, 2)), std::nullopt);  // a step of 2
  EXPECT_EQ(block_slice_offset(g, g.node(g.value(b.relu(x)).producer)), std::nullopt);
  const std::vector<LayoutCopy> copies =
      layout_copies(g, plan_layouts(g, LayoutPolicy::channels_last_convs));
  size_t slices = 0;
  for (const LayoutCopy& c : copies) slices += c.what.rfind("slice", 0) == 0;
  EXPECT_EQ(slices, 3u);  // the three that are no block
}

}  // namespace
}  // namespace fusebox::testing
