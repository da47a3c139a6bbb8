// The fast CPU kernels (fusebox/backends/cpu_fast.h) against the reference backend: each node
// oneDNN takes (convolutions of every shape class with their epilogues, gemm, matmul) within
// tolerance of the reference, constant weights and weights fed as inputs; the nodes it
// refuses run on the reference kernels, bit for bit; a zoo ResNet through the inference
// pipeline. Skipped, saying so, in a build without oneDNN.
#include <gtest/gtest.h>

#include <iostream>

#include "fusebox/backends/cpu_fast.h"
#ifdef FUSEBOX_WITH_ONEDNN
#include <cstring>

#include "backends/cpu_fast/onednn.h"
#endif
#include "fusebox/ir/builder.h"
#include "fusebox/passes/pipeline.h"
#include "fusebox/runtime/executable.h"
#include "fusebox/runtime/executor.h"
#include "fusebox/zoo.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

#define REQUIRE_ONEDNN()                                                                    \
  if (!cpu_fast::built_with_onednn())                                                       \
  GTEST_SKIP() << "this build has no oneDNN (scripts/setup.sh puts it in .deps-cpu/): the " \
                  "fast CPU kernels are the reference ones"

// Runs `g` on the fast kernels and on the reference; expects `fast_nodes` nodes on oneDNN and
// the outputs within rtol/atol (0, 0: bit for bit).
void expect_fast_matches_reference(const Graph& g, const NamedTensors& feeds, size_t fast_nodes,
                                   double rtol = 1e-4, double atol = 1e-5) {
  const NamedTensors want = run_graph(g, feeds);
  auto exe = Executable::compile(
      g, {.device = Device::cpu, .cpu_kernels = CpuKernels::fast, .poison = true});
  EXPECT_EQ(exe->stats().fast_nodes, fast_nodes) << exe->stats().fast_summary;
  for (int run = 0; run < 2; ++run) {  // kernels are made once and run many times
    const NamedTensors got = exe->run(feeds);
    for (const auto& [name, t] : want)
      EXPECT_TRUE(all_close(got.at(name), t, rtol, atol)) << name << " run " << run << "\n"
                                                          << exe->stats().fast_summary;
  }
}

struct ConvCase {
  std::string what;
  Shape x, w;
  ConvAttrs attrs;
  bool bias = true, residual = false, weights_as_input = false;
};

// A convolution of every shape class (no epilogue): the forward's and the backward's cases.
std::vector<ConvCase> conv_geometries() {
  return {
      {"3x3 same", {2, 8, 9, 9}, {16, 8, 3, 3}, {.pads_begin = {1, 1}, .pads_end = {1, 1}}},
      {"1x1 stride 2", {2, 16, 8, 8}, {8, 16, 1, 1}, {.strides = {2, 2}}},
      {"7x7 stride 2 stem, C 3",
       {1, 3, 32, 32},
       {8, 3, 7, 7},
       {.strides = {2, 2}, .pads_begin = {3, 3}, .pads_end = {3, 3}}},
      {"dilated, asymmetric pads",
       {1, 4, 10, 11},
       {6, 4, 3, 3},
       {.dilations = {2, 2}, .pads_begin = {2, 1}, .pads_end = {1, 2}}},
      {"groups 2",
       {2, 8, 7, 7},
       {12, 4, 3, 3},
       {.pads_begin = {1, 1}, .pads_end = {1, 1}, .groups = 2}},
      {"depthwise 5x5",
       {2, 12, 9, 9},
       {12, 1, 5, 5},
       {.pads_begin = {2, 2}, .pads_end = {2, 2}, .groups = 12}},
      {"1-D", {2, 6, 17}, {5, 6, 3}, {.pads_begin = {1}, .pads_end = {1}}},
      {"3-D", {1, 3, 5, 6, 7}, {4, 3, 3, 3, 3}, {.pads_begin = {1, 1, 1}, .pads_end = {1, 1, 1}}},
  };
}

TEST(CpuFast, ConvolutionsMatchTheReference) {
  REQUIRE_ONEDNN();
  const FusedActivation relu{Activation::relu}, gelu{Activation::gelu}, silu{Activation::silu},
      clip{Activation::clip, -0.5, 0.5};
  std::vector<ConvCase> cases = conv_geometries();
  const std::vector<ConvCase> epilogues = {
      {"depthwise 5x5 + relu",
       {2, 12, 9, 9},
       {12, 1, 5, 5},
       {.pads_begin = {2, 2}, .pads_end = {2, 2}, .groups = 12, .activation = relu}},
      {"no bias + gelu", {1, 4, 6, 6}, {4, 4, 3, 3}, {.activation = gelu}, false},
      {"silu", {1, 4, 6, 6}, {4, 4, 1, 1}, {.activation = silu}},
      {"clip", {1, 4, 6, 6}, {4, 4, 1, 1}, {.activation = clip}},
      {"residual + relu",
       {2, 8, 6, 6},
       {8, 8, 3, 3},
       {.pads_begin = {1, 1}, .pads_end = {1, 1}, .residual_activation = relu},
       true,
       true},
      {"relu, residual, relu",
       {2, 8, 6, 6},
       {8, 8, 1, 1},
       {.activation = relu, .residual_activation = relu},
       false,
       true},
      {"weights fed as an input",
       {2, 8, 6, 6},
       {8, 8, 3, 3},
       {.pads_begin = {1, 1}, .pads_end = {1, 1}},
       true,
       false,
       true},
  };
  cases.insert(cases.end(), epilogues.begin(), epilogues.end());
  uint64_t seed = 1;
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(c.what);
    Graph g("conv");
    const ValueId x = g.add_input("x", DType::f32, c.x);
    NamedTensors feeds{{"x", random_tensor(DType::f32, c.x, seed++)}};
    ValueId w;
    if (c.weights_as_input) {
      w = g.add_input("w", DType::f32, c.w);
      feeds["w"] = random_tensor(DType::f32, c.w, seed++, -0.3, 0.3);
    } else {
      w = g.add_constant("w", random_tensor(DType::f32, c.w, seed++, -0.3, 0.3));
    }
    std::vector<ValueId> inputs = {x, w};
    inputs.push_back(c.bias ? g.add_constant("b", random_tensor(DType::f32, {c.w[0]}, seed++))
                            : kNoValue);
    ConvAttrs attrs = c.attrs;
    if (c.residual) {
      // The residual has y's shape: the output's, from a plain conv of the same problem.
      Graph probe("probe");
      Builder pb(probe);
      const ValueId px = probe.add_input("x", DType::f32, c.x);
      ConvAttrs plain = attrs;
      plain.activation = plain.residual_activation = {};
      const Shape y_shape =
          probe
              .value(pb.conv(px, probe.add_constant("w", Tensor::zeros(DType::f32, c.w)), kNoValue,
                             plain))
              .type.shape;
      inputs.push_back(g.add_input("r", DType::f32, y_shape));
      feeds["r"] = random_tensor(DType::f32, y_shape, seed++);
    }
    const ValueId y = g.add_node(OpKind::conv, attrs, inputs, "conv")[0];
    g.mark_output(y);
    expect_fast_matches_reference(g, feeds, 1);
  }
}

// conv_backward_data (a training step's dx, a ConvTranspose) and conv_backward_filter (dw) on
// oneDNN's backward primitives, over the forward cases' geometries; a ConvTranspose's bias stays
// on the reference.
TEST(CpuFast, BackwardConvolutionsMatchTheReference) {
  REQUIRE_ONEDNN();
  uint64_t seed = 100;
  for (const ConvCase& c : conv_geometries()) {
    SCOPED_TRACE(c.what);
    // dy's shape: the forward's output.
    Graph probe("probe");
    const Shape y_shape =
        probe
            .value(Builder(probe).conv(probe.add_input("x", DType::f32, c.x),
                                       probe.add_constant("w", Tensor::zeros(DType::f32, c.w)),
                                       kNoValue, c.attrs))
            .type.shape;
    const std::vector<int64_t> input_spatial(c.x.begin() + 2, c.x.end()),
        filter_spatial(c.w.begin() + 2, c.w.end());
    Graph g("conv_backward");
    const ValueId x = g.add_input("x", DType::f32, c.x),
                  dy = g.add_input("dy", DType::f32, y_shape),
                  w = g.add_input("w", DType::f32, c.w);
    g.mark_output(g.add_node(OpKind::conv_backward_data,
                             ConvBackwardDataAttrs{c.attrs, input_spatial}, {dy, w}, "dx")[0]);
    g.mark_output(g.add_node(OpKind::conv_backward_filter,
                             ConvBackwardFilterAttrs{c.attrs, filter_spatial}, {x, dy}, "dw")[0]);
    const NamedTensors feeds{{"x", random_tensor(DType::f32, c.x, seed++)},
                             {"dy", random_tensor(DType::f32, y_shape, seed++)},
                             {"w", random_tensor(DType::f32, c.w, seed++, -0.3, 0.3)}};
    // dw sums over N and the output's pixels: up to 2 x 16 x 16 products here.
    expect_fast_matches_reference(g, feeds, 2, 1e-4, 1e-4);
  }
  // A ConvTranspose's bias: the reference's.
  Graph g("conv_transpose");
  const ValueId dy = g.add_input("dy", DType::f32, {1, 4, 5, 5});
  const ValueId w = g.add_constant("w", random_tensor(DType::f32, {4, 3, 3, 3}, 7, -0.3, 0.3));
  const ValueId b = g.add_constant("b", random_tensor(DType::f32, {3}, 8));
  const ConvAttrs up{.strides = {2, 2}, .pads_begin = {1, 1}, .pads_end = {1, 1}};
  g.mark_output(g.add_node(OpKind::conv_backward_data, ConvBackwardDataAttrs{up, {9, 9}},
                           {dy, w, b}, "up")[0]);
  expect_fast_matches_reference(g, {{"dy", random_tensor(DType::f32, {1, 4, 5, 5}, 9)}}, 0, 0, 0);
}

TEST(CpuFast, GemmAndMatmulMatchTheReference) {
  REQUIRE_ONEDNN();
  uint64_t seed = 100;
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      for (const FusedActivation act : {FusedActivation{}, FusedActivation{Activation::gelu}}) {
        SCOPED_TRACE(cat("gemm ta ", trans_a, " tb ", trans_b, " ", activation_name(act.kind)));
        const int64_t m = 13, k = 24, n = 10;
        Graph g("gemm");
        const ValueId a = g.add_input("a", DType::f32, trans_a ? Shape{k, m} : Shape{m, k});
        const ValueId b = g.add_constant(
            "b", random_tensor(DType::f32, trans_b ? Shape{n, k} : Shape{k, n}, seed++));
        const ValueId c = g.add_constant("c", random_tensor(DType::f32, {n}, seed++));
        GemmAttrs attrs{trans_a, trans_b, 1.0, 1.0};
        attrs.activation = act;
        g.mark_output(g.add_node(OpKind::gemm, attrs, {a, b, c}, "gemm")[0]);
        expect_fast_matches_reference(
            g, {{"a", random_tensor(DType::f32, trans_a ? Shape{k, m} : Shape{m, k}, seed++)}}, 1);
      }
    }
  }
  struct MatmulCase {
    Shape a, b;
    bool b_constant;
  };
  for (const MatmulCase& c : std::vector<MatmulCase>{{{7, 5}, {5, 9}, true},
                                                     {{3, 7, 5}, {5, 9}, true},  // a linear layer
                                                     {{3, 7, 5}, {3, 5, 9}, false},
                                                     {{2, 3, 4, 6}, {2, 3, 6, 5}, false},
                                                     {{2, 3, 4, 6}, {1, 1, 6, 5}, false}}) {
    SCOPED_TRACE(cat("matmul ", shape_str(c.a), " x ", shape_str(c.b)));
    Graph g("matmul");
    const ValueId a = g.add_input("a", DType::f32, c.a);
    NamedTensors feeds{{"a", random_tensor(DType::f32, c.a, seed++)}};
    ValueId b;
    if (c.b_constant) {
      b = g.add_constant("b", random_tensor(DType::f32, c.b, seed++));
    } else {
      b = g.add_input("b", DType::f32, c.b);
      feeds["b"] = random_tensor(DType::f32, c.b, seed++);
    }
    g.mark_output(g.add_node(OpKind::matmul, {}, {a, b}, "matmul")[0]);
    expect_fast_matches_reference(g, feeds, 1);
  }
}

TEST(CpuFast, PoolingMatchesTheReference) {
  REQUIRE_ONEDNN();
  struct PoolCase {
    std::string what;
    OpKind op;
    PoolAttrs attrs;
  };
  const std::vector<PoolCase> cases = {
      {"max 3x3 s2 p1 (ResNet)",
       OpKind::max_pool,
       {.kernel = {3, 3}, .strides = {2, 2}, .pads_begin = {1, 1}, .pads_end = {1, 1}}},
      {"max ceil_mode", OpKind::max_pool, {.kernel = {3, 3}, .strides = {2, 2}, .ceil_mode = true}},
      {"avg exclude pad",
       OpKind::avg_pool,
       {.kernel = {3, 3}, .strides = {1, 1}, .pads_begin = {1, 1}, .pads_end = {1, 1}}},
      {"avg include pad",
       OpKind::avg_pool,
       {.kernel = {2, 2},
        .strides = {2, 2},
        .pads_begin = {1, 1},
        .pads_end = {1, 1},
        .count_include_pad = true}},
      {"global avg", OpKind::global_avg_pool, {}},
  };
  uint64_t seed = 300;
  for (const PoolCase& c : cases) {
    SCOPED_TRACE(c.what);
    Graph g("pool");
    const ValueId x = g.add_input("x", DType::f32, {2, 5, 10, 9});
    const Attrs attrs = c.op == OpKind::global_avg_pool ? Attrs{} : Attrs{c.attrs};
    g.mark_output(g.add_node(c.op, attrs, {x}, "pool")[0]);
    expect_fast_matches_reference(g, {{"x", random_tensor(DType::f32, {2, 5, 10, 9}, seed++)}}, 1,
                                  1e-5, 1e-6);
  }
}

// Softmax and log-softmax over every axis; layer norm over the last dims (ViT's, and a
// [N, C, H, W] one over [C, H, W]); a layer norm whose statistics are read (training) stays on
// the reference.
TEST(CpuFast, SoftmaxAndLayerNormMatchTheReference) {
  REQUIRE_ONEDNN();
  const Shape shape{2, 3, 5, 7};
  uint64_t seed = 400;
  for (OpKind op : {OpKind::softmax, OpKind::log_softmax}) {
    for (int64_t axis : {-1, 0, 1, 2}) {
      SCOPED_TRACE(cat(op_name(op), " axis ", axis));
      Graph g("softmax");
      const ValueId x = g.add_input("x", DType::f32, shape);
      g.mark_output(g.add_node(op, SoftmaxAttrs{axis}, {x}, "softmax")[0]);
      expect_fast_matches_reference(g, {{"x", random_tensor(DType::f32, shape, seed++, -4, 4)}}, 1);
    }
  }
  for (int64_t axis : {-1, 1}) {
    SCOPED_TRACE(cat("layer_norm axis ", axis));
    Graph g("layer_norm");
    Builder b(g);
    const ValueId x = g.add_input("x", DType::f32, shape);
    const Shape normalised(shape.begin() + (axis < 0 ? 3 : axis), shape.end());
    const ValueId y = b.layer_norm(x, g.add_constant("s", random_tensor(DType::f32, normalised, 1)),
                                   g.add_constant("b", random_tensor(DType::f32, normalised, 2)),
                                   NormAttrs{.axis = axis});
    g.mark_output(y);
    expect_fast_matches_reference(g, {{"x", random_tensor(DType::f32, shape, seed++, -3, 3)}}, 1,
                                  1e-4, 1e-5);
  }
  Graph g("layer_norm_training");
  const ValueId x = g.add_input("x", DType::f32, {4, 6});
  const std::vector<ValueId> outs =
      g.add_node(OpKind::layer_norm, NormAttrs{},
                 {x, g.add_constant("s", random_tensor(DType::f32, {6}, 3))}, "ln");
  for (ValueId v : outs) g.mark_output(v);
  expect_fast_matches_reference(g, {{"x", random_tensor(DType::f32, {4, 6}, seed++)}}, 0, 0, 0);
}

// The unary activations on oneDNN's eltwise (erf and tanh GELU, relu, sigmoid, tanh, silu),
// over values past their curves' bends; an f64 one stays on the reference kernels.
TEST(CpuFast, ActivationsMatchTheReference) {
  REQUIRE_ONEDNN();
  Graph g("activations");
  const ValueId x = g.add_input("x", DType::f32, {3, 7, 11});
  const std::pair<OpKind, Attrs> ops[] = {{OpKind::relu, {}},
                                          {OpKind::gelu, GeluAttrs{false}},
                                          {OpKind::gelu, GeluAttrs{true}},
                                          {OpKind::sigmoid, {}},
                                          {OpKind::tanh, {}},
                                          {OpKind::silu, {}}};
  int i = 0;
  for (const auto& [op, attrs] : ops) g.mark_output(g.add_node(op, attrs, {x}, cat("act", i++))[0]);
  const ValueId x64 = g.add_input("x64", DType::f64, {5});
  g.mark_output(g.add_node(OpKind::relu, {}, {x64}, "relu64")[0]);
  expect_fast_matches_reference(g,
                                {{"x", random_tensor(DType::f32, {3, 7, 11}, 6, -6, 6)},
                                 {"x64", random_tensor(DType::f64, {5}, 7)}},
                                6, 1e-5, 1e-6);
}

// add, sub, mul, div on oneDNN's binary: the same shapes, the second operand broadcast, the
// first broadcast (add and mul: swapped), bit for bit the reference's in f32 (one IEEE
// operation each); a broadcast first operand of sub stays on the reference kernels.
TEST(CpuFast, BinaryOpsMatchTheReference) {
  REQUIRE_ONEDNN();
  Graph g("binary");
  const ValueId x = g.add_input("x", DType::f32, {2, 5, 6});
  const ValueId row = g.add_input("row", DType::f32, {6});
  const ValueId col = g.add_input("col", DType::f32, {2, 5, 1});
  int i = 0;
  for (OpKind op : {OpKind::add, OpKind::sub, OpKind::mul, OpKind::div}) {
    g.mark_output(g.add_node(op, {}, {x, x}, cat("same", i))[0]);
    g.mark_output(g.add_node(op, {}, {x, row}, cat("row", i))[0]);
    g.mark_output(g.add_node(op, {}, {x, col}, cat("col", i))[0]);
    ++i;
  }
  g.mark_output(g.add_node(OpKind::add, {}, {row, x}, "swapped_add")[0]);
  g.mark_output(g.add_node(OpKind::mul, {}, {col, x}, "swapped_mul")[0]);
  // oneDNN broadcasts the second operand only: a one-instruction program on the interpreter.
  g.mark_output(g.add_node(OpKind::sub, {}, {row, x}, "broadcast_sub")[0]);
  expect_fast_matches_reference(g,
                                {{"x", random_tensor(DType::f32, {2, 5, 6}, 1, -3, 3)},
                                 {"row", random_tensor(DType::f32, {6}, 2, 0.5, 2)},
                                 {"col", random_tensor(DType::f32, {2, 5, 1}, 3, 0.5, 2)}},
                                15, 0, 0);
}

// transpose and slice as oneDNN reorders, bit for bit (they only move elements): ViT's head
// split and K^T, a channel slice with a step, in f32 and bf16; a slice with a negative step
// and an i64 transpose stay on the reference kernels.
TEST(CpuFast, TransposesAndSlicesMatchTheReference) {
  REQUIRE_ONEDNN();
  Graph g("copies");
  NamedTensors feeds;
  for (DType t : {DType::f32, DType::bf16}) {
    const std::string s = dtype_name(t);
    const ValueId x = g.add_input("x" + s, t, {2, 7, 3, 8});
    feeds["x" + s] = random_tensor(t, {2, 7, 3, 8}, 4, -3, 3);
    g.mark_output(g.add_node(OpKind::transpose, TransposeAttrs{{0, 2, 1, 3}}, {x}, "heads" + s)[0]);
    g.mark_output(g.add_node(OpKind::transpose, TransposeAttrs{{0, 2, 3, 1}}, {x}, "kt" + s)[0]);
    g.mark_output(
        g.add_node(OpKind::slice, SliceAttrs{{1, 2}, {6, 7}, {1, 3}, {2, 3}}, {x}, "steps" + s)[0]);
    // A batch of 2-D transposes with partial 32 x 32 tiles at both edges: the tiled kernel.
    const ValueId m = g.add_input("m" + s, t, {2, 40, 33});
    feeds["m" + s] = random_tensor(t, {2, 40, 33}, 5, -3, 3);
    g.mark_output(g.add_node(OpKind::transpose, TransposeAttrs{{0, 2, 1}}, {m}, "tiles" + s)[0]);
    // Runs of 32 contiguous elements: a head split and a slice of the last dim.
    const ValueId h = g.add_input("h" + s, t, {2, 5, 3, 32});
    feeds["h" + s] = random_tensor(t, {2, 5, 3, 32}, 6, -3, 3);
    g.mark_output(g.add_node(OpKind::transpose, TransposeAttrs{{0, 2, 1, 3}}, {h}, "runs" + s)[0]);
    const ValueId p = g.add_input("p" + s, t, {2, 6, 96});
    feeds["p" + s] = random_tensor(t, {2, 6, 96}, 7, -3, 3);
    g.mark_output(
        g.add_node(OpKind::slice, SliceAttrs{{32}, {64}, {2}, {1}}, {p}, "k_part" + s)[0]);
  }
  const ValueId x = g.value(g.inputs()[0]).id;
  g.mark_output(g.add_node(OpKind::slice, SliceAttrs{{6}, {0}, {1}, {-2}}, {x}, "backwards")[0]);
  const ValueId ids = g.add_input("ids", DType::i64, {3, 4});
  feeds["ids"] = Tensor::from_vector<int64_t>({3, 4}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  g.mark_output(g.add_node(OpKind::transpose, TransposeAttrs{{1, 0}}, {ids}, "ids_t")[0]);
  expect_fast_matches_reference(g, feeds, 12, 0, 0);
}

// Inference attention on oneDNN (scores, softmax, product), with and without an additive
// bias broadcast over the batch, rank 4 and 3; causal ones (a constant 0 / -inf post-op), with
// and without a bias, Tq < Tk.
TEST(CpuFast, AttentionMatchesTheReference) {
  REQUIRE_ONEDNN();
  Graph g("attention");
  const ValueId q = g.add_input("q", DType::f32, {2, 3, 5, 8});
  const ValueId k = g.add_input("k", DType::f32, {2, 3, 7, 8});
  const ValueId v = g.add_input("v", DType::f32, {2, 3, 7, 4});
  const ValueId bias = g.add_input("bias", DType::f32, {1, 3, 5, 7});
  const AttentionAttrs plain{.scale = 0.35};
  g.mark_output(g.add_node(OpKind::attention, plain, {q, k, v}, "plain")[0]);
  g.mark_output(g.add_node(OpKind::attention, plain, {q, k, v, bias}, "biased")[0]);
  const ValueId q3 = g.add_input("q3", DType::f32, {4, 6, 16});
  g.mark_output(
      g.add_node(OpKind::attention, AttentionAttrs{.scale = 0.25}, {q3, q3, q3}, "self")[0]);
  g.mark_output(g.add_node(OpKind::attention, AttentionAttrs{.scale = 0.25, .causal = true},
                           {q3, q3, q3}, "causal")[0]);
  // Causal with a bias, fewer queries than keys (top-left aligned: key j > query i out).
  g.mark_output(g.add_node(OpKind::attention, AttentionAttrs{.scale = 0.35, .causal = true},
                           {q, k, v, bias}, "causal_biased")[0]);
  expect_fast_matches_reference(g,
                                {{"q", random_tensor(DType::f32, {2, 3, 5, 8}, 1, -2, 2)},
                                 {"k", random_tensor(DType::f32, {2, 3, 7, 8}, 2, -2, 2)},
                                 {"v", random_tensor(DType::f32, {2, 3, 7, 4}, 3)},
                                 {"bias", random_tensor(DType::f32, {1, 3, 5, 7}, 4, -3, 0)},
                                 {"q3", random_tensor(DType::f32, {4, 6, 16}, 5)}},
                                5);
}

// What oneDNN does not take (here: f64, gemm's alpha 2, a full C) runs on the reference
// kernels, bit for bit, and the summary says why.
TEST(CpuFast, RefusedNodesRunOnTheReference) {
  REQUIRE_ONEDNN();
  Graph g("refused");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f64, {1, 2, 5, 5});
  const ValueId y = b.conv(x, g.add_constant("w", random_tensor(DType::f64, {3, 2, 3, 3}, 1)));
  g.mark_output(y);
  const ValueId a = g.add_input("a", DType::f32, {4, 6});
  const ValueId w = g.add_constant("w2", random_tensor(DType::f32, {6, 3}, 2));
  const ValueId full_c = g.add_constant("c", random_tensor(DType::f32, {4, 3}, 3));
  g.mark_output(g.add_node(OpKind::gemm, GemmAttrs{false, false, 2.0, 1.0}, {a, w}, "scaled")[0]);
  g.mark_output(g.add_node(OpKind::gemm, GemmAttrs{}, {a, w, full_c}, "full_c")[0]);
  const NamedTensors feeds{{"x", random_tensor(DType::f64, {1, 2, 5, 5}, 4)},
                           {"a", random_tensor(DType::f32, {4, 6}, 5)}};
  expect_fast_matches_reference(g, feeds, 0, 0, 0);
  auto exe = Executable::compile(g, {.device = Device::cpu, .cpu_kernels = CpuKernels::fast});
  const std::string& summary = exe->stats().fast_summary;
  EXPECT_NE(summary.find("f64"), std::string::npos) << summary;
  EXPECT_NE(summary.find("gemm: 0 fast, 2 reference"), std::string::npos) << summary;
}

// gemm's mixed form (bf16 operands, the f32 accumulator stored; ir/ops.h GemmAttrs::y_dtype,
// GPT-2's LM head after fold_product_casts): on oneDNN with an f32 destination where the CPU
// computes in bf16 (else its refusal leaves it to the reference kernel), the reference's f32
// values either way.
TEST(CpuFast, MixedGemmStoresF32) {
  REQUIRE_ONEDNN();
  Graph g("lm_head");
  const ValueId a = g.add_input("a", DType::bf16, {6, 32});
  const ValueId w = g.add_constant("w", random_tensor(DType::bf16, {32, 20}, 3));
  GemmAttrs attrs;
  attrs.y_dtype = DType::f32;
  g.mark_output(g.add_node(OpKind::gemm, attrs, {a, w}, "head")[0]);
  const NamedTensors feeds{{"a", random_tensor(DType::bf16, {6, 32}, 4)}};
  const NamedTensors want = run_graph(g, feeds);
  ASSERT_EQ(want.begin()->second.dtype(), DType::f32);
  auto exe = Executable::compile(
      g, {.device = Device::cpu, .cpu_kernels = CpuKernels::fast, .poison = true});
  const NamedTensors got = exe->run(feeds);
  for (const auto& [name, t] : want)
    EXPECT_TRUE(all_close(got.at(name), t, 1e-5, 1e-6)) << name << "\n"
                                                        << exe->stats().fast_summary;
}

// A constant 3x3 convolution weight [k, c, 3, 3] of `g`, and "same" padding for it.
ValueId weight3x3(Graph& g, const char* name, int64_t k, int64_t c, uint64_t seed) {
  return g.add_constant(name, random_tensor(DType::f32, {k, c, 3, 3}, seed, -0.2, 0.2));
}
ConvAttrs same_padding() {
  ConvAttrs a;
  a.pads_begin = {1, 1};
  a.pads_end = {1, 1};
  return a;
}

// An activation every reader of which is a convolution stays in oneDNN's layout between them
// (c1: conv b's input and residual); one a dense reader reads (c2: the relu) or a graph
// output (c3) is dense; the values are the reference's either way.
TEST(CpuFast, ActivationsBetweenConvolutionsStayInOneDnnLayout) {
  REQUIRE_ONEDNN();
  Graph g("chain");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {2, 8, 10, 10});
  auto weight = [&](const char* name, int64_t k, int64_t c, uint64_t seed) {
    return weight3x3(g, name, k, c, seed);
  };
  const ConvAttrs same = same_padding();
  ConvAttrs relu = same;
  relu.activation.kind = Activation::relu;
  const ValueId c1 = b.conv(x, weight("w1", 16, 8, 1), kNoValue, relu);
  ConvAttrs residual = same;
  residual.residual_activation.kind = Activation::relu;
  const ValueId c2 =
      g.add_node(OpKind::conv, residual, {c1, weight("w2", 16, 16, 2), kNoValue, c1}, "conv_b")[0];
  const ValueId c3 = b.conv(c2, weight("w3", 4, 16, 3), kNoValue, same);
  g.rename_value(c3, "c3");
  g.mark_output(c3);
  const ValueId r = b.relu(c2);
  g.rename_value(r, "r");
  g.mark_output(r);
  expect_fast_matches_reference(g, {{"x", random_tensor(DType::f32, {2, 8, 10, 10}, 4)}}, 4);
  auto exe = Executable::compile(g, {.device = Device::cpu, .cpu_kernels = CpuKernels::fast});
  EXPECT_NE(exe->stats().fast_summary.find("1 values stay in their writer's layout"),
            std::string::npos)
      << exe->stats().fast_summary;
}

// The training batch norms on the fast kernels (cpu_fast/batch_norm.cpp, in every build):
// forward with and without relu and residual, backward with and without relu, the two-term dy
// and dy_output, rows of 63 (a remainder past the vector steps), 32 and 1 elements; within the
// reference's tolerance, every output (the running and saved statistics too).
TEST(CpuFast, TrainingBatchNormsMatchTheReference) {
  uint64_t seed = 300;
  for (const Shape& shape : {Shape{3, 5, 7, 9}, Shape{2, 4, 32}, Shape{6, 4}}) {
    const int64_t c = shape[1];
    for (bool relu : {false, true}) {
      for (bool two : {false, true}) {
        SCOPED_TRACE(
            cat(shape_str(shape), relu ? " relu" : "", two ? " residual / two terms" : ""));
        {
          Graph g("bn");
          NamedTensors feeds;
          auto input = [&](const char* name, const Shape& s, double lo, double hi) {
            feeds[name] = random_tensor(DType::f32, s, ++seed, lo, hi);
            return g.add_input(name, DType::f32, s);
          };
          std::vector<ValueId> in = {input("x", shape, -2, 3), input("scale", {c}, 0.5, 1.5),
                                     input("bias", {c}, -1, 1), input("mean", {c}, -1, 1),
                                     input("var", {c}, 0.5, 2)};
          if (two) in.push_back(input("residual", shape, -1, 1));
          const BatchNormAttrs attrs{
              .epsilon = 1e-3, .momentum = 0.8, .training = true, .relu = relu};
          for (ValueId v : g.add_node(OpKind::batch_norm, attrs, in, "bn")) g.mark_output(v);
          expect_fast_matches_reference(g, feeds, 1);
        }
        for (bool dy_output : {false, true}) {
          Graph g("bn_backward");
          NamedTensors feeds;
          auto input = [&](const char* name, const Shape& s, double lo, double hi) {
            feeds[name] = random_tensor(DType::f32, s, ++seed, lo, hi);
            return g.add_input(name, DType::f32, s);
          };
          std::vector<ValueId> in = {input("dy", shape, -1, 1), input("x", shape, -2, 3),
                                     input("scale", {c}, 0.5, 1.5), input("mean", {c}, -0.5, 0.5),
                                     input("inv_std", {c}, 0.5, 2)};
          in.push_back(relu ? input("y", shape, -1, 1) : kNoValue);
          in.push_back(kNoValue);
          in.push_back(two ? input("addend", shape, -1, 1) : kNoValue);
          const BatchNormAttrs attrs{.training = true, .relu = relu, .dy_output = dy_output};
          for (ValueId v : g.add_node(OpKind::batch_norm_backward, attrs, in, "bn_backward"))
            g.mark_output(v);
          expect_fast_matches_reference(g, feeds, 1);
        }
      }
    }
  }
}

// The shape max_pool gives x under `pool` (shape inference on a graph of that node alone).
Shape pooled_shape(const Shape& x, const PoolAttrs& pool) {
  Graph g("pool");
  const ValueId in = g.add_input("x", DType::f32, x);
  return g.value(g.add_node(OpKind::max_pool, pool, {in}, "pool")[0]).type.shape;
}

// max_pool_backward of 2-D f32 pools on the fast kernel (cpu_fast/pool_backward.cpp, in every
// build): the reference's windows and sums, so bit for bit, on inputs with ties (values on a
// coarse grid: the first of equal maxima wins) and NaNs (a NaN wins and stays), over strides,
// paddings, ceil mode and dilation; a 1-D pool stays on the reference kernel.
TEST(CpuFast, MaxPoolBackwardMatchesTheReferenceBitForBit) {
  struct Case {
    Shape x;
    PoolAttrs pool;
  };
  const Case cases[] = {
      {{2, 3, 17, 17},
       {.kernel = {3, 3},
        .strides = {2, 2},
        .pads_begin = {1, 1},
        .pads_end = {1, 1}}},  // ResNet's stem pool
      {{1, 4, 7, 9}, {.kernel = {2, 2}, .strides = {2, 2}, .ceil_mode = true}},
      {{2, 2, 11, 10},
       {.kernel = {3, 3}, .dilations = {2, 2}, .pads_begin = {1, 1}, .pads_end = {1, 1}}},
      {{1, 5, 6, 13},
       {.kernel = {2, 3}, .strides = {1, 2}, .pads_begin = {0, 1}, .pads_end = {1, 0}}},
  };
  uint64_t seed = 500;
  for (const Case& c : cases) {
    SCOPED_TRACE(shape_str(c.x));
    PoolAttrs pool = c.pool;
    if (pool.strides.empty()) pool.strides = {1, 1};
    if (pool.dilations.empty()) pool.dilations = {1, 1};
    if (pool.pads_begin.empty()) pool.pads_begin = {0, 0};
    if (pool.pads_end.empty()) pool.pads_end = {0, 0};
    const Shape y_shape = pooled_shape(c.x, pool);
    Graph g("pool_backward");  // the backward alone: 1 fast node in every build
    const ValueId x = g.add_input("x", DType::f32, c.x);
    const ValueId dy = g.add_input("dy", DType::f32, y_shape);
    const ValueId dx =
        g.add_node(OpKind::max_pool_backward, PoolBackwardAttrs{pool, {}}, {dy, x}, "dx")[0];
    g.mark_output(dx);
    Tensor xs = random_tensor(DType::f32, c.x, ++seed, -2, 2);
    float* v = xs.data<float>();
    for (int64_t i = 0; i < xs.numel(); ++i) {
      v[i] = std::round(v[i] * 2.0f) / 2.0f;  // 9 levels: many equal maxima
      if (i % 37 == 5) v[i] = NAN;
    }
    expect_fast_matches_reference(
        g, {{"x", xs}, {"dy", random_tensor(DType::f32, y_shape, ++seed)}}, 1, 0, 0);
  }
  Graph g("pool_backward_1d");
  const PoolAttrs pool{
      .kernel = {3}, .strides = {2}, .dilations = {1}, .pads_begin = {1}, .pads_end = {1}};
  const Shape y_shape = pooled_shape({2, 3, 9}, pool);
  const ValueId x = g.add_input("x", DType::f32, {2, 3, 9});
  const ValueId dy = g.add_input("dy", DType::f32, y_shape);
  g.mark_output(
      g.add_node(OpKind::max_pool_backward, PoolBackwardAttrs{pool, {}}, {dy, x}, "dx")[0]);
  expect_fast_matches_reference(g,
                                {{"x", random_tensor(DType::f32, {2, 3, 9}, 1)},
                                 {"dy", random_tensor(DType::f32, y_shape, 2)}},
                                0, 0, 0);
}

// The plain SGD and AdamW updates on the fast kernels (cpu_fast/optimizer.cpp, in every
// build): SGD with momentum and dampening, weight decay, Nesterov, none; AdamW at its first and
// a later step; lengths that leave a remainder past the vector steps and split over the
// threads; every output within the reference's tolerance. A loss-scaled one stays on the
// reference kernel.
TEST(CpuFast, OptimizerUpdatesMatchTheReference) {
  const SgdAttrs variants[] = {{.momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-4},
                               {.momentum = 0.9, .weight_decay = 5e-4, .nesterov = true},
                               {}};
  uint64_t seed = 400;
  for (const SgdAttrs& attrs : variants) {
    for (int64_t count : {int64_t(70001), int64_t(7)}) {
      SCOPED_TRACE(cat("momentum ", attrs.momentum, " nesterov ", attrs.nesterov, ", ", count));
      Graph g("sgd");
      NamedTensors feeds;
      auto input = [&](const char* name, const Shape& s) {
        feeds[name] = random_tensor(DType::f32, s, ++seed, -1, 1);
        return g.add_input(name, DType::f32, s);
      };
      const ValueId p = input("param", {count}), grad = input("grad", {count}),
                    buf = input("buf", {count});
      const ValueId lr = g.add_constant("lr", Tensor::from_doubles(DType::f32, {}, {0.05}));
      for (ValueId v : g.add_node(OpKind::sgd_update, attrs, {p, grad, buf, lr}, "sgd"))
        g.mark_output(v);
      expect_fast_matches_reference(g, feeds, 1, 1e-5, 1e-6);
    }
  }
  for (double step : {1.0, 7.0}) {
    for (int64_t count : {int64_t(70001), int64_t(7)}) {
      SCOPED_TRACE(cat("adamw step ", step, ", ", count));
      Graph g("adamw");
      NamedTensors feeds;
      auto input = [&](const char* name, const Shape& s, double lo) {
        feeds[name] = random_tensor(DType::f32, s, ++seed, lo, 1);
        return g.add_input(name, DType::f32, s);
      };
      const ValueId p = input("param", {count}, -1), grad = input("grad", {count}, -1),
                    m = input("m", {count}, -1), v = input("v", {count}, 0);
      const ValueId lr = g.add_constant("lr", Tensor::from_doubles(DType::f32, {}, {1e-3}));
      const ValueId t = g.add_constant("step", Tensor::from_doubles(DType::i64, {}, {step}));
      for (ValueId out : g.add_node(OpKind::adamw_update, AdamWAttrs{.weight_decay = 0.05},
                                    {p, grad, m, v, lr, t}, "adamw"))
        g.mark_output(out);
      expect_fast_matches_reference(g, feeds, 1, 1e-5, 1e-6);
    }
  }
  Graph g("scaled");
  const ValueId p = g.add_input("param", DType::f32, {9}),
                grad = g.add_input("grad", DType::f32, {9}),
                buf = g.add_input("buf", DType::f32, {9});
  const ValueId lr = g.add_constant("lr", Tensor::from_doubles(DType::f32, {}, {0.05}));
  const ValueId scale = g.add_constant("scale", Tensor::from_doubles(DType::f32, {}, {0.5}));
  g.add_node(OpKind::sgd_update, SgdAttrs{.momentum = 0.9}, {p, grad, buf, lr, scale}, "sgd");
  EXPECT_FALSE(cpu_fast::plan(g, g.nodes().back()).kernel);
}

// Lone elementwise ops no oneDNN planner takes (an activation's gradient, exp, a widening
// cast) run as one-instruction programs on the block interpreter, the reference's bits.
TEST(CpuFast, LoneElementwiseOpsRunAsPrograms) {
  Graph g("lone");
  const ValueId dy = g.add_input("dy", DType::f32, {3, 37});
  const ValueId x = g.add_input("x", DType::f32, {3, 37});
  const ValueId h = g.add_input("h", DType::bf16, {3, 37});
  g.mark_output(g.add_node(OpKind::unary_backward, UnaryBackwardAttrs{.op = OpKind::gelu}, {dy, x},
                           "gelu_dx")[0]);
  g.mark_output(g.add_node(OpKind::exp, {}, {x}, "exp")[0]);
  g.mark_output(g.add_node(OpKind::cast, CastAttrs{DType::f32}, {h}, "widen")[0]);
  expect_fast_matches_reference(g,
                                {{"dy", random_tensor(DType::f32, {3, 37}, 1)},
                                 {"x", random_tensor(DType::f32, {3, 37}, 2, -4, 4)},
                                 {"h", random_tensor(DType::bf16, {3, 37}, 3)}},
                                3, 0, 0);
}

// 3x3 stride-1 f32 convolutions of 16-channel multiples with enough 4 x 4 output tiles run as
// Winograd F(4x4, 3x3) (cpu_fast/winograd.cpp): with bias and relu, with a residual and its
// relu (a basic block's end), spatial extents not multiples of 4 (partial tiles), a chain of
// two (the second reading the first's channels-last output as it is) beside a graph output
// written dense; within the reference's
// tolerance. The ones it refuses (stride 2, too few tiles) run the direct kernel.
TEST(CpuFast, WinogradConvolutionsMatchTheReference) {
  REQUIRE_ONEDNN();
  Graph g("winograd");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {2, 16, 13, 10});
  ConvAttrs relu = same_padding();
  relu.activation.kind = Activation::relu;
  const ValueId bias = g.add_constant("bias", random_tensor(DType::f32, {32}, 5, -0.5, 0.5));
  const ValueId c1 = b.conv(x, weight3x3(g, "w1", 32, 16, 1), bias, relu);
  // A basic block's end: relu(conv + x), x the residual.
  ConvAttrs block_end = same_padding();
  block_end.residual_activation.kind = Activation::relu;
  const ValueId c2 = g.add_node(OpKind::conv, block_end,
                                {c1, weight3x3(g, "w2", 16, 32, 2), kNoValue, x}, "block_end")[0];
  g.rename_value(c2, "c2");
  g.mark_output(c2);
  ConvAttrs strided = same_padding();
  strided.strides = {2, 2};
  const ValueId c3 = b.conv(c2, weight3x3(g, "w3", 16, 16, 3), kNoValue, strided);
  g.rename_value(c3, "c3");
  g.mark_output(c3);
  const ValueId small = g.add_input("small", DType::f32, {1, 16, 6, 6});  // 4 tiles
  const ValueId c4 = b.conv(small, weight3x3(g, "w4", 16, 16, 4), kNoValue, same_padding());
  g.rename_value(c4, "c4");
  g.mark_output(c4);
  const NamedTensors feeds = {{"x", random_tensor(DType::f32, {2, 16, 13, 10}, 6)},
                              {"small", random_tensor(DType::f32, {1, 16, 6, 6}, 7)}};
  expect_fast_matches_reference(g, feeds, 4);
  std::vector<NodeId> winograd;
  for (const Node& n : g.nodes()) {
    const cpu_fast::Planned planned = cpu_fast::plan(g, n);
    ASSERT_TRUE(planned.kernel) << n.name << ": " << planned.why_not;
    if (planned.kernel->describe().find("Winograd") != std::string::npos) winograd.push_back(n.id);
  }
  EXPECT_EQ(winograd, (std::vector<NodeId>{g.value(c1).producer, g.value(c2).producer}));
}

// A bottleneck block: on AVX2 CPUs the 1x1 convolutions take 8-channel blocks and the 3x3 one
// channels-last (conv.cpp blocked_1x1), a reorder between them; the residual, written in
// the first convolution's layout, is added by the last one's sum post-op.
TEST(CpuFast, BottleneckAcrossConvolutionLayoutsMatchesTheReference) {
  REQUIRE_ONEDNN();
  Graph g("bottleneck");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {2, 16, 9, 9});
  auto weight = [&](const char* name, int64_t k, int64_t c, int64_t r, uint64_t seed) {
    return g.add_constant(name, random_tensor(DType::f32, {k, c, r, r}, seed, -0.2, 0.2));
  };
  ConvAttrs relu;
  relu.activation.kind = Activation::relu;
  ConvAttrs relu_same = same_padding();
  relu_same.activation.kind = Activation::relu;
  const ValueId reduce = b.conv(x, weight("w1", 8, 16, 1, 1), kNoValue, relu);
  const ValueId spatial = b.conv(reduce, weight("w2", 8, 8, 3, 2), kNoValue, relu_same);
  ConvAttrs expand;
  expand.residual_activation.kind = Activation::relu;
  const ValueId y = g.add_node(OpKind::conv, expand,
                               {spatial, weight("w3", 16, 8, 1, 3), kNoValue, x}, "expand")[0];
  g.rename_value(y, "y");
  g.mark_output(y);
  expect_fast_matches_reference(g, {{"x", random_tensor(DType::f32, {2, 16, 9, 9}, 4)}}, 3);
}

// Elementwise programs between convolutions (MobileNetV3's hardswish) run over the writer's
// blocked layout and leave theirs in it; 12 channels pad to the layout's block (8 or 16): a
// program that keeps zero zero runs in the padded layout, one that does not (x + 3) reads and
// writes densely; a per-channel input (the excitation's scale) is read by each element's
// channel in the layout, and a row broadcast keeps its program dense.
TEST(CpuFast, PointwiseProgramsBetweenConvolutionsStayInOneDnnLayout) {
  REQUIRE_ONEDNN();
  Graph g("hardswish");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {2, 8, 10, 10});
  const ValueId s = g.add_input("s", DType::f32, {2, 12, 1, 1});
  const ConvAttrs same = same_padding();
  const ValueId three = g.add_constant("three", Tensor::scalar(DType::f32, 3));
  const ValueId six = g.add_constant("six", Tensor::scalar(DType::f32, 6));
  const PointwiseInstr relu6{.op = OpKind::clip, .operands = {3}, .min = 0, .max = 6};
  const PointwiseProgram hardswish{
      3, {{OpKind::add, {0, 1}}, relu6, {OpKind::div, {4, 2}}, {OpKind::mul, {0, 5}}}};
  const PointwiseProgram plus_three{2, {{OpKind::add, {0, 1}}}};
  const PointwiseProgram scaled{2, {{OpKind::mul, {0, 1}}}};
  const ValueId c1 = b.conv(x, weight3x3(g, "w1", 12, 8, 1), kNoValue, same);
  const ValueId h = g.add_node(OpKind::fused_pointwise, hardswish, {c1, three, six}, "hs")[0];
  const ValueId c2 = b.conv(h, weight3x3(g, "w2", 12, 12, 2), kNoValue, same);
  const ValueId p = g.add_node(OpKind::fused_pointwise, plus_three, {c2, three}, "plus3")[0];
  const ValueId c3 = b.conv(p, weight3x3(g, "w3", 12, 12, 3), kNoValue, same);
  const ValueId e = g.add_node(OpKind::fused_pointwise, scaled, {c3, s}, "excite")[0];
  const ValueId c4 = b.conv(e, weight3x3(g, "w4", 12, 12, 4), kNoValue, same);
  const ValueId row = g.add_input("row", DType::f32, {10});
  const ValueId r = g.add_node(OpKind::fused_pointwise, scaled, {c4, row}, "rows")[0];
  const ValueId c5 = b.conv(r, weight3x3(g, "w5", 4, 12, 5), kNoValue, same);
  g.rename_value(c5, "y");
  g.mark_output(c5);
  expect_fast_matches_reference(g,
                                {{"x", random_tensor(DType::f32, {2, 8, 10, 10}, 6, -4, 4)},
                                 {"s", random_tensor(DType::f32, {2, 12, 1, 1}, 7)},
                                 {"row", random_tensor(DType::f32, {10}, 8)}},
                                9);
  auto exe = Executable::compile(g, {.device = Device::cpu, .cpu_kernels = CpuKernels::fast});
  // c1, h, c2, p, c3, e: readers that take them in oneDNN's layout; c4 (read by the row
  // broadcast) and r (its program's output) are dense.
  EXPECT_NE(exe->stats().fast_summary.find("6 values stay in their writer's layout"),
            std::string::npos)
      << exe->stats().fast_summary;
}

#ifdef FUSEBOX_WITH_ONEDNN
// The kernel handed a value in a padded blocked layout (12 channels in nChw8c: 4 of padding)
// as a convolution would leave it: hardswish keeps zero zero, so it runs in that layout and
// its padding stays zero; x + 3 does not, so it reads the value densely and leaves a dense one.
TEST(CpuFast, PointwiseProgramInAPaddedLayoutOnlyWhereZeroStaysZero) {
  using dnnl::memory;
  const Shape shape = {1, 12, 3, 3};
  const Tensor x = random_tensor(DType::f32, shape, 8, -5, 5);
  const Tensor three = Tensor::scalar(DType::f32, 3), six = Tensor::scalar(DType::f32, 6);
  const Tensor scale = random_tensor(DType::f32, {1, 12, 1, 1}, 9, -2, 2);
  const memory::desc blocked(cpu_fast::dims_of(shape), memory::data_type::f32,
                             memory::format_tag::nChw8c);
  ASSERT_NE(blocked.get_padded_dims(), blocked.get_dims());
  const memory plain = cpu_fast::wrap(cpu_fast::plain_desc(cpu_fast::dims_of(shape)), x.raw());
  const memory held(blocked, cpu_fast::cpu_engine());
  std::memset(held.get_data_handle(), 0, blocked.get_size());
  cpu_fast::execute(dnnl::reorder(plain, held), {{DNNL_ARG_FROM, plain}, {DNNL_ARG_TO, held}});
  const cpu_fast::OnednnValue own_x(held);

  const PointwiseInstr relu6{.op = OpKind::clip, .operands = {3}, .min = 0, .max = 6};
  const PointwiseProgram hardswish{
      3, {{OpKind::add, {0, 1}}, relu6, {OpKind::div, {4, 2}}, {OpKind::mul, {0, 5}}}};
  // x + 3 + 6 - 6 (every input read)
  const PointwiseProgram plus_three{
      3, {{OpKind::add, {0, 1}}, {OpKind::add, {3, 2}}, {OpKind::sub, {4, 2}}}};
  // x * six * scale (per channel) / three
  const PointwiseProgram excite{
      4, {{OpKind::mul, {0, 2}}, {OpKind::mul, {4, 3}}, {OpKind::div, {5, 1}}}};
  for (const PointwiseProgram* program : {&hardswish, &plus_three, &excite}) {
    const bool zero_stays_zero = program != &plus_three;
    Graph g("program");
    std::vector<ValueId> in = {g.add_input("x", DType::f32, shape), g.add_constant("three", three),
                               g.add_constant("six", six)};
    if (program == &excite) in.push_back(g.add_constant("scale", scale));
    const ValueId y = g.add_node(OpKind::fused_pointwise, *program, in, "p")[0];
    g.mark_output(y);
    const Tensor want = run_graph(g, {{"x", x}}).at(g.value(y).name);
    const cpu_fast::Planned planned = cpu_fast::plan(g, g.nodes().back());
    ASSERT_TRUE(planned.kernel) << planned.why_not;
    ASSERT_TRUE(planned.kernel->reads_own_layout(0));
    const Tensor undefined;
    const std::vector<const Tensor*> inputs = {&undefined, &three, &six, &scale};
    const std::vector<const cpu_fast::OwnLayout*> own = {&own_x, nullptr, nullptr, nullptr};
    std::vector<Tensor> outputs(1);
    std::shared_ptr<cpu_fast::OwnLayout> out;
    const size_t arity = in.size();  // the program's inputs of the four
    planned.kernel->run_own(std::span(inputs).first(arity), std::span(own).first(arity), 0, outputs,
                            &out);
    ASSERT_TRUE(out);
    const memory& got = static_cast<const cpu_fast::OnednnValue&>(*out).memory;
    EXPECT_EQ(got.get_desc() == blocked, zero_stays_zero);
    Tensor dense = Tensor::empty(DType::f32, shape);
    const memory to = cpu_fast::wrap(cpu_fast::plain_desc(cpu_fast::dims_of(shape)), dense.raw());
    cpu_fast::execute(dnnl::reorder(got, to), {{DNNL_ARG_FROM, got}, {DNNL_ARG_TO, to}});
    EXPECT_TRUE(all_close(dense, want, 0, 0));
    if (zero_stays_zero) {  // channels 12..15 of each 8-channel block's pixels
      const float* v = static_cast<const float*>(got.get_data_handle());
      for (int64_t pixel = 0; pixel < 9; ++pixel)
        for (int64_t c = 12; c < 16; ++c) EXPECT_EQ(v[72 + pixel * 8 + (c - 8)], 0.f);
    }
    // Dense in, dense out: the interpreter as before.
    outputs[0] = Tensor::empty(DType::f32, shape);
    const std::vector<const Tensor*> dense_inputs = {&x, &three, &six, &scale};
    planned.kernel->run(std::span(dense_inputs).first(arity), outputs);
    EXPECT_TRUE(all_close(outputs[0], want, 0, 0));
  }
}
#endif

// Pools read a convolution's blocked output as it lies and leave theirs in oneDNN's layout for a
// convolution (ResNet's stem: conv -> max_pool -> conv; its head: conv -> global_avg_pool): the
// conv, max pool and second conv outputs all stay in their writer's layout.
TEST(CpuFast, PoolsBetweenConvolutionsStayInOneDnnLayout) {
  REQUIRE_ONEDNN();
  Graph g("stem");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {2, 8, 12, 12});
  ConvAttrs same = same_padding();
  same.activation.kind = Activation::relu;
  const ValueId c1 = b.conv(x, weight3x3(g, "w1", 16, 8, 1), kNoValue, same);
  const PoolAttrs pool{
      .kernel = {3, 3}, .strides = {2, 2}, .pads_begin = {1, 1}, .pads_end = {1, 1}};
  const ValueId p = g.add_node(OpKind::max_pool, pool, {c1}, "maxpool")[0];
  const ValueId c2 = b.conv(p, weight3x3(g, "w2", 16, 16, 2), kNoValue, same);
  const ValueId head = g.add_node(OpKind::global_avg_pool, {}, {c2}, "avgpool")[0];
  g.rename_value(head, "head");
  g.mark_output(head);
  expect_fast_matches_reference(g, {{"x", random_tensor(DType::f32, {2, 8, 12, 12}, 5)}}, 4);
  auto exe = Executable::compile(g, {.device = Device::cpu, .cpu_kernels = CpuKernels::fast});
  EXPECT_NE(exe->stats().fast_summary.find("3 values stay in their writer's layout"),
            std::string::npos)
      << exe->stats().fast_summary;
}

// A whole model through the inference pipeline (batch norms folded into the convolutions,
// relus and residual adds as their epilogues), as `fusebox run --device cpu` runs it.
// A small zoo ResNet-18 and a random batch for it.
struct SmallResNet {
  Graph model =
      build_zoo_model("resnet18", {.batch = 2, .image_size = 64, .num_classes = 10, .seed = 3});
  NamedTensors feeds{{model.value(model.inputs()[0]).name,
                      random_tensor(DType::f32, model.value(model.inputs()[0]).type.shape, 9)}};
};

TEST(CpuFast, ZooResNetMatchesTheReference) {
  REQUIRE_ONEDNN();
  const SmallResNet net;
  const Graph& model = net.model;
  const NamedTensors& feeds = net.feeds;
  const NamedTensors want = run_graph(model, feeds);
  auto exe = Executable::compile(
      model, {.device = Device::cpu,
              .cpu_kernels = CpuKernels::fast,
              .pipeline = {.kind = PipelineKind::inference, .precision = Precision::f32}});
  EXPECT_GE(exe->stats().fast_nodes, 20u) << exe->stats().fast_summary;  // 20 convs, the fc
  const NamedTensors got = exe->run(feeds);
  for (const auto& [name, t] : want)
    EXPECT_TRUE(all_close(got.at(name), t, 1e-3, 1e-4)) << name << "\n"
                                                        << exe->stats().fast_summary;
}

// bf16 through the inference pipeline (mixed precision: bf16 convolutions, pooling and the
// classifier on oneDNN where the CPU computes in bf16, AVX-512 BF16 / AMX; else the reference
// kernels run them): the logits within bf16's error of the reference kernels' on the same
// bf16 graph.
TEST(CpuFast, ZooResNetInBf16FollowsTheReference) {
  REQUIRE_ONEDNN();
  const SmallResNet net;
  const Graph& model = net.model;
  const NamedTensors& feeds = net.feeds;
  auto compile = [&](CpuKernels kernels) {
    return Executable::compile(
        model, {.device = Device::cpu,
                .cpu_kernels = kernels,
                .pipeline = {.kind = PipelineKind::inference, .precision = Precision::bf16}});
  };
  auto fast = compile(CpuKernels::fast);
  const NamedTensors want = compile(CpuKernels::reference)->run(feeds);
  const NamedTensors got = fast->run(feeds);
  std::cout << fast->stats().fast_summary;
  for (const auto& [name, t] : want)
    EXPECT_LT(relative_l2(got.at(name), t), 2e-2) << name << "\n" << fast->stats().fast_summary;
}

}  // namespace
}  // namespace fusebox::testing
