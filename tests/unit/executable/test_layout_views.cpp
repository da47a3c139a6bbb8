// Layout ops read through (executable/layout_views.h): each planned view is checked against
// the CPU oracle running the same chain on a root whose elements are their own indices, so
// the view's offset and strides must name exactly the elements the ops pick. Needs no GPU.
#include <gtest/gtest.h>

#include <numeric>

#include "executable/layout_views.h"
#include "fusebox/ir/op_info.h"
#include "fusebox/runtime/executor.h"

namespace fusebox::testing {
namespace {

using runtime::IndexMap;
using runtime::LayoutView;
using Kind = LayoutView::Kind;

struct Chain {
  Graph g{"chain"};
  ValueId root = kNoValue;
  std::vector<ValueId> steps;  // each layout op's output, in order
  ValueId add(OpKind op, Attrs attrs) {
    const ValueId from = steps.empty() ? root : steps.back();
    steps.push_back(g.add_node(op, std::move(attrs), {from})[0]);
    return steps.back();
  }
};

// torch.nn.MultiheadAttention's head split of a packed projection [T, B, 3E] as its ONNX export
// spells it (T = 5, B = 2, 3 heads of 4): -> [T, B, 3, E] -> [1, T, B, 3, E] -> [3, T, B, 1, E]
// -> [3, T, B, E] -> slice `which` -> [T, B, E] -> [T, B*H, d] -> [B*H, T, d] -> [B, H, T, d].
Chain head_split(int64_t which) {
  const int64_t t = 5, b = 2, h = 3, d = 4, e = h * d;
  Chain c;
  const ValueId x = c.g.add_input("x", DType::f32, {t, b, 3 * e});
  c.root = c.g.add_node(OpKind::relu, {}, {x})[0];  // a stored value of the step
  c.add(OpKind::reshape, ReshapeAttrs{{t, b, 3, e}});
  c.add(OpKind::unsqueeze, AxesAttrs{{0}});
  c.add(OpKind::transpose, TransposeAttrs{{3, 1, 2, 0, 4}});
  c.add(OpKind::squeeze, AxesAttrs{{3}});
  c.add(OpKind::slice, SliceAttrs{{which}, {which + 1}, {0}, {1}});
  c.add(OpKind::squeeze, AxesAttrs{{0}});
  c.add(OpKind::reshape, ReshapeAttrs{{t, b * h, d}});
  c.add(OpKind::transpose, TransposeAttrs{{1, 0, 2}});
  c.add(OpKind::reshape, ReshapeAttrs{{b, h, t, d}});
  return c;
}

// The elements the oracle's chain picks vs the ones the map's strides name, for every step
// whose map is a strided view.
void expect_maps_match_oracle(Chain& c, int* views) {
  Graph g = c.g;
  for (ValueId v : c.steps) g.mark_output(v);
  const Shape& shape = g.value(c.root).type.shape;
  // relu keeps the indices (all >= 0): the root's element i is i.
  std::vector<float> index(size_t(numel(shape)));
  std::iota(index.begin(), index.end(), 0.0f);
  const NamedTensors out = run_graph(g, {{"x", Tensor::from_vector<float>(shape, index)}});
  IndexMap map = IndexMap::stored(shape, contiguous_strides(shape));
  for (size_t s = 0; s < c.steps.size(); ++s) {
    const Node& n = g.nodes()[s + 1];  // after the relu
    const Shape& to = g.value(c.steps[s]).type.shape;
    ASSERT_TRUE(runtime::apply_layout(map, n, to)) << n.name;
    const std::optional<Shape> strides = map.strides();
    if (!strides) continue;
    ++*views;
    const Tensor& want = out.at(g.value(c.steps[s]).name);
    std::vector<int64_t> at(to.size(), 0);
    for (int64_t i = 0; i < numel(to); ++i) {
      int64_t rest = i, element = map.offset();
      for (size_t d = to.size(); d-- > 0;) {
        at[d] = rest % to[d];
        rest /= to[d];
        element += at[d] * (*strides)[d];
      }
      ASSERT_EQ(int64_t(want.get(i)), element)
          << "step " << s << " (" << n.name << ") element " << i;
    }
  }
}

TEST(LayoutViews, MultiheadAttentionHeadSplitIsAViewOfTheProjection) {
  for (int64_t which = 0; which < 3; ++which) {
    Chain c = head_split(which);
    int views = 0;
    expect_maps_match_oracle(c, &views);
    // Every step but [T, B*H, d] and [B*H, T, d] (B merged with a part of E) is a strided
    // view.
    EXPECT_EQ(views, int(c.steps.size()) - 2);
    IndexMap map = IndexMap::stored({5, 2, 36}, contiguous_strides({5, 2, 36}));
    for (size_t s = 0; s < c.steps.size(); ++s)
      ASSERT_TRUE(runtime::apply_layout(map, c.g.nodes()[s + 1], c.g.value(c.steps[s]).type.shape));
    EXPECT_EQ(map.offset(), which * 12);
    EXPECT_EQ(*map.strides(), (Shape{36, 4, 72, 1}));  // [B, H, T, d] over [T, B, 3E]
  }
}

TEST(LayoutViews, ReshapesThatSplitNoFactorAreRefused) {
  // [6, 4] transposed is [4, 6] with strides (1, 4): viewed as [3, 8] it has no factored form.
  IndexMap map = IndexMap::stored({6, 4}, {4, 1});
  map.transpose({1, 0});
  EXPECT_FALSE(map.reshape({3, 8}));
  // A contiguous [6, 4] regroups freely (the factors nest into one).
  IndexMap dense = IndexMap::stored({6, 4}, {4, 1});
  ASSERT_TRUE(dense.reshape({4, 6}));
  EXPECT_EQ(*dense.strides(), (Shape{6, 1}));
  ASSERT_TRUE(dense.reshape({2, 3, 4}));
  EXPECT_EQ(*dense.strides(), (Shape{12, 4, 1}));
}

TEST(LayoutViews, StridedSlicesAndChannelsLastRoots) {
  // A channels-last [N, C, H, W] root, its channels 2..5 every other one: a view.
  Chain c;
  const ValueId x = c.g.add_input("x", DType::f32, {2, 6, 3, 3});
  c.root = c.g.add_node(OpKind::relu, {}, {x})[0];
  c.add(OpKind::slice, SliceAttrs{{1}, {5}, {1}, {2}});
  IndexMap map =
      IndexMap::stored({2, 6, 3, 3}, strides_for({2, 6, 3, 3}, MemoryFormat::channels_last));
  ASSERT_TRUE(runtime::apply_layout(map, c.g.nodes()[1], c.g.value(c.steps[0]).type.shape));
  EXPECT_EQ(map.offset(), 1);
  EXPECT_EQ(*map.strides(), (Shape{54, 2, 18, 6}));
  int views = 0;
  expect_maps_match_oracle(c, &views);  // the oracle on a contiguous root: its own map
  EXPECT_EQ(views, 1);
}

// The plan: the head split read by a reader that takes strides (relu here) leaves [T, B*H, d]
// and [B*H, T, d] unstored (no strided form) and every other step a view (no kernel), all of
// one root; a reader that needs a tensor of its own (a matmul) makes the value it reads stored:
// copied from the root's view where its input is unstored.
runtime::ReaderTakes takes_as_cuda(const Node& n, size_t) {
  if (n.op == OpKind::relu) return runtime::ReaderTakes::any_view;  // q's reader here
  return runtime::ReaderTakes::planned;
}

TEST(LayoutViews, PlanLeavesTheMiddleUnstoredAndCopiesOnlyForDenseReaders) {
  Chain c = head_split(1);
  const ValueId q = c.steps.back();
  c.g.mark_output(c.g.add_node(OpKind::relu, {}, {c.steps[5]})[0]);  // [T, B, E]
  const ValueId w = c.g.add_input("w", DType::f32, {4, 4});
  c.g.mark_output(c.g.add_node(OpKind::matmul, {}, {q, w})[0]);  // [B, H, T, d] x w
  c.g.mark_output(c.g.add_node(OpKind::relu, {}, {q})[0]);
  std::vector<bool> eligible(c.g.values().size(), false);
  std::vector<Shape> stored(c.g.values().size());
  for (ValueId v : c.steps) eligible[size_t(v)] = true;
  for (ValueId v : c.steps) stored[size_t(v)] = contiguous_strides(c.g.value(v).type.shape);
  stored[size_t(c.root)] = contiguous_strides(c.g.value(c.root).type.shape);
  const std::vector<LayoutView> plan =
      runtime::plan_layout_views(c.g, eligible, stored, takes_as_cuda);
  auto kind = [&](size_t step) { return plan[size_t(c.steps[step])].kind; };
  for (size_t s = 0; s < 6; ++s) EXPECT_EQ(kind(s), Kind::view) << "step " << s;
  EXPECT_EQ(kind(6), Kind::unstored);   // [T, B*H, d]
  EXPECT_EQ(kind(7), Kind::unstored);   // [B*H, T, d]
  EXPECT_EQ(kind(8), Kind::from_root);  // q: the matmul reads it
  EXPECT_EQ(plan[size_t(q)].root, c.root);
  EXPECT_EQ(plan[size_t(q)].offset, 12);
  EXPECT_EQ(plan[size_t(q)].strides, (Shape{36, 4, 72, 1}));
  EXPECT_EQ(plan[size_t(c.steps[5])].strides, (Shape{72, 36, 1}));
  // Without the matmul, q is a view too.
  Chain d = head_split(2);
  d.g.mark_output(d.g.add_node(OpKind::relu, {}, {d.steps.back()})[0]);
  std::vector<bool> eligible_d(d.g.values().size(), false);
  std::vector<Shape> stored_d(d.g.values().size());
  for (ValueId v : d.steps) eligible_d[size_t(v)] = true;
  stored_d[size_t(d.root)] = contiguous_strides(d.g.value(d.root).type.shape);
  const std::vector<LayoutView> plan_d =
      runtime::plan_layout_views(d.g, eligible_d, stored_d, takes_as_cuda);
  EXPECT_EQ(plan_d[size_t(d.steps.back())].kind, Kind::view);
  EXPECT_EQ(plan_d[size_t(d.steps.back())].offset, 24);
}

// A reader that takes only the value as it would be stored gets a view where the view is that
// (a reshape of a contiguous value, a block slice at an aligned offset) and a copy otherwise.
TEST(LayoutViews, DenseReadersGetViewsOnlyOfTheStoredOrderAtAlignedOffsets) {
  Graph g("dense");
  const ValueId x = g.add_input("x", DType::f32, {4, 64});
  const ValueId root = g.add_node(OpKind::relu, {}, {x})[0];
  const ValueId flat = g.add_node(OpKind::reshape, ReshapeAttrs{{2, 128}}, {root})[0];
  const ValueId rows = g.add_node(OpKind::slice, SliceAttrs{{1}, {3}, {0}, {1}}, {root})[0];
  const ValueId cols = g.add_node(OpKind::slice, SliceAttrs{{32}, {64}, {1}, {1}}, {root})[0];
  const ValueId t = g.add_node(OpKind::transpose, TransposeAttrs{{1, 0}}, {root})[0];
  const ValueId w = g.add_input("w", DType::f32, {128, 4});
  g.mark_output(g.add_node(OpKind::matmul, {}, {flat, w})[0]);
  for (ValueId v : {rows, cols, t}) g.mark_output(g.add_node(OpKind::relu, {}, {v})[0]);
  std::vector<bool> eligible(g.values().size(), false);
  std::vector<Shape> stored(g.values().size());
  for (ValueId v : {root, flat, rows, cols, t}) {
    stored[size_t(v)] = contiguous_strides(g.value(v).type.shape);
    eligible[size_t(v)] = v != root;
  }
  const std::vector<LayoutView> plan = runtime::plan_layout_views(
      g, eligible, stored, [](const Node&, size_t) { return runtime::ReaderTakes::planned; });
  EXPECT_EQ(plan[size_t(flat)].kind, Kind::view);
  EXPECT_EQ(plan[size_t(rows)].kind, Kind::view);  // 256 bytes in
  EXPECT_EQ(plan[size_t(rows)].offset, 64);
  EXPECT_EQ(plan[size_t(cols)].kind, Kind::copy);  // strided
  EXPECT_EQ(plan[size_t(t)].kind, Kind::copy);
  // Readers that take strides at aligned addresses: the columns (128 bytes in) still copy.
  const std::vector<LayoutView> strided = runtime::plan_layout_views(
      g, eligible, stored,
      [](const Node&, size_t) { return runtime::ReaderTakes::aligned_strides; });
  EXPECT_EQ(strided[size_t(t)].kind, Kind::view);
  EXPECT_EQ(strided[size_t(cols)].kind, Kind::copy);
}

// A transformer's attention output O [B, H, T, d] is copied into the rows [B*T, H*d] its output
// projection reads; the backward reads O again through the inverse reshape and transpose. That
// chain is a view of the rows copy, so O need not live into the backward; unless its reader
// needs O's own order, which only O has without a copy.
struct RowsAndBack {
  Graph g{"rows"};
  ValueId o, t1, rows, r2, t2;
  explicit RowsAndBack(bool back_reader_takes_strides) {
    const int64_t b = 2, h = 3, t = 5, d = 4;
    const ValueId x = g.add_input("x", DType::f32, {b, h, t, d});
    o = g.add_node(OpKind::relu, {}, {x})[0];
    t1 = g.add_node(OpKind::transpose, TransposeAttrs{{0, 2, 1, 3}}, {o})[0];
    rows = g.add_node(OpKind::reshape, ReshapeAttrs{{b * t, h * d}}, {t1})[0];
    const ValueId w = g.add_input("w", DType::f32, {h * d, 8});
    g.mark_output(g.add_node(OpKind::matmul, {}, {rows, w})[0]);
    r2 = g.add_node(OpKind::reshape, ReshapeAttrs{{b, t, h, d}}, {rows})[0];
    t2 = g.add_node(OpKind::transpose, TransposeAttrs{{0, 2, 1, 3}}, {r2})[0];
    g.mark_output(
        g.add_node(back_reader_takes_strides ? OpKind::relu : OpKind::sigmoid, {}, {t2})[0]);
  }
  std::vector<LayoutView> plan() const {
    std::vector<bool> eligible(g.values().size(), false);
    std::vector<Shape> stored(g.values().size());
    for (ValueId v : {o, t1, rows, r2, t2}) {
      stored[size_t(v)] = contiguous_strides(g.value(v).type.shape);
      eligible[size_t(v)] = v != o;
    }
    return runtime::plan_layout_views(g, eligible, stored, takes_as_cuda);  // sigmoid: planned
  }
};

TEST(LayoutViews, ChainsPastAStoredCopyAreViewsOfTheCopy) {
  const RowsAndBack c(/*back_reader_takes_strides=*/true);
  const std::vector<LayoutView> plan = c.plan();
  EXPECT_EQ(plan[size_t(c.t1)].kind, Kind::view);  // the rows are copied from O's view
  EXPECT_EQ(plan[size_t(c.t1)].root, c.o);
  EXPECT_EQ(plan[size_t(c.rows)].kind, Kind::copy);
  ASSERT_EQ(plan[size_t(c.r2)].kind, Kind::view);
  EXPECT_EQ(plan[size_t(c.r2)].root, c.rows);
  ASSERT_EQ(plan[size_t(c.t2)].kind, Kind::view);
  EXPECT_EQ(plan[size_t(c.t2)].root, c.rows);  // not O: O dies with the rows' copy
  EXPECT_EQ(plan[size_t(c.t2)].offset, 0);
  EXPECT_EQ(plan[size_t(c.t2)].strides, (Shape{60, 4, 12, 1}));  // [B, H, T, d] over [B*T, H*d]
}

TEST(LayoutViews, AChainPastACopyStaysOnItsRootWhereTheCopyWouldCostACopy) {
  // The reader takes only O's stored order: O's own identity view is that, the rows' is not.
  const RowsAndBack c(/*back_reader_takes_strides=*/false);
  const std::vector<LayoutView> plan = c.plan();
  EXPECT_EQ(plan[size_t(c.rows)].kind, Kind::copy);
  ASSERT_EQ(plan[size_t(c.t2)].kind, Kind::view);
  EXPECT_EQ(plan[size_t(c.t2)].root, c.o);
  EXPECT_EQ(plan[size_t(c.t2)].strides, (Shape{60, 20, 4, 1}));
}

}  // namespace
}  // namespace fusebox::testing
