// fuse_gemm_epilogues (passes/fusion.h): a 2-D matmul or gemm takes over its bias add and
// activation as one gemm (GemmAttrs::activation). On the CPU backend: the fused graph computes
// the unfused chain, exports to ONNX as Gemm and the activation, leaves what must not fuse,
// and has no gradient rule. The CUDA lowering (cuBLASLt epilogues): tests/unit/cuda.
#include <string>
#include <vector>

#include "fusebox/frontends/onnx.h"
#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/fusion.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

const std::vector<std::pair<OpKind, Attrs>> kActivations = {{OpKind::relu, {}},
                                                            {OpKind::gelu, GeluAttrs{}},
                                                            {OpKind::gelu, GeluAttrs{true}},
                                                            {OpKind::silu, {}},
                                                            {OpKind::sigmoid, {}},
                                                            {OpKind::tanh, {}},
                                                            {OpKind::clip, ClipAttrs{-0.25, 0.5}}};

// x [5, 6] @ w [6, 7] (+ bias [7]) -> activation, as ONNX writes a linear layer. The gemm
// takes relu and gelu's tanh form (what cuBLASLt's epilogue computes); the other activations
// stay nodes of their own (after the bias, which the gemm takes).
TEST(FuseGemmEpilogues, MatmulBiasActivationBecomesOneGemm) {
  for (const auto& [act, act_attrs] : kActivations) {
    const bool taken = act == OpKind::relu ||
                       (act == OpKind::gelu && std::get<GeluAttrs>(act_attrs).tanh_approximation);
    for (int bias = 0; bias < 2; ++bias) {
      SCOPED_TRACE(cat(op_name(act), bias ? " with bias" : ""));
      Graph g("linear");
      const ValueId x = g.add_input("x", DType::f32, {5, 6});
      ValueId v =
          g.add_node(OpKind::matmul, {},
                     {x, g.add_constant("w", random_tensor(DType::f32, {6, 7}, 1))}, "matmul")[0];
      if (bias)
        v = g.add_node(OpKind::add, {}, {g.add_constant("b", random_tensor(DType::f32, {7}, 2)), v},
                       "add")[0];
      v = g.add_node(act, act_attrs, {v}, "act")[0];
      g.rename_value(v, "out");
      g.mark_output(v);
      Graph fused = g;
      FusionLog log;
      const NamedTensors feeds = {{"x", random_tensor(DType::f32, {5, 6}, 3, -2, 2)}};
      if (!taken && !bias) {
        EXPECT_EQ(fuse_gemm_epilogues(fused, &log), 0u);
        EXPECT_EQ(fused.nodes().size(), 2u);
        continue;
      }
      ASSERT_EQ(fuse_gemm_epilogues(fused, &log), 1u);
      ASSERT_EQ(fused.nodes().size(), taken ? 1u : 2u);
      const Node& n = fused.nodes()[0];
      EXPECT_EQ(n.op, OpKind::gemm);
      EXPECT_EQ(n.name, "matmul");
      EXPECT_EQ(bool(std::get<GemmAttrs>(n.attrs).activation), taken);
      if (!taken) {
        EXPECT_EQ(fused.nodes()[1].op, act);
      }
      ASSERT_EQ(log.groups().size(), 1u);
      EXPECT_EQ(log.groups()[0].ops.size(), size_t(1 + bias + (taken ? 1 : 0)));
      const Tensor want = run_graph(g, feeds).at("out");
      EXPECT_LE(relative_l2(run_graph(fused, feeds).at("out"), want), 1e-6);
      const Graph imported = import_onnx_bytes(export_onnx_bytes(fused), "fused");
      EXPECT_EQ(count_ops(imported, OpKind::gemm), 1);
      EXPECT_LE(relative_l2(run_graph(imported, feeds).at("out"), want), 1e-6);
    }
  }
}

// An ONNX Gemm (C already its bias, transB as PyTorch exports nn.Linear) takes its relu;
// the sum of two products goes to the first as its C.
TEST(FuseGemmEpilogues, GemmTakesItsActivationAndASumTakesTheOtherProduct) {
  Graph g("two");
  const ValueId x = g.add_input("x", DType::f32, {4, 3});
  const ValueId y1 = g.add_node(OpKind::gemm, GemmAttrs{.trans_b = true, .alpha = 0.5},
                                {x, g.add_constant("w1", random_tensor(DType::f32, {5, 3}, 1)),
                                 g.add_constant("b1", random_tensor(DType::f32, {5}, 2))},
                                "fc1")[0];
  const ValueId r1 = g.add_node(OpKind::relu, {}, {y1}, "relu1")[0];
  const ValueId p2 =
      g.add_node(OpKind::matmul, {},
                 {r1, g.add_constant("w2", random_tensor(DType::f32, {5, 5}, 3))}, "mm2")[0];
  const ValueId p3 =
      g.add_node(OpKind::matmul, {},
                 {r1, g.add_constant("w3", random_tensor(DType::f32, {5, 5}, 4))}, "mm3")[0];
  const ValueId s = g.add_node(OpKind::add, {}, {p2, p3}, "sum")[0];
  g.rename_value(s, "out");
  g.mark_output(s);
  Graph fused = g;
  EXPECT_EQ(fuse_gemm_epilogues(fused), 2u);  // fc1 + relu1; mm2 + sum (C = mm3's output)
  EXPECT_EQ(count_ops(fused, OpKind::gemm), 2);
  EXPECT_EQ(count_ops(fused, OpKind::matmul), 1);
  EXPECT_EQ(count_ops(fused, OpKind::add) + count_ops(fused, OpKind::relu), 0);
  EXPECT_NO_THROW(fused.verify());
  const NamedTensors feeds = {{"x", random_tensor(DType::f32, {4, 3}, 5, -2, 2)}};
  EXPECT_LE(relative_l2(run_graph(fused, feeds).at("out"), run_graph(g, feeds).at("out")), 1e-6);
}

// Not fused: a batched matmul, a product read twice or a graph output, an add that would
// broadcast y itself, a product read through a cast.
TEST(FuseGemmEpilogues, LeavesWhatCannotFuse) {
  Graph g("net");
  const ValueId x3 = g.add_input("x3", DType::f32, {2, 4, 3});
  const ValueId w = g.add_constant("w", random_tensor(DType::f32, {3, 4}, 1));
  const ValueId batched = g.add_node(OpKind::matmul, {}, {x3, w}, "batched")[0];
  g.add_node(OpKind::relu, {}, {batched}, "r0");
  const ValueId x = g.add_input("x", DType::f32, {4, 3});
  const ValueId y1 = g.add_node(OpKind::matmul, {}, {x, w}, "twice")[0];
  g.add_node(OpKind::relu, {}, {y1}, "r1");
  g.add_node(OpKind::sigmoid, {}, {y1}, "s1");
  const ValueId y2 = g.add_node(OpKind::matmul, {}, {x, w}, "output")[0];
  g.mark_output(y2);
  g.add_node(OpKind::relu, {}, {y2}, "r2");
  const ValueId big = g.add_input("big", DType::f32, {2, 4, 4});
  const ValueId y3 = g.add_node(OpKind::matmul, {}, {x, w}, "broadcast_y")[0];
  g.add_node(OpKind::add, {}, {y3, big}, "a3");  // y would broadcast to [2, 4, 4]
  const ValueId y4 = g.add_node(OpKind::matmul, {}, {x, w}, "other_dtype")[0];
  const ValueId b64 = g.add_input("b64", DType::f64, {4});
  g.add_node(OpKind::add, {}, {g.add_node(OpKind::cast, CastAttrs{DType::f64}, {y4}, "c4")[0], b64},
             "a4");  // the add reads the cast, not the product: nothing to take
  Graph fused = g;
  EXPECT_EQ(fuse_gemm_epilogues(fused), 0u);
}

TEST(FuseGemmEpilogues, IrChecksAndAutodiffRefusesAClearError) {
  Graph g("net");
  const ValueId x = g.add_input("x", DType::f32, {4, 3});
  const ValueId w = g.add_input("w", DType::f32, {3, 2});
  GemmAttrs bad;
  bad.activation = {Activation::clip, 1.0, -1.0};
  EXPECT_THROW(g.add_node(OpKind::gemm, bad, {x, w}, "clip_order"), Error);
  GemmAttrs relu;
  relu.activation.kind = Activation::relu;
  const ValueId y = g.add_node(OpKind::gemm, relu, {x, w}, "fc")[0];
  const ValueId loss =
      g.add_node(OpKind::reduce_sum, ReduceAttrs{.keepdims = false}, {y}, "loss")[0];
  try {
    grad(g, loss, {x}, {});
    FAIL() << "autodiff through a fused gemm";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fused activation"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fusebox::testing
