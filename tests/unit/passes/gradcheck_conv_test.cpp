// Gradient checks for the windowed ops: conv (1-3 spatial dims, groups, depthwise,
// dilation, strides with uneven pads, bias), transposed conv (conv_backward_data with
// output padding), max_pool / avg_pool (every option) and global_avg_pool.
#include <sstream>

#include "gradcheck.h"

namespace fusebox::testing::gradcheck {
namespace {

struct ConvCase {
  Shape x, w;
  ConvAttrs attrs;
  bool bias = false;
  std::string str() const {
    std::ostringstream os;
    os << "x " << shape_str(x) << " w " << shape_str(w) << " groups " << attrs.groups << " strides "
       << shape_str(attrs.strides) << " dilations " << shape_str(attrs.dilations) << " pads "
       << shape_str(attrs.pads_begin) << shape_str(attrs.pads_end) << (bias ? " +bias" : "");
    return os.str();
  }
};

enum class Grouping { one, two, three, depthwise };

ConvCase random_conv(std::mt19937_64& rng, int spatial, Grouping grouping) {
  ConvCase c;
  int64_t groups = 1, per_group_in = pick(rng, 1, 3), per_group_out = pick(rng, 1, 2);
  switch (grouping) {
    case Grouping::one:
      break;
    case Grouping::two:
      groups = 2;
      break;
    case Grouping::three:
      groups = 3;
      break;
    case Grouping::depthwise:
      groups = pick(rng, 2, 4);
      per_group_in = 1;
      break;
  }
  c.attrs.groups = groups;
  c.x = {pick(rng, 1, 2), groups * per_group_in};
  c.w = {groups * per_group_out, per_group_in};
  const int64_t max_kernel = spatial == 3 ? 2 : 3;
  for (int d = 0; d < spatial; ++d) {
    const int64_t r = pick(rng, 1, max_kernel), stride = pick(rng, 1, 3), dil = pick(rng, 1, 2),
                  pb = pick(rng, 0, 2), pe = pick(rng, 0, 2);
    const int64_t reach = dil * (r - 1) + 1;
    c.x.push_back(std::max<int64_t>(1, reach - pb - pe) + pick(rng, 0, spatial == 3 ? 2 : 4));
    c.w.push_back(r);
    c.attrs.strides.push_back(stride);
    c.attrs.dilations.push_back(dil);
    c.attrs.pads_begin.push_back(pb);
    c.attrs.pads_end.push_back(pe);
  }
  c.bias = coin(rng);
  return c;
}

void check_conv(const ConvCase& c, uint64_t seed) {
  std::vector<Leaf> leaves = {input("x", c.x, seed), param("w", c.w, seed + 1)};
  if (c.bias) leaves.push_back(param("b", {c.w[0]}, seed + 2));
  const ConvAttrs attrs = c.attrs;
  const bool bias = c.bias;
  Forward f = [attrs, bias](Builder& b, const std::vector<ValueId>& v) {
    return std::vector<ValueId>{b.conv(v[0], v[1], bias ? v[2] : kNoValue, attrs)};
  };
  EXPECT_TRUE(check_gradients(leaves, f, {"conv", c.str(), {}, 48, seed}));
}

TEST(GradCheckConv, RandomConv2d) {
  std::mt19937_64 rng(101);
  const Grouping kinds[] = {Grouping::one, Grouping::two, Grouping::three, Grouping::depthwise};
  for (int trial = 0; trial < 8; ++trial) {
    const ConvCase c = random_conv(rng, 2, kinds[trial % 4]);
    SCOPED_TRACE(c.str());
    check_conv(c, 1000 + trial);
  }
}

TEST(GradCheckConv, RandomConv1dAnd3d) {
  std::mt19937_64 rng(102);
  for (int trial = 0; trial < 4; ++trial) {
    const ConvCase c = random_conv(rng, 1, trial % 2 ? Grouping::two : Grouping::one);
    SCOPED_TRACE(c.str());
    check_conv(c, 2000 + trial);
  }
  for (int trial = 0; trial < 3; ++trial) {
    const ConvCase c = random_conv(rng, 3, trial == 2 ? Grouping::depthwise : Grouping::one);
    SCOPED_TRACE(c.str());
    check_conv(c, 2100 + trial);
  }
}

// Fixed cases for the geometry that random draws may miss: depthwise with stride 2
// over an odd extent and uneven pads; dilation 2 with stride 3, whose windows skip
// rows.
TEST(GradCheckConv, FixedGeometry) {
  ConvCase depthwise{{2, 4, 7, 6}, {4, 1, 3, 3}, {{2, 2}, {1, 1}, {1, 0}, {0, 1}, 4}, true};
  check_conv(depthwise, 3000);
  ConvCase dilated{{1, 2, 9, 8}, {3, 2, 2, 3}, {{3, 2}, {2, 2}, {0, 2}, {1, 0}, 1}, false};
  check_conv(dilated, 3001);
}

// Transposed convolution: conv_backward_data as a forward op, with output padding
// (D = (O-1)*stride - pb - pe + dil*(R-1) + 1 + output_padding, output_padding < stride).
TEST(GradCheckConv, TransposedConv) {
  std::mt19937_64 rng(103);
  int done = 0;
  for (int trial = 0; done < 8; ++trial) {
    const int spatial = trial % 4 == 3 ? 1 : 2;
    const int64_t groups = pick(rng, 1, 2);
    const int64_t per_group_in = pick(rng, 1, 2), per_group_out = pick(rng, 1, 2);
    Shape u = {pick(rng, 1, 2), groups * per_group_out};
    Shape w = {groups * per_group_out, per_group_in};
    ConvBackwardDataAttrs attrs;
    attrs.conv.groups = groups;
    bool valid = true;
    for (int d = 0; d < spatial; ++d) {
      const int64_t r = pick(rng, 1, 3), stride = pick(rng, 1, 3), dil = pick(rng, 1, 2),
                    pb = pick(rng, 0, 1), pe = pick(rng, 0, 1), o = pick(rng, 1, 4);
      const int64_t output_padding = pick(rng, 0, stride - 1);
      const int64_t extent = (o - 1) * stride - pb - pe + dil * (r - 1) + 1 + output_padding;
      valid = valid && extent >= 1;
      u.push_back(o);
      w.push_back(r);
      attrs.conv.strides.push_back(stride);
      attrs.conv.dilations.push_back(dil);
      attrs.conv.pads_begin.push_back(pb);
      attrs.conv.pads_end.push_back(pe);
      attrs.input_spatial.push_back(extent);
    }
    if (!valid) continue;
    const bool bias = coin(rng);
    const uint64_t seed = 4000 + uint64_t(trial);
    std::vector<Leaf> leaves = {input("u", u, seed), param("w", w, seed + 1)};
    if (bias) leaves.push_back(param("b", {groups * per_group_in}, seed + 2));
    const std::string config =
        cat("u ", shape_str(u), " w ", shape_str(w), " groups ", groups, " strides ",
            shape_str(attrs.conv.strides), " dilations ", shape_str(attrs.conv.dilations), " pads ",
            shape_str(attrs.conv.pads_begin), shape_str(attrs.conv.pads_end), " input_spatial ",
            shape_str(attrs.input_spatial), bias ? " +bias" : "");
    SCOPED_TRACE(config);
    Forward f = [attrs, bias](Builder& b, const std::vector<ValueId>& v) {
      return std::vector<ValueId>{b.conv_backward_data(v[0], v[1], attrs, bias ? v[2] : kNoValue)};
    };
    EXPECT_TRUE(check_gradients(leaves, f, {"conv_backward_data", config, {}, 48, seed}));
    ++done;
  }
}

// Pooling: 1-3 spatial dims, kernel/stride/dilation/pads, ceil_mode, count_include_pad,
// return_indices. Extents are at least the dilated kernel, so every window (padding
// below the kernel's reach) holds an element of x.
TEST(GradCheckPool, MaxAndAvgPool) {
  std::mt19937_64 rng(104);
  for (int trial = 0; trial < 16; ++trial) {
    const bool is_max = trial % 2 == 0;
    const int spatial = trial % 8 < 2 ? 1 : trial % 8 < 6 ? 2 : 3;
    Shape x = {pick(rng, 1, 2), pick(rng, 1, 3)};
    PoolAttrs a;
    for (int d = 0; d < spatial; ++d) {
      const int64_t k = pick(rng, 1, 3), stride = pick(rng, 1, 3),
                    dil = is_max ? pick(rng, 1, 2) : 1;
      const int64_t reach = dil * (k - 1) + 1;
      a.kernel.push_back(k);
      a.strides.push_back(stride);
      a.dilations.push_back(dil);
      a.pads_begin.push_back(pick(rng, 0, std::min<int64_t>(2, reach - 1)));
      a.pads_end.push_back(pick(rng, 0, std::min<int64_t>(2, reach - 1)));
      x.push_back(reach + pick(rng, 0, spatial == 3 ? 2 : 4));
    }
    a.ceil_mode = coin(rng);
    a.count_include_pad = !is_max && coin(rng);
    a.return_indices = is_max && coin(rng);
    const std::string config =
        cat(is_max ? "max_pool" : "avg_pool", " x ", shape_str(x), " kernel ", shape_str(a.kernel),
            " strides ", shape_str(a.strides), " dilations ", shape_str(a.dilations), " pads ",
            shape_str(a.pads_begin), shape_str(a.pads_end), a.ceil_mode ? " ceil" : "",
            a.count_include_pad ? " count_include_pad" : "", a.return_indices ? " indices" : "");
    SCOPED_TRACE(config);
    const OpKind op = is_max ? OpKind::max_pool : OpKind::avg_pool;
    Forward f = [a, op](Builder& b, const std::vector<ValueId>& v) {
      return std::vector<ValueId>{b.op(op, a, {v[0]}).at(0)};
    };
    const uint64_t seed = 5000 + uint64_t(trial);
    EXPECT_TRUE(check_gradients({input("x", x, seed)}, f, {op_name(op), config, {}, 64, seed}));
  }
}

TEST(GradCheckPool, GlobalAvgPool) {
  const Shape shapes[] = {{2, 3, 5}, {1, 2, 3, 4}, {2, 2, 2, 3, 2}};
  uint64_t seed = 5100;
  for (const Shape& x : shapes) {
    Forward f = [](Builder& b, const std::vector<ValueId>& v) {
      return std::vector<ValueId>{b.global_avg_pool(v[0])};
    };
    EXPECT_TRUE(
        check_gradients({input("x", x, seed)}, f, {"global_avg_pool", shape_str(x), {}, 48, seed}));
    ++seed;
  }
}

}  // namespace
}  // namespace fusebox::testing::gradcheck
