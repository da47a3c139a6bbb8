// Shape arithmetic against overflow (issue 38): every op of the op table, on its tiny example
// (tests/op_examples.h) with dims scaled to extents near 2^31, 2^32, 2^62 and 2^63, alone and
// together (products that pass 2^63 or wrap 2^64). Graph::add_node infers the node's outputs:
// it must either refuse with a fusebox::Error or give outputs within the bytes one tensor may
// hold (kMaxTensorBytes, core/memory.h), so their counts and byte sizes cannot wrap. A wrapped
// count is how a model reaches a kernel with a buffer far smaller than its shape (a crash, or
// memory contents in the outputs).
#include <set>
#include <string>
#include <vector>

#include "fusebox/core/memory.h"
#include "op_examples.h"
#include "testing.h"

namespace fusebox::testing {
namespace {

constexpr int64_t k2_31 = int64_t(1) << 31, k2_32 = int64_t(1) << 32, k2_62 = int64_t(1) << 62;
constexpr int64_t kHugeExtents[] = {k2_31 - 1, k2_31,     k2_31 + 1, k2_32 - 1,
                                    k2_32,     k2_32 + 1, k2_62,     INT64_MAX};

// One way to make an example huge: every extent in `from` (as it appears in the inputs'
// shapes and in the attributes that hold shapes) becomes `to`; with `pads`, every padding
// of the attributes becomes `to` too.
struct Scaling {
  std::set<int64_t> from;
  int64_t to = 0;
  bool pads = false;
};

std::string describe(const Scaling& s) {
  std::string from;
  for (int64_t e : s.from) from += cat(from.empty() ? "" : ",", e);
  return cat("extents {", from, "} -> ", s.to, s.pads ? ", pads -> " : "", s.pads ? cat(s.to) : "");
}

void scale(std::vector<int64_t>& dims, const Scaling& s) {
  for (int64_t& d : dims)
    if (s.from.count(d)) d = s.to;
}

void scale_pads(std::vector<int64_t>& pads, const Scaling& s) {
  if (s.pads)
    for (int64_t& p : pads) p = s.to;
}

// The attributes that hold extents or paddings, scaled like the inputs.
void scale(Attrs& attrs, const Scaling& s) {
  std::visit(
      [&](auto& a) {
        using A = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<A, ExpandAttrs> || std::is_same_v<A, ReshapeAttrs>) {
          scale(a.shape, s);
        } else if constexpr (std::is_same_v<A, ResizeAttrs>) {
          scale(a.sizes, s);
        } else if constexpr (std::is_same_v<A, ResizeBackwardAttrs>) {
          scale(a.resize.sizes, s);
          scale(a.input_shape, s);
        } else if constexpr (std::is_same_v<A, PadAttrs>) {
          scale_pads(a.pads, s);
          if (s.pads) a.mode = PadMode::constant;  // reflect needs pads below the extent
        } else if constexpr (std::is_same_v<A, PadBackwardAttrs>) {
          scale_pads(a.pad.pads, s);
          if (s.pads) a.pad.mode = PadMode::constant;
          scale(a.input_shape, s);
        } else if constexpr (std::is_same_v<A, ConvAttrs>) {
          scale_pads(a.pads_begin, s);
          scale_pads(a.pads_end, s);
        } else if constexpr (std::is_same_v<A, ConvBackwardDataAttrs>) {
          scale(a.input_spatial, s);
        } else if constexpr (std::is_same_v<A, ConvBackwardFilterAttrs>) {
          scale(a.filter_spatial, s);
        } else if constexpr (std::is_same_v<A, PoolAttrs>) {
          scale_pads(a.pads_begin, s);
          scale_pads(a.pads_end, s);
        } else if constexpr (std::is_same_v<A, PoolBackwardAttrs>) {
          scale(a.input_shape, s);
        } else if constexpr (std::is_same_v<A, SliceBackwardAttrs>) {
          scale(a.input_shape, s);
        } else if constexpr (std::is_same_v<A, GatherBackwardAttrs>) {
          scale(a.data_shape, s);
        }
      },
      attrs);
}

bool has_pads(const Attrs& attrs) {
  return std::holds_alternative<PadAttrs>(attrs) ||
         std::holds_alternative<PadBackwardAttrs>(attrs) ||
         std::holds_alternative<ConvAttrs>(attrs) || std::holds_alternative<PoolAttrs>(attrs);
}

// The scalings tried on `example`: each extent above 1 of its inputs alone, all of them
// together, and (for ops with paddings) the paddings; each to every huge extent.
std::vector<Scaling> scalings(const OpExample& example) {
  std::set<int64_t> extents;
  for (const Tensor& t : example.inputs)
    if (t.defined())
      for (int64_t d : t.shape())
        if (d > 1) extents.insert(d);
  std::vector<Scaling> out;
  for (int64_t to : kHugeExtents) {
    for (int64_t e : extents) out.push_back({{e}, to});
    if (extents.size() > 1) out.push_back({extents, to});
    if (has_pads(example.attrs)) out.push_back({{}, to, true});
  }
  return out;
}

// What add_node made of the scaled example: "" when it refused with an Error or every
// output is within kMaxTensorBytes; otherwise what is wrong.
std::string outcome(OpKind op, const OpExample& example, const Scaling& s) {
  Graph g("shape_arithmetic");
  try {
    std::vector<ValueId> inputs;
    for (size_t i = 0; i < example.inputs.size(); ++i) {
      const Tensor& t = example.inputs[i];
      if (!t.defined()) {
        inputs.push_back(kNoValue);
        continue;
      }
      Shape shape = t.shape();
      scale(shape, s);
      inputs.push_back(g.add_input(cat("in", i), t.dtype(), shape));
    }
    Attrs attrs = example.attrs;
    scale(attrs, s);
    std::string wrong;
    for (ValueId v : g.add_node(op, attrs, inputs, "node")) {
      const TensorType& type = g.value(v).type;
      if (!checked_tensor_size(type.shape, dtype_size(type.dtype)))
        wrong += cat(" output ", dtype_name(type.dtype), shape_str(type.shape),
                     " is past the bytes one tensor may hold;");
    }
    return wrong;
  } catch (const Error&) {
    return "";
  } catch (const std::exception& e) {
    return cat(" threw a non-fusebox exception: ", e.what());
  }
}

class ShapeArithmetic : public ::testing::TestWithParam<OpKind> {};

TEST_P(ShapeArithmetic, HugeExtentsAreRefusedOrFit) {
  const std::optional<OpExample> example = tiny_example(GetParam());
  ASSERT_TRUE(example) << "no tiny example for " << op_name(GetParam());
  int failures = 0;
  for (const Scaling& s : scalings(*example)) {
    const std::string wrong = outcome(GetParam(), *example, s);
    // The first few cases of an op say what is wrong; the count says how often.
    if (!wrong.empty() && ++failures <= 3) ADD_FAILURE() << describe(s) << ":" << wrong;
  }
  EXPECT_EQ(failures, 0) << "scaled examples of " << op_name(GetParam())
                         << " with outputs past kMaxTensorBytes";
}

INSTANTIATE_TEST_SUITE_P(EveryOp, ShapeArithmetic, ::testing::ValuesIn(every_op()),
                         [](const ::testing::TestParamInfo<OpKind>& p) {
                           return std::string(op_name(p.param));
                         });

}  // namespace
}  // namespace fusebox::testing
