// Inference for the windowed ops: conv, conv_backward_data, conv_backward_filter,
// max_pool, avg_pool and global_avg_pool. A window sliding over one spatial dim
// of extent D gives
//   O = floor((D + pad_begin + pad_end - dilation*(R-1) - 1) / stride) + 1,
// which must be >= 1. Pool's ceil_mode rounds up instead, then drops a last
// window that would start in the end padding (ONNX / PyTorch). The backward ops
// are checked by running this forward rule on the extents they are given.
#include <cmath>
#include <limits>

#include "infer_common.h"

namespace fusebox::infer {
namespace {

constexpr int64_t kMaxSpatial = 3;

// Fills an empty per-spatial-dim attribute with `fill`, then checks its length
// and that every value is >= min_value.
void normalize_per_dim(const Context& c, std::vector<int64_t>& v, size_t spatial, int64_t fill,
                       int64_t min_value, const char* name) {
  if (v.empty()) v.assign(spatial, fill);
  FUSEBOX_INFER_CHECK(c, v.size() == spatial, name, " ", shape_str(v), " has ", v.size(),
                      " values but there are ", spatial, " spatial dims");
  for (int64_t x : v)
    FUSEBOX_INFER_CHECK(c, x >= min_value, name, " ", shape_str(v), " must all be >= ", min_value);
}

void normalize_conv_attrs(const Context& c, ConvAttrs& a, size_t spatial) {
  normalize_per_dim(c, a.strides, spatial, 1, 1, "strides");
  normalize_per_dim(c, a.dilations, spatial, 1, 1, "dilations");
  normalize_per_dim(c, a.pads_begin, spatial, 0, 0, "pads_begin");
  normalize_per_dim(c, a.pads_end, spatial, 0, 0, "pads_end");
  FUSEBOX_INFER_CHECK(c, a.groups >= 1, "groups ", a.groups, " must be >= 1");
}

// dilation * (kernel - 1) + 1: how far one window reaches.
int64_t dilated_kernel(const Context& c, int64_t kernel, int64_t dilation) {
  return c.add(c.mul(dilation, kernel - 1), 1);
}

// One spatial dim's window geometry; `source` names where the input extent
// comes from in messages ("x [1, 3, 5, 5]", "input_spatial [7, 7]").
struct Window {
  int64_t input, kernel, stride, dilation, pad_begin, pad_end;
};

int64_t window_output(const Context& c, const std::string& source, size_t dim, const Window& w,
                      bool ceil_mode = false) {
  const int64_t padded = c.add(c.add(w.input, w.pad_begin), w.pad_end);
  const int64_t reach = dilated_kernel(c, w.kernel, w.dilation);
  FUSEBOX_INFER_CHECK(c, padded >= reach, source, ": spatial dim ", dim, " padded to ", padded,
                      " (", w.input, " + ", w.pad_begin, " + ", w.pad_end,
                      ") is smaller than the dilated kernel ", reach, " (kernel ", w.kernel,
                      ", dilation ", w.dilation, "), so the output would be empty");
  int64_t last = (padded - reach) / w.stride;  // index of the last window
  if (ceil_mode && (padded - reach) % w.stride != 0) {
    ++last;
    if (c.mul(last, w.stride) >= c.add(w.input, w.pad_begin)) --last;  // starts in end padding
  }
  return last + 1;
}

Window conv_window(const ConvAttrs& a, size_t d, int64_t input, int64_t kernel) {
  return {input, kernel, a.strides[d], a.dilations[d], a.pads_begin[d], a.pads_end[d]};
}

// The conv output's spatial extents for input spatial `in` and kernel spatial `kernel`.
Shape conv_output_spatial(const Context& c, const ConvAttrs& a, const std::string& source,
                          const Shape& in, const Shape& kernel) {
  Shape out;
  for (size_t d = 0; d < in.size(); ++d)
    out.push_back(window_output(c, source, d, conv_window(a, d, in[d], kernel[d])));
  return out;
}

Shape spatial_of(const Shape& s) {
  return Shape(s.begin() + 2, s.end());
}

void expect_no_zero_extent(const Context& c, int i) {
  for (int64_t d : c.shape(i)) FUSEBOX_INFER_CHECK(c, d >= 1, c.shaped(i), " has a zero extent");
}

// The weight input: [K, C/groups, R...] with 1 to 3 spatial dims, no zero extent.
void expect_weight(const Context& c, int w) {
  c.expect_rank_between(w, 3, 2 + kMaxSpatial, "[K, C/groups, R...] with 1 to 3 spatial dims");
  expect_no_zero_extent(c, w);
}

// Input i must have the same rank as input `ref` (same spatial rank).
void expect_same_spatial_rank(const Context& c, int i, const char* layout, int ref) {
  FUSEBOX_INFER_CHECK(c, c.rank(i) == c.rank(ref), c.shaped(i), " must be ", layout, " with ",
                      c.rank(ref) - 2, " spatial dim", c.rank(ref) == 3 ? "" : "s", " to match ",
                      c.shaped(ref));
}

void expect_groups_divide(const Context& c, int64_t channels, const char* what, int i,
                          int64_t groups) {
  FUSEBOX_INFER_CHECK(c, channels % groups == 0, c.role(i), " has ", channels, " ", what,
                      ", which groups ", groups, " does not divide (", c.shaped(i), ")");
}

// A fused epilogue activation: clip bounds ordered and not NaN.
// The backward ops carry the forward's geometry only: an epilogue there is a bug.
void expect_no_epilogue(const Context& c, const ConvAttrs& a) {
  FUSEBOX_INFER_CHECK(c, !a.activation && !a.residual_activation,
                      "a fused activation is a forward conv's epilogue only (got activation ",
                      activation_name(a.activation.kind), ", residual_activation ",
                      activation_name(a.residual_activation.kind), ")");
  FUSEBOX_INFER_CHECK(c, !a.channel_stats, "channel_stats is a forward conv's output only");
}

}  // namespace

// conv: x [N, C, D...], w [K, C/groups, R...], bias [K]?, residual [N, K, O...]?
//   -> y [N, K, O...]
Types infer_conv(Context& c) {
  ConvAttrs& a = c.attrs<ConvAttrs>();
  c.expect_float(0);
  c.expect_same_dtype(1, 0);
  expect_weight(c, 1);
  expect_same_spatial_rank(c, 0, "[N, C, D...]", 1);
  const Shape& x = c.shape(0);
  const Shape& w = c.shape(1);
  normalize_conv_attrs(c, a, w.size() - 2);

  // As PyTorch: a batch of 0 gives an empty y, but a window over an empty image (padding
  // alone) has nothing to convolve.
  for (size_t d = 2; d < x.size(); ++d)
    FUSEBOX_INFER_CHECK(c, x[d] >= 1, c.shaped(0),
                        " has an empty spatial dim: no pixel to convolve");
  const int64_t C = x[1], K = w[0], g = a.groups;
  expect_groups_divide(c, C, "channels", 0, g);
  expect_groups_divide(c, K, "output channels (K)", 1, g);
  FUSEBOX_INFER_CHECK(c, C == c.mul(w[1], g), "x has ", C, " channels but w expects ",
                      c.mul(w[1], g), " (w ", shape_str(w), ", groups ", g, ")");
  if (c.has(2)) {
    c.expect_same_dtype(2, 0);
    c.expect_shape(2, {K}, "([K], one per output channel)");
  }
  Shape y = {x[0], K};
  for (int64_t o : conv_output_spatial(c, a, c.shaped(0), spatial_of(x), spatial_of(w)))
    y.push_back(o);
  expect_activation(c, a.activation, "activation");
  expect_activation(c, a.residual_activation, "residual_activation");
  if (c.has(3)) {
    c.expect_same_dtype(3, 0);
    c.expect_shape(3, y, "(the output's shape: a fused residual add)");
  } else {
    FUSEBOX_INFER_CHECK(c, !a.residual_activation, "residual_activation ",
                        activation_name(a.residual_activation.kind), " without a residual input");
  }
  if (a.channel_stats) return {{c.dtype(0), y}, {DType::f64, {K, 3}}};
  return {{c.dtype(0), y}};
}

// conv_backward_data: dy [N, K, O...], w [K, C/groups, R...], bias [C]? -> dx [N, C, D...]
// with D = input_spatial, which must give O back through the forward rule.
Types infer_conv_backward_data(Context& c) {
  ConvBackwardDataAttrs& a = c.attrs<ConvBackwardDataAttrs>();
  c.expect_float(0);
  c.expect_same_dtype(1, 0);
  expect_weight(c, 1);
  expect_same_spatial_rank(c, 0, "[N, K, O...]", 1);
  const Shape& dy = c.shape(0);
  const Shape& w = c.shape(1);
  const size_t spatial = w.size() - 2;
  normalize_conv_attrs(c, a.conv, spatial);
  expect_no_epilogue(c, a.conv);
  FUSEBOX_INFER_CHECK(c, a.input_spatial.size() == spatial, "input_spatial ",
                      shape_str(a.input_spatial), " has ", a.input_spatial.size(), " values but w ",
                      shape_str(w), " has ", spatial, " spatial dims");
  for (int64_t d : a.input_spatial)
    FUSEBOX_INFER_CHECK(c, d >= 1, "input_spatial ", shape_str(a.input_spatial),
                        " must all be >= 1");

  const int64_t K = w[0], g = a.conv.groups;
  expect_groups_divide(c, K, "output channels (K)", 1, g);
  FUSEBOX_INFER_CHECK(c, dy[1] == K, "dy has ", dy[1], " channels but w has K = ", K, " (dy ",
                      shape_str(dy), ", w ", shape_str(w), ")");
  const int64_t C = c.mul(w[1], g);
  const Shape forward = conv_output_spatial(
      c, a.conv, cat("input_spatial ", shape_str(a.input_spatial)), a.input_spatial, spatial_of(w));
  FUSEBOX_INFER_CHECK(
      c, forward == spatial_of(dy), "input_spatial ", shape_str(a.input_spatial),
      " gives a forward conv output of ", shape_str(forward), " but dy ", shape_str(dy),
      " has spatial ", shape_str(spatial_of(dy)),
      " (a transposed convolution's output_padding must be smaller than its stride)");
  if (c.has(2)) {
    c.expect_same_dtype(2, 0);
    c.expect_shape(2, {C}, "([C], one per input channel of the forward conv)");
  }
  Shape dx = {dy[0], C};
  for (int64_t d : a.input_spatial) dx.push_back(d);
  return {{c.dtype(0), dx}};
}

// conv_backward_filter: x [N, C, D...], dy [N, K, O...] -> dw [K, C/groups, R...] with
// R = filter_spatial, where conv(x, R) must give dy's O.
Types infer_conv_backward_filter(Context& c) {
  ConvBackwardFilterAttrs& a = c.attrs<ConvBackwardFilterAttrs>();
  c.expect_float(0);
  c.expect_same_dtype(1, 0);
  c.expect_rank_between(0, 3, 2 + kMaxSpatial, "[N, C, D...] with 1 to 3 spatial dims");
  expect_same_spatial_rank(c, 1, "[N, K, O...]", 0);
  const Shape& x = c.shape(0);
  const Shape& dy = c.shape(1);
  const size_t spatial = x.size() - 2;
  normalize_conv_attrs(c, a.conv, spatial);
  expect_no_epilogue(c, a.conv);
  FUSEBOX_INFER_CHECK(c, a.filter_spatial.size() == spatial, "filter_spatial ",
                      shape_str(a.filter_spatial), " has ", a.filter_spatial.size(),
                      " values but x ", shape_str(x), " has ", spatial, " spatial dims");
  for (int64_t r : a.filter_spatial)
    FUSEBOX_INFER_CHECK(c, r >= 1, "filter_spatial ", shape_str(a.filter_spatial),
                        " must all be >= 1");

  const int64_t C = x[1], K = dy[1], g = a.conv.groups;
  FUSEBOX_INFER_CHECK(c, dy[0] == x[0], "dy has batch ", dy[0], " but x has batch ", x[0], " (x ",
                      shape_str(x), ", dy ", shape_str(dy), ")");
  FUSEBOX_INFER_CHECK(c, C >= 1 && K >= 1, "x ", shape_str(x), " and dy ", shape_str(dy),
                      " must have at least one channel each");
  expect_groups_divide(c, C, "channels", 0, g);
  expect_groups_divide(c, K, "channels (K)", 1, g);
  const Shape forward =
      conv_output_spatial(c, a.conv, c.shaped(0), spatial_of(x), a.filter_spatial);
  FUSEBOX_INFER_CHECK(c, forward == spatial_of(dy), "dy ", shape_str(dy), " has spatial ",
                      shape_str(spatial_of(dy)), " but conv(x ", shape_str(x), ", filter_spatial ",
                      shape_str(a.filter_spatial), ") gives ", shape_str(forward));
  Shape dw = {K, C / g};
  for (int64_t r : a.filter_spatial) dw.push_back(r);
  return {{c.dtype(0), dw}};
}

// max_pool / avg_pool: x [N, C, D...] -> y [N, C, O...] (+ i64 indices for max_pool
// with return_indices).
Types infer_pool(Context& c) {
  PoolAttrs& a = c.attrs<PoolAttrs>();
  const bool is_max = c.op() == OpKind::max_pool;
  c.expect_float(0);
  c.expect_rank_between(0, 3, 2 + kMaxSpatial, "[N, C, D...] with 1 to 3 spatial dims");
  const Shape& x = c.shape(0);
  const size_t spatial = x.size() - 2;
  for (size_t d = 2; d < x.size(); ++d)
    FUSEBOX_INFER_CHECK(c, x[d] >= 1, "x ", shape_str(x),
                        " has an empty spatial dim: no window to pool");
  FUSEBOX_INFER_CHECK(c, !a.kernel.empty(), "kernel must be given (", spatial,
                      " values, one per spatial dim)");
  normalize_per_dim(c, a.kernel, spatial, 1, 1, "kernel");
  normalize_per_dim(c, a.strides, spatial, 1, 1, "strides");
  normalize_per_dim(c, a.dilations, spatial, 1, 1, "dilations");
  normalize_per_dim(c, a.pads_begin, spatial, 0, 0, "pads_begin");
  normalize_per_dim(c, a.pads_end, spatial, 0, 0, "pads_end");
  if (!is_max) {
    for (int64_t d : a.dilations)
      FUSEBOX_INFER_CHECK(c, d == 1, "avg_pool takes no dilation but dilations is ",
                          shape_str(a.dilations));
    FUSEBOX_INFER_CHECK(c, !a.return_indices, "return_indices is for max_pool only");
  }

  Shape y = {x[0], x[1]};
  for (size_t d = 0; d < spatial; ++d) {
    const Window w{x[2 + d],       a.kernel[d],     a.strides[d],
                   a.dilations[d], a.pads_begin[d], a.pads_end[d]};
    // A pad as wide as the window would make a window of padding only (max of
    // nothing, average over nothing).
    const int64_t reach = dilated_kernel(c, w.kernel, w.dilation);
    FUSEBOX_INFER_CHECK(c, w.pad_begin < reach && w.pad_end < reach, "pads_begin ",
                        shape_str(a.pads_begin), " and pads_end ", shape_str(a.pads_end),
                        " must be smaller than the dilated kernel (", reach, " in spatial dim ", d,
                        ")");
    y.push_back(window_output(c, c.shaped(0), d, w, a.ceil_mode));
  }
  Types out = {{c.dtype(0), y}};
  if (is_max && a.return_indices) out.push_back({DType::i64, y});
  return out;
}

// global_avg_pool: x [N, C, D...] -> [N, C, 1...]
Types infer_global_avg_pool(Context& c) {
  c.expect_float(0);
  c.expect_rank_between(0, 3, std::numeric_limits<int64_t>::max(), "[N, C, D...]");
  for (size_t d = 2; d < c.shape(0).size(); ++d)
    FUSEBOX_INFER_CHECK(c, c.shape(0)[d] >= 1, c.shaped(0),
                        " has an empty spatial dim: nothing to average");
  Shape y(c.shape(0).size(), 1);
  y[0] = c.shape(0)[0];
  y[1] = c.shape(0)[1];
  return {{c.dtype(0), y}};
}

}  // namespace fusebox::infer
