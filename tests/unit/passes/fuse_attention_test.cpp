// fuse_attention (passes/fusion.h): attention spelled out as ops becomes one attention node.
// On the CPU backend: the zoo's ViT (scale after the product, bf16 with the casts mixed
// precision puts around the softmax) and PyTorch's exported SDPA form (sqrt(scale) on q and
// on k^T) fuse and compute what the chain computes, and so does Hugging Face's causal-mask
// form (where over a lower-triangular mask, as causal attention), and an additive mask (padding
// or a trainable bias, whose gradient the backward then writes); f32 chains and a chain whose
// values are read elsewhere do not fuse; the gradient rule (with or without the forward's lse; its
// numbers: gradcheck_norm_test.cpp). The CUDA lowering (cuDNN's fused attention, the row kernels):
// tests/unit/cuda/kernels/test_ops_attention.cpp.
#include <cmath>

#include "fusebox/backends/cpu_fast.h"
#include "fusebox/backends/cuda.h"
#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/fusion.h"
#include "fusebox/passes/pipeline.h"
#include "fusebox/runtime/executable.h"
#include "fusebox/runtime/executor.h"
#include "fusebox/zoo.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

size_t count_op(const Graph& g, OpKind op) {
  size_t n = 0;
  for (const Node& node : g.nodes()) n += node.op == op;
  return n;
}

TEST(FuseAttention, ZooVitFusesEveryLayerAndComputesTheSame) {
  const Graph model =
      build_zoo_model("vit_test", {.batch = 2, .image_size = 32, .num_classes = 10, .seed = 4});
  const NamedTensors feeds = {{"input", random_tensor(DType::f32, {2, 3, 32, 32}, 5)}};
  for (Precision p : {Precision::f32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(p));
    InferenceFusionOptions without;
    without.attention = false;
    PipelineLog log;
    const Graph fused =
        prepare_graph(model, {.kind = PipelineKind::inference, .precision = p, .log = &log});
    const Graph plain =
        prepare_graph(model, {.kind = PipelineKind::inference, .precision = p, .fusion = without});
    EXPECT_EQ(count_op(plain, OpKind::attention), 0u);
    if (p == Precision::f32) {  // f32 chains stay (cuBLASLt's TF32 products beat a fused kernel)
      EXPECT_EQ(count_op(fused, OpKind::attention), 0u);
      continue;
    }
    EXPECT_EQ(count_op(fused, OpKind::attention), 2u);  // vit_test: 2 layers
    EXPECT_EQ(count_op(fused, OpKind::softmax), 0u);
    bool logged = false;
    for (const FusionGroup& group : log.fusion.groups())
      logged = logged || (group.ops.size() >= 4 && group.ops.front().rfind("transpose", 0) == 0);
    EXPECT_TRUE(logged) << describe_fusion(fused, log.fusion, cuda::describe_lowering);
    // The fused node computes the scores and softmax in f64 on the CPU where the chain
    // rounds them to bf16: the logits differ by that rounding.
    EXPECT_TRUE(all_close(run_graph(fused, feeds).at("logits"),
                          run_graph(plain, feeds).at("logits"), 3e-2, 3e-2));
  }
}

// The zoo's decoder writes Hugging Face's causal form (where over its lower-triangular
// mask): every layer becomes one causal attention, computing what the chain computes.
TEST(FuseAttention, ZooGpt2FusesEveryLayerAsCausal) {
  const Graph model = build_zoo_model("gpt2_test", {.batch = 2, .seed = 4, .sequence_length = 16});
  const NamedTensors feeds = {{"input", random_tensor(DType::i64, {2, 16}, 5, 0, 128)}};
  InferenceFusionOptions without;
  without.attention = false;
  const Graph fused =
      prepare_graph(model, {.kind = PipelineKind::inference, .precision = Precision::bf16});
  const Graph plain = prepare_graph(
      model, {.kind = PipelineKind::inference, .precision = Precision::bf16, .fusion = without});
  EXPECT_EQ(count_op(fused, OpKind::attention), 2u);
  EXPECT_EQ(count_op(fused, OpKind::where), 0u);
  for (const Node& n : fused.nodes()) {
    if (n.op == OpKind::attention) {
      EXPECT_TRUE(std::get<AttentionAttrs>(n.attrs).causal);
    }
  }
  EXPECT_TRUE(all_close(run_graph(fused, feeds).at("logits"), run_graph(plain, feeds).at("logits"),
                        3e-2, 3e-2));
}

// f32 chains fuse where asked (InferenceFusionOptions::f32_attention: the CPU's fast kernels,
// set by Executable::compile): the zoo's ViT and its causal decoder, computing what the chains
// compute; on the CPU's fast kernels every attention node runs on oneDNN.
TEST(FuseAttention, F32ChainsFuseWhereAsked) {
  struct Case {
    const char* model;
    ZooOptions options;
    NamedTensors feeds;
    bool causal;
  };
  const Case cases[] = {
      {"vit_test",
       {.batch = 2, .image_size = 32, .num_classes = 10, .seed = 4},
       {{"input", random_tensor(DType::f32, {2, 3, 32, 32}, 5)}},
       false},
      {"gpt2_test",
       {.batch = 2, .seed = 4, .sequence_length = 16},
       {{"input", random_tensor(DType::i64, {2, 16}, 5, 0, 128)}},
       true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model);
    const Graph model = build_zoo_model(c.model, c.options);
    InferenceFusionOptions f32;
    f32.f32_attention = true;
    const Graph fused = prepare_graph(model, {.kind = PipelineKind::inference, .fusion = f32});
    const Graph plain = prepare_graph(model, {.kind = PipelineKind::inference});
    EXPECT_EQ(count_op(plain, OpKind::attention), 0u);  // not asked: f32 chains stay
    EXPECT_EQ(count_op(fused, OpKind::attention), 2u);
    EXPECT_EQ(count_op(fused, OpKind::softmax), 0u);
    for (const Node& n : fused.nodes())
      if (n.op == OpKind::attention) EXPECT_EQ(std::get<AttentionAttrs>(n.attrs).causal, c.causal);
    const Tensor want = run_graph(plain, c.feeds).at("logits");
    EXPECT_TRUE(all_close(run_graph(fused, c.feeds).at("logits"), want, 1e-4, 1e-5));
    if (!cpu_fast::built_with_onednn()) continue;
    auto exe = Executable::compile(model, {.device = Device::cpu,
                                           .cpu_kernels = CpuKernels::fast,
                                           .pipeline = {.kind = PipelineKind::inference}});
    EXPECT_EQ(count_op(exe->graph(), OpKind::attention), 2u);
    EXPECT_NE(exe->stats().fast_summary.find("attention: 2 fast"), std::string::npos)
        << exe->stats().fast_summary;
    EXPECT_TRUE(all_close(exe->run(c.feeds).at("logits"), want, 1e-3, 1e-4));
  }
}

// q [B, H, T, d], k, v: PyTorch's exported scaled_dot_product_attention multiplies q and k^T
// by sqrt(scale) each before the product.
Graph sdpa_export_form(bool read_scores_twice, DType t = DType::bf16) {
  Graph g("sdpa");
  const Shape shape = {2, 3, 5, 8};
  const ValueId q = g.add_input("q", t, shape);
  const ValueId k = g.add_input("k", t, shape);
  const ValueId v = g.add_input("v", t, shape);
  const ValueId c = g.add_constant("c", Tensor::scalar(t, std::sqrt(0.2)));
  const ValueId qs = g.add_node(OpKind::mul, {}, {q, c}, "q_scaled")[0];
  const ValueId kt = g.add_node(OpKind::transpose, TransposeAttrs{{0, 1, 3, 2}}, {k}, "k_t")[0];
  const ValueId kts = g.add_node(OpKind::mul, {}, {kt, c}, "k_t_scaled")[0];
  const ValueId s = g.add_node(OpKind::matmul, {}, {qs, kts}, "scores")[0];
  const ValueId p = g.add_node(OpKind::softmax, SoftmaxAttrs{-1}, {s}, "softmax")[0];
  const ValueId y = g.add_node(OpKind::matmul, {}, {p, v}, "context")[0];
  g.rename_value(y, "y");
  g.mark_output(y);
  if (read_scores_twice) {
    g.rename_value(s, "scores_out");
    g.mark_output(s);
  }
  return g;
}

TEST(FuseAttention, ExportedSdpaFormFusesWithTheScalesMultiplied) {
  Graph g = sdpa_export_form(false);
  const Graph before = g;
  ASSERT_EQ(fuse_attention(g), 1u);
  ASSERT_EQ(count_op(g, OpKind::attention), 1u);
  EXPECT_EQ(g.nodes().size(), 1u);  // the scales, transpose and both products went with it
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::attention) {  // bf16's sqrt(0.2), squared
      EXPECT_NEAR(std::get<AttentionAttrs>(n.attrs).scale, 0.2, 2e-3);
    }
  }
  const NamedTensors feeds = {{"q", random_tensor(DType::bf16, {2, 3, 5, 8}, 1)},
                              {"k", random_tensor(DType::bf16, {2, 3, 5, 8}, 2)},
                              {"v", random_tensor(DType::bf16, {2, 3, 5, 8}, 3)}};
  // The chain rounds the scaled operands, the scores and the probabilities to bf16.
  EXPECT_TRUE(all_close(run_graph(g, feeds).at("y"), run_graph(before, feeds).at("y"), 2e-2, 2e-2));
  // Differentiated (fused without lse, as inference fuses): the rule computes the forward
  // again with lse, then one attention_backward.
  const ValueId loss =
      g.add_node(OpKind::reduce_sum, ReduceAttrs{.keepdims = false}, {g.outputs()[0]}, "loss")[0];
  grad(g, loss, {g.inputs()[0], g.inputs()[1], g.inputs()[2]}, {});
  EXPECT_EQ(count_op(g, OpKind::attention_backward), 1u);
  EXPECT_EQ(count_op(g, OpKind::attention), 2u);
}

// The scales in f32 between casts, as mixed precision leaves an exported SDPA whose scale
// constant has dims ([1]: it promotes the mul to f32): cast -> mul -> cast on q and on k^T.
TEST(FuseAttention, ScalesBetweenCastsFuse) {
  Graph g("sdpa_f32_scales");
  const DType t = DType::bf16;
  const Shape shape = {2, 3, 5, 8};
  const ValueId q = g.add_input("q", t, shape);
  const ValueId k = g.add_input("k", t, shape);
  const ValueId v = g.add_input("v", t, shape);
  const ValueId c = g.add_constant("c", Tensor::from_vector<float>({1}, {std::sqrt(0.2f)}));
  auto scaled = [&](ValueId x, const std::string& name) {
    const ValueId up = g.add_node(OpKind::cast, CastAttrs{DType::f32}, {x}, name + "_f32")[0];
    const ValueId m = g.add_node(OpKind::mul, {}, {up, c}, name + "_scaled")[0];
    return g.add_node(OpKind::cast, CastAttrs{t}, {m}, name + "_bf16")[0];
  };
  const ValueId kt = g.add_node(OpKind::transpose, TransposeAttrs{{0, 1, 3, 2}}, {k}, "k_t")[0];
  const ValueId s =
      g.add_node(OpKind::matmul, {}, {scaled(q, "q"), scaled(kt, "k_t")}, "scores")[0];
  const ValueId p = g.add_node(OpKind::softmax, SoftmaxAttrs{-1}, {s}, "softmax")[0];
  const ValueId y = g.add_node(OpKind::matmul, {}, {p, v}, "context")[0];
  g.rename_value(y, "y");
  g.mark_output(y);
  const Graph before = g;
  ASSERT_EQ(fuse_attention(g), 1u);
  EXPECT_EQ(g.nodes().size(), 1u);  // the casts and scales went with it
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::attention) {
      EXPECT_NEAR(std::get<AttentionAttrs>(n.attrs).scale, 0.2, 1e-6);
      EXPECT_EQ(n.inputs[0], g.inputs()[0]);
    }
  }
  const NamedTensors feeds = {{"q", random_tensor(t, shape, 1)},
                              {"k", random_tensor(t, shape, 2)},
                              {"v", random_tensor(t, shape, 3)}};
  EXPECT_TRUE(all_close(run_graph(g, feeds).at("y"), run_graph(before, feeds).at("y"), 2e-2, 2e-2));
}

// Exporters fold k's head split and its transpose into one Transpose (perm [0, 2, 3, 1] from
// k [B, T, H, d]: Hugging Face's BERT): split into the head split and the swap, it fuses; a
// graph where nothing then fuses (f32) is left as it was.
TEST(FuseAttention, FoldedHeadSplitAndKeyTransposeFuse) {
  for (DType t : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dtype_name(t));
    Graph g("bert_keys");
    const ValueId q = g.add_input("q", t, {2, 3, 5, 8});
    const ValueId k = g.add_input("k_rows", t, {2, 5, 3, 8});  // [B, T, H, d]
    const ValueId v = g.add_input("v", t, {2, 3, 5, 8});
    const ValueId kt =
        g.add_node(OpKind::transpose, TransposeAttrs{{0, 2, 3, 1}}, {k}, "k_heads_t")[0];
    const ValueId s = g.add_node(OpKind::matmul, {}, {q, kt}, "scores")[0];
    const ValueId c = g.add_constant("c", Tensor::scalar(t, 0.25));
    const ValueId sc = g.add_node(OpKind::mul, {}, {s, c}, "scaled")[0];
    const ValueId p = g.add_node(OpKind::softmax, SoftmaxAttrs{-1}, {sc}, "softmax")[0];
    const ValueId y = g.add_node(OpKind::matmul, {}, {p, v}, "context")[0];
    g.rename_value(y, "y");
    g.mark_output(y);
    const Graph before = g;
    if (t == DType::f32) {
      EXPECT_EQ(fuse_attention(g), 0u);
      EXPECT_EQ(g.nodes().size(), before.nodes().size());  // the split undone
      EXPECT_EQ(count_op(g, OpKind::transpose), 1u);
      continue;
    }
    ASSERT_EQ(fuse_attention(g), 1u);
    EXPECT_EQ(count_op(g, OpKind::attention), 1u);
    EXPECT_EQ(count_op(g, OpKind::transpose), 1u);  // the head split: the attention's k
    const NamedTensors feeds = {{"q", random_tensor(t, {2, 3, 5, 8}, 1)},
                                {"k_rows", random_tensor(t, {2, 5, 3, 8}, 2)},
                                {"v", random_tensor(t, {2, 3, 5, 8}, 3)}};
    EXPECT_TRUE(
        all_close(run_graph(g, feeds).at("y"), run_graph(before, feeds).at("y"), 2e-2, 2e-2));
  }
}

// Training fuses with lse: the gradient reads the forward's own lse, no second forward.
TEST(FuseAttention, TrainingFormOutputsLseForItsGradient) {
  Graph g = sdpa_export_form(false);
  ASSERT_EQ(fuse_attention(g, nullptr, /*training=*/true), 1u);
  const ValueId loss =
      g.add_node(OpKind::reduce_sum, ReduceAttrs{.keepdims = false}, {g.outputs()[0]}, "loss")[0];
  grad(g, loss, {g.inputs()[0]}, {});
  EXPECT_EQ(count_op(g, OpKind::attention), 1u);
  EXPECT_EQ(count_op(g, OpKind::attention_backward), 1u);
}

// Hugging Face's GPT-2 eager attention: scores / sqrt(d), where(tril, scores, finfo.min),
// softmax, product: a causal attention when the mask is exactly the lower triangle.
Graph hf_causal_form(const Tensor& mask, double fill, bool fill_cast = false) {
  Graph g("hf_causal");
  const DType t = DType::bf16;
  const Shape shape = {2, 3, 5, 8};
  const ValueId q = g.add_input("q", t, shape);
  const ValueId k = g.add_input("k", t, shape);
  const ValueId v = g.add_input("v", t, shape);
  const ValueId kt = g.add_node(OpKind::transpose, TransposeAttrs{{0, 1, 3, 2}}, {k}, "k_t")[0];
  const ValueId s = g.add_node(OpKind::matmul, {}, {q, kt}, "scores")[0];
  const ValueId c = g.add_constant("root_d", Tensor::scalar(t, std::sqrt(8.0)));
  const ValueId sd = g.add_node(OpKind::div, {}, {s, c}, "scaled")[0];
  const ValueId m = g.add_constant("bias", mask);
  // fill_cast: an f32 constant cast to bf16 by a node (training graphs keep that cast).
  const ValueId f =
      fill_cast
          ? g.add_node(OpKind::cast, CastAttrs{t},
                       {g.add_constant("fill", Tensor::scalar(DType::f32, fill))}, "fill_bf16")[0]
          : g.add_constant("fill", Tensor::scalar(t, fill));
  const ValueId w = g.add_node(OpKind::where, {}, {m, sd, f}, "masked")[0];
  const ValueId p = g.add_node(OpKind::softmax, SoftmaxAttrs{-1}, {w}, "softmax")[0];
  const ValueId y = g.add_node(OpKind::matmul, {}, {p, v}, "context")[0];
  g.rename_value(y, "y");
  g.mark_output(y);
  return g;
}

TEST(FuseAttention, HuggingFaceCausalMaskFusesAsCausal) {
  Tensor tril = Tensor::empty(DType::boolean, {1, 1, 5, 5});
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 5; ++j) tril.data<bool>()[i * 5 + j] = j <= i;
  const double bf16_min = -3.3895313892515355e38;
  Graph g = hf_causal_form(tril, bf16_min);
  const Graph before = g;
  ASSERT_EQ(fuse_attention(g), 1u);
  ASSERT_EQ(count_op(g, OpKind::where), 0u);
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::attention) continue;
    EXPECT_TRUE(std::get<AttentionAttrs>(n.attrs).causal);
    EXPECT_NEAR(std::get<AttentionAttrs>(n.attrs).scale, 1 / std::sqrt(8.0), 1e-3);
  }
  const NamedTensors feeds = {{"q", random_tensor(DType::bf16, {2, 3, 5, 8}, 1)},
                              {"k", random_tensor(DType::bf16, {2, 3, 5, 8}, 2)},
                              {"v", random_tensor(DType::bf16, {2, 3, 5, 8}, 3)}};
  EXPECT_TRUE(all_close(run_graph(g, feeds).at("y"), run_graph(before, feeds).at("y"), 2e-2, 2e-2));
  // Not the lower triangle (one key kept past the diagonal), or a fill that does not vanish
  // under exp: stays a where.
  Tensor off = tril.clone();   // a Tensor copy shares the bytes
  off.data<bool>()[1] = true;  // query 0 sees key 1
  Graph g2 = hf_causal_form(off, bf16_min);
  EXPECT_EQ(fuse_attention(g2), 0u);
  Graph g3 = hf_causal_form(tril, -100.0);
  EXPECT_EQ(fuse_attention(g3), 0u);
  // The fill behind a cast of an f32 constant (f32's finfo.min) still fuses.
  Graph g4 = hf_causal_form(tril, -3.4028234663852886e38, /*fill_cast=*/true);
  EXPECT_EQ(fuse_attention(g4), 1u);
}

// Hugging Face's eager attention with a padding mask: scores / sqrt(d) cast to f32 (mixed
// precision's softmax), + an f32 mask [B, 1, 1, Tk] made at run time from the model's
// attention_mask, softmax, cast back, product. `scale_after`: the mask added before the
// scale, which the attention cannot take (it adds its bias after the scale).
Graph hf_padding_form(bool scale_after = false, const Shape& mask_shape = {2, 1, 1, 5}) {
  Graph g("hf_padding");
  const DType t = DType::bf16;
  const Shape shape = {2, 3, 5, 8};
  const ValueId q = g.add_input("q", t, shape);
  const ValueId k = g.add_input("k", t, shape);
  const ValueId v = g.add_input("v", t, shape);
  const ValueId mask = g.add_input("mask", DType::f32, mask_shape);
  const ValueId kt = g.add_node(OpKind::transpose, TransposeAttrs{{0, 1, 3, 2}}, {k}, "k_t")[0];
  const ValueId s = g.add_node(OpKind::matmul, {}, {q, kt}, "scores")[0];
  const ValueId s32 = g.add_node(OpKind::cast, CastAttrs{DType::f32}, {s}, "scores_f32")[0];
  const ValueId c = g.add_constant("root_d", Tensor::scalar(DType::f32, std::sqrt(8.0)));
  ValueId x = s32;
  if (!scale_after) x = g.add_node(OpKind::div, {}, {x, c}, "scaled")[0];
  x = g.add_node(OpKind::add, {}, {x, mask}, "masked")[0];
  if (scale_after) x = g.add_node(OpKind::div, {}, {x, c}, "scaled")[0];
  const ValueId p = g.add_node(OpKind::softmax, SoftmaxAttrs{-1}, {x}, "softmax")[0];
  const ValueId p16 = g.add_node(OpKind::cast, CastAttrs{t}, {p}, "probs_bf16")[0];
  const ValueId y = g.add_node(OpKind::matmul, {}, {p16, v}, "context")[0];
  g.rename_value(y, "y");
  g.mark_output(y);
  return g;
}

// A padding mask: 0 for the kept keys, f32's finfo.min for the padded ones (HF's form).
Tensor padding_mask(const Shape& shape, int64_t keep_first) {
  Tensor m = Tensor::zeros(DType::f32, shape);
  for (int64_t e = 0; e < m.numel(); ++e)
    if (e % shape.back() >= keep_first) m.data<float>()[e] = -3.4028234663852886e38f;
  return m;
}

TEST(FuseAttention, PaddingMaskBecomesTheBias) {
  Graph g = hf_padding_form();
  const Graph before = g;
  FusionLog log;
  ASSERT_EQ(fuse_attention(g, &log), 1u);
  EXPECT_EQ(count_op(g, OpKind::add), 0u);
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::attention) continue;
    ASSERT_EQ(n.inputs.size(), 4u);
    EXPECT_EQ(g.value(n.inputs[3]).name, "mask");
    EXPECT_NEAR(std::get<AttentionAttrs>(n.attrs).scale, 1 / std::sqrt(8.0), 1e-6);
  }
  const NamedTensors feeds = {{"q", random_tensor(DType::bf16, {2, 3, 5, 8}, 1)},
                              {"k", random_tensor(DType::bf16, {2, 3, 5, 8}, 2)},
                              {"v", random_tensor(DType::bf16, {2, 3, 5, 8}, 3)},
                              {"mask", padding_mask({2, 1, 1, 5}, 3)}};
  const Tensor fused = run_graph(g, feeds).at("y"), plain = run_graph(before, feeds).at("y");
  EXPECT_TRUE(all_close(fused, plain, 2e-2, 2e-2));
  // A scale after the add would scale the mask too: not fused.
  Graph after = hf_padding_form(/*scale_after=*/true);
  EXPECT_EQ(fuse_attention(after), 0u);
  // A bias with its own full shape (a relative-position bias) fuses the same way.
  Graph full = hf_padding_form(false, {1, 3, 5, 5});
  EXPECT_EQ(fuse_attention(full), 1u);
}

// Training with a trainable bias (Swin-style relative-position bias, a graph input here): the
// gradient asks attention_backward for dbias; a mask without a gradient does not.
TEST(FuseAttention, TrainableBiasGetsItsGradient) {
  for (bool bias_needs_grad : {true, false}) {
    SCOPED_TRACE(bias_needs_grad ? "bias differentiated" : "mask only");
    Graph g = hf_padding_form(false, {1, 3, 5, 5});
    ASSERT_EQ(fuse_attention(g, nullptr, /*training=*/true), 1u);
    const ValueId loss =
        g.add_node(OpKind::reduce_sum, ReduceAttrs{.keepdims = false}, {g.outputs()[0]}, "loss")[0];
    std::vector<ValueId> wrt = {g.inputs()[0]};
    if (bias_needs_grad) wrt.push_back(g.inputs()[3]);
    grad(g, loss, wrt, {});
    ASSERT_EQ(count_op(g, OpKind::attention_backward), 1u);
    for (const Node& n : g.nodes()) {
      if (n.op != OpKind::attention_backward) continue;
      EXPECT_EQ(std::get<AttentionAttrs>(n.attrs).bias_grad, bias_needs_grad);
      EXPECT_EQ(n.outputs.size(), bias_needs_grad ? 4u : 3u);
    }
  }
}

// Swin's shifted windows (torchvision's shifted_window_attention): B = 2 images of nW = 4
// windows of N = 5 tokens, h = 3 heads; the relative-position bias added to the scores, then a
// per-window mask between two reshapes. `rel_input`: the bias is a graph input (trainable), else
// a constant; `mask_per_image`: the mask also varies over the images ([2, 4, 1, 5, 5]).
Graph swin_window_form(bool rel_input, bool mask_per_image = false) {
  Graph g("swin_windows");
  const DType t = DType::bf16;
  const Shape shape = {8, 3, 5, 8};
  const ValueId q = g.add_input("q", t, shape);
  const ValueId k = g.add_input("k", t, shape);
  const ValueId v = g.add_input("v", t, shape);
  const ValueId rel = rel_input ? g.add_input("rel", t, {1, 3, 5, 5})
                                : g.add_constant("rel", random_tensor(t, {1, 3, 5, 5}, 7));
  // The shifted windows' mask: 0 within a region, -100 across regions (torchvision's values).
  Tensor mask = Tensor::zeros(t, {mask_per_image ? 2 : 1, 4, 1, 5, 5});
  for (int64_t e = 0; e < mask.numel(); ++e)
    if ((e / 25) % 4 != 0 && (e % 5) < (e / 5) % 5) mask.set(e, -100.0);
  const ValueId m = g.add_constant("mask", mask);
  const ValueId c = g.add_constant("scale", Tensor::scalar(t, 1 / std::sqrt(8.0)));
  const ValueId qs = g.add_node(OpKind::mul, {}, {q, c}, "q_scaled")[0];
  const ValueId kt = g.add_node(OpKind::transpose, TransposeAttrs{{0, 1, 3, 2}}, {k}, "k_t")[0];
  ValueId x = g.add_node(OpKind::matmul, {}, {qs, kt}, "scores")[0];
  x = g.add_node(OpKind::add, {}, {x, rel}, "rel_bias")[0];
  x = g.add_node(OpKind::reshape, ReshapeAttrs{{2, 4, 3, 5, 5}}, {x}, "to_windows")[0];
  x = g.add_node(OpKind::add, {}, {x, m}, "masked")[0];
  x = g.add_node(OpKind::reshape, ReshapeAttrs{{-1, 3, 5, 5}}, {x}, "from_windows")[0];
  x = g.add_node(OpKind::cast, CastAttrs{DType::f32}, {x}, "scores_f32")[0];
  const ValueId p = g.add_node(OpKind::softmax, SoftmaxAttrs{-1}, {x}, "softmax")[0];
  const ValueId p16 = g.add_node(OpKind::cast, CastAttrs{t}, {p}, "probs_bf16")[0];
  const ValueId y = g.add_node(OpKind::matmul, {}, {p16, v}, "context")[0];
  g.rename_value(y, "y");
  g.mark_output(y);
  return g;
}

// The windows join the heads (q, k, v read as [2, 12, 5, 8], the bias rel + mask as
// [1, 12, 5, 5]), so that one attention node computes the chain; the product is read back as
// [8, 3, 5, 8]. A constant bias is folded here; a trainable one is summed in the graph and gets
// its gradient; a mask that also varies over the images does not fuse.
TEST(FuseAttention, SwinShiftedWindowsJoinTheHeads) {
  const NamedTensors feeds = {{"q", random_tensor(DType::bf16, {8, 3, 5, 8}, 1)},
                              {"k", random_tensor(DType::bf16, {8, 3, 5, 8}, 2)},
                              {"v", random_tensor(DType::bf16, {8, 3, 5, 8}, 3)},
                              {"rel", random_tensor(DType::bf16, {1, 3, 5, 5}, 4)}};
  for (bool rel_input : {false, true}) {
    SCOPED_TRACE(rel_input ? "trainable bias" : "constant bias");
    const Graph plain = swin_window_form(rel_input);
    Graph g = plain;
    ASSERT_EQ(fuse_attention(g), 1u);
    EXPECT_EQ(count_op(g, OpKind::softmax), 0u);
    for (const Node& n : g.nodes()) {
      if (n.op != OpKind::attention) continue;
      ASSERT_EQ(n.inputs.size(), 4u);
      EXPECT_EQ(g.value(n.inputs[0]).type.shape, (Shape{2, 12, 5, 8}));
      EXPECT_EQ(g.value(n.inputs[3]).type.shape, (Shape{1, 12, 5, 5}));
      EXPECT_EQ(g.is_constant(n.inputs[3]), !rel_input);
      EXPECT_NEAR(std::get<AttentionAttrs>(n.attrs).scale, 1 / std::sqrt(8.0), 1e-2);
    }
    NamedTensors in = feeds;
    if (!rel_input) in.erase("rel");
    EXPECT_TRUE(all_close(run_graph(g, in).at("y"), run_graph(plain, in).at("y"), 2e-2, 2e-2));
  }
  // Training: d loss / d rel through the attention's dbias equals the unfused chain's.
  Graph fused = swin_window_form(true), plain = fused;
  ASSERT_EQ(fuse_attention(fused, nullptr, /*training=*/true), 1u);
  for (Graph* g : {&fused, &plain}) {
    const ValueId loss = g->add_node(OpKind::reduce_sum, ReduceAttrs{.keepdims = false},
                                     {g->outputs()[0]}, "loss")[0];
    const GradResult r = grad(*g, loss, {g->inputs()[0], g->inputs()[3]});
    g->rename_value(r.of(g->inputs()[0]), "dq");
    g->rename_value(r.of(g->inputs()[3]), "drel");
    g->mark_output(r.of(g->inputs()[0]));
    g->mark_output(r.of(g->inputs()[3]));
  }
  EXPECT_EQ(count_op(fused, OpKind::attention_backward), 1u);
  const NamedTensors a = run_graph(fused, feeds), b = run_graph(plain, feeds);
  EXPECT_TRUE(all_close(a.at("dq"), b.at("dq"), 3e-2, 3e-2));
  EXPECT_TRUE(all_close(a.at("drel"), b.at("drel"), 3e-2, 3e-2));
  // A mask of its own per image is no bias of the merged heads: left as it was.
  Graph per_image = swin_window_form(false, /*mask_per_image=*/true);
  const Graph before = per_image;
  EXPECT_EQ(fuse_attention(per_image), 0u);
  EXPECT_EQ(per_image.nodes().size(), before.nodes().size());
}

TEST(FuseAttention, ScoresReadElsewhereOrF32StayUnfused) {
  Graph g = sdpa_export_form(true);
  EXPECT_EQ(fuse_attention(g), 0u);
  EXPECT_EQ(count_op(g, OpKind::softmax), 1u);
  Graph f32 = sdpa_export_form(false, DType::f32);
  EXPECT_EQ(fuse_attention(f32), 0u);
}

}  // namespace
}  // namespace fusebox::testing
