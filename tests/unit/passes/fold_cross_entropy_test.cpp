// fold_cross_entropy (passes/simplify.h): a loss whose log_prob nothing reads takes the
// lse_stash form and reads through the widening cast, the class-axis transpose, row-keeping
// reshapes and a padded product's column slice; the loss and the gradients autodiff derives
// are the original's (CPU); a loss whose log_prob is read stays as it is.
#include "fusebox/ir/builder.h"
#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/simplify.h"
#include "fusebox/runtime/executor.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

constexpr PadColumnsThresholds kAlways{.min_flops = 0, .min_flops_per_copied_byte = 0};

struct Decoder {
  DType dtype = DType::f64;
  Reduction reduction = Reduction::mean;
  bool weighted = false;
  bool pad = true;   // pad_product_columns first (the LM head's slice)
  bool fold = true;  // fold_cross_entropy before autodiff
};

// A decoder's loss: logits = h [2, 3, 16] x w [16, 50] (dtype), moved to [2, 50, 3] as an
// exporter writes it, widened to f32 when low, cross_entropy against labels [2, 3]
// (ignore_index -100, one label ignored). Outputs: "loss", "dh", "dw".
Graph decoder(const Decoder& d) {
  Graph g("decoder");
  Builder b(g);
  const ValueId h = g.add_input("h", d.dtype, {2, 3, 16});
  const ValueId w = g.add_input("w", d.dtype, {16, 50});
  g.add_input("labels", DType::i64, {2, 3});
  g.rename_value(b.matmul(h, w), "logits");
  if (d.pad) {
    EXPECT_EQ(pad_product_columns(g, nullptr, kAlways), 1u);
  }
  Builder after(g);
  ValueId logits = after.transpose(*g.find_value("logits"), {0, 2, 1});
  if (d.dtype != DType::f64 && d.dtype != DType::f32) logits = after.cast(logits, DType::f32);
  const DType stat = d.dtype == DType::f64 ? DType::f64 : DType::f32;
  const ValueId weight =
      d.weighted ? g.add_constant("class_weight", random_tensor(stat, {50}, 11, 0.5, 2)) : kNoValue;
  ValueId loss = after
                     .cross_entropy(logits, *g.find_value("labels"), weight,
                                    {.reduction = d.reduction, .ignore_index = -100})
                     .at(0);
  if (d.reduction == Reduction::none) loss = after.reduce_sum(loss, {}, false);
  g.rename_value(loss, "loss");
  g.mark_output(loss);
  if (d.fold) {
    EXPECT_EQ(fold_cross_entropy(g), 1u);
  }
  const GradResult r = grad(g, *g.find_value("loss"), {*g.find_value("h"), *g.find_value("w")});
  g.rename_value(r.of(*g.find_value("h")), "dh");
  g.rename_value(r.of(*g.find_value("w")), "dw");
  g.mark_output(r.of(*g.find_value("h")));
  g.mark_output(r.of(*g.find_value("w")));
  g.verify();
  return g;
}

NamedTensors feeds(DType t) {
  Tensor labels = random_tensor(DType::i64, {2, 3}, 3, 0, 50);
  std::vector<double> l = labels.to_doubles();
  l[4] = -100;
  return {{"h", random_tensor(t, {2, 3, 16}, 1)},
          {"w", random_tensor(t, {16, 50}, 2)},
          {"labels", Tensor::from_doubles(DType::i64, {2, 3}, l)}};
}

const CrossEntropyAttrs& loss_attrs(const Graph& g) {
  for (const Node& n : g.nodes())
    if (n.op == OpKind::cross_entropy) return std::get<CrossEntropyAttrs>(n.attrs);
  throw std::runtime_error("no cross_entropy");
}

TEST(FoldCrossEntropy, ReadsThePaddedRowsAndKeepsValuesAndGradients) {
  for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
    for (bool weighted : {false, true}) {
      SCOPED_TRACE(cat("reduction ", int(r), weighted ? " weighted" : ""));
      const Graph plain = decoder({.reduction = r, .weighted = weighted, .fold = false});
      const Graph folded = decoder({.reduction = r, .weighted = weighted});
      const CrossEntropyAttrs& a = loss_attrs(folded);
      EXPECT_TRUE(a.lse_stash);
      EXPECT_EQ(a.classes, std::optional<int64_t>(50));
      // The transpose and the slice are gone; the gradient reaches the padded product as is.
      EXPECT_EQ(count_ops(folded, OpKind::transpose), count_ops(plain, OpKind::transpose) - 2);
      EXPECT_EQ(count_ops(folded, OpKind::slice), 0);
      EXPECT_EQ(count_ops(folded, OpKind::slice_backward), 0);
      EXPECT_EQ(count_ops(folded, OpKind::log_softmax_backward), 0);
      const NamedTensors in = feeds(DType::f64);
      const NamedTensors want = run_graph(plain, in), got = run_graph(folded, in);
      for (const char* name : {"loss", "dh", "dw"}) {
        ASSERT_TRUE(got.count(name)) << name;
        EXPECT_EQ(got.at(name).shape(), want.at(name).shape()) << name;
        EXPECT_TRUE(all_close(got.at(name), want.at(name), 1e-12, 1e-12)) << name;
      }
    }
  }
}

TEST(FoldCrossEntropy, ReadsLowLogitsThroughTheWideningCast) {
  const Graph plain = decoder({.dtype = DType::bf16, .pad = false, .fold = false});
  const Graph folded = decoder({.dtype = DType::bf16, .pad = false});
  EXPECT_EQ(count_ops(folded, OpKind::cast), 0);
  // The loss's transpose and its gradient's (the batched product's gradient has its own).
  EXPECT_EQ(count_ops(folded, OpKind::transpose), count_ops(plain, OpKind::transpose) - 2);
  for (const Node& n : folded.nodes()) {
    if (n.op != OpKind::cross_entropy) continue;
    EXPECT_EQ(folded.value(n.inputs[0]).type.dtype, DType::bf16);
    EXPECT_EQ(folded.value(n.outputs[0]).type.dtype, DType::f32);  // the loss stays f32
  }
  const NamedTensors in = feeds(DType::bf16);
  const NamedTensors want = run_graph(plain, in), got = run_graph(folded, in);
  // The loss from the same bf16 logits in f64 on both sides; the gradients rounded to bf16
  // once (folded) or after an f32 log_prob (plain): a bf16 ulp.
  EXPECT_TRUE(all_close(got.at("loss"), want.at("loss"), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(got.at("dh"), want.at("dh"), 1e-2, 1e-3));
  EXPECT_TRUE(all_close(got.at("dw"), want.at("dw"), 1e-2, 1e-3));
}

TEST(FoldCrossEntropy, ALossWhoseLogProbIsReadStays) {
  Graph g("read");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {4, 10});
  const std::vector<ValueId> ce = b.cross_entropy(b.transpose(b.reshape(x, {4, 1, 10}), {0, 2, 1}),
                                                  g.add_input("labels", DType::i64, {4, 1}));
  g.mark_output(ce[0]);
  g.mark_output(ce[1]);
  EXPECT_EQ(fold_cross_entropy(g), 0u);
  EXPECT_FALSE(loss_attrs(g).lse_stash);
}

// Rank 4 (segmentation: the class axis is 1 already): the lse_stash form over the same
// logits, nothing walked.
TEST(FoldCrossEntropy, SpatialLossTakesTheLseForm) {
  Graph g("spatial");
  Builder b(g);
  const ValueId x = g.add_input("x", DType::f32, {2, 5, 3, 4});
  const ValueId labels = g.add_input("labels", DType::i64, {2, 3, 4});
  const ValueId loss = b.cross_entropy(b.relu(x), labels).at(0);
  g.rename_value(loss, "loss");
  g.mark_output(loss);
  Graph folded = g;
  EXPECT_EQ(fold_cross_entropy(folded), 1u);
  EXPECT_TRUE(loss_attrs(folded).lse_stash);
  EXPECT_FALSE(loss_attrs(folded).classes.has_value());
  EXPECT_EQ(count_ops(folded, OpKind::relu), 1);
  const NamedTensors in{{"x", random_tensor(DType::f32, {2, 5, 3, 4}, 4)},
                        {"labels", random_tensor(DType::i64, {2, 3, 4}, 5, 0, 5)}};
  EXPECT_TRUE(all_close(run_graph(folded, in).at("loss"), run_graph(g, in).at("loss"), 1e-6, 1e-7));
}

}  // namespace
}  // namespace fusebox::testing
