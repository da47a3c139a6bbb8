// VJP rules for the windowed ops: convolution, transposed convolution and pooling.
// Every gradient comes from the backward ops, given the extents they must produce
// (never guessed from the output's shape, which several inputs can share).
#include "vjp.h"

namespace fusebox::autodiff {
namespace {

Shape spatial_of(const Shape& s) {
  return Shape(s.begin() + 2, s.end());
}

}  // namespace

// conv: y = conv(x, w) + bias.
//   dx    = conv_backward_data(dy, w)    with input_spatial = x's spatial extents
//   dw    = conv_backward_filter(x, dy)  with filter_spatial = w's spatial extents
//   dbias = sum of dy over N and the spatial dims
Grads vjp_conv(VjpArgs& a) {
  Emitter& e = a.e;
  const ConvAttrs& conv = std::get<ConvAttrs>(a.node.attrs);
  // Epilogues are fused into inference graphs only (after autodiff, or with no autodiff).
  FUSEBOX_CHECK(!conv.activation && !conv.residual_activation && !conv.channel_stats &&
                    a.node.inputs.size() < 4,
                node_label(a.node),
                "a conv with a fused epilogue (activation, residual or channel_stats) has no "
                "gradient rule: "
                "differentiate the unfused graph (passes/fusion.h)");
  const ValueId dy = a.dy[0], x = a.input(0), w = a.input(1);
  Grads out(a.node.inputs.size(), kNoValue);
  if (a.needs_input(0)) {
    out[0] = e.op1(OpKind::conv_backward_data, ConvBackwardDataAttrs{conv, spatial_of(e.shape(x))},
                   {dy, w}, "dx");
  }
  if (a.needs_input(1)) {
    out[1] = e.op1(OpKind::conv_backward_filter,
                   ConvBackwardFilterAttrs{conv, spatial_of(e.shape(w))}, {x, dy}, "dw");
  }
  if (a.needs_input(2)) out[2] = e.sum_per_channel(dy);
  return out;
}

// conv_backward_data (transposed convolution): z = T(u, w) + bias, where T(., w) is the
// adjoint of x -> conv(x, w): <conv(x, w), u> = <x, T(u, w)>. For the incoming G = dz:
//   du    = conv(G, w)                    (the adjoint of the adjoint)
//   dw    = conv_backward_filter(G, u)    (<G, T(u, w)> = <conv(G, w), u>, and the
//                                          gradient of that in w is the filter gradient
//                                          with x := G and dy := u)
//   dbias = sum of G over N and the spatial dims
Grads vjp_conv_backward_data(VjpArgs& a) {
  Emitter& e = a.e;
  const ConvBackwardDataAttrs& t = std::get<ConvBackwardDataAttrs>(a.node.attrs);
  const ValueId G = a.dy[0], u = a.input(0), w = a.input(1);
  Grads out(a.node.inputs.size(), kNoValue);
  if (a.needs_input(0)) out[0] = e.op1(OpKind::conv, t.conv, {G, w}, "ddy");
  if (a.needs_input(1)) {
    out[1] = e.op1(OpKind::conv_backward_filter,
                   ConvBackwardFilterAttrs{t.conv, spatial_of(e.shape(w))}, {G, u}, "dw");
  }
  if (a.needs_input(2)) out[2] = e.sum_per_channel(G);
  return out;
}

// max_pool: max_pool_backward(dy, x) (the indices output is integer: no gradient).
// avg_pool: avg_pool_backward(dy).
Grads vjp_pool(VjpArgs& a) {
  Emitter& e = a.e;
  const ValueId x = a.input(0);
  PoolBackwardAttrs b{std::get<PoolAttrs>(a.node.attrs), e.shape(x)};
  b.pool.return_indices = false;
  if (a.node.op == OpKind::max_pool)
    return {e.op1(OpKind::max_pool_backward, b, {a.dy[0], x}, "dx")};
  return {e.op1(OpKind::avg_pool_backward, b, {a.dy[0]}, "dx")};
}

// global_avg_pool: y = sum over the spatial dims / count, so dx = dy / count broadcast
// over them.
Grads vjp_global_avg_pool(VjpArgs& a) {
  Emitter& e = a.e;
  const Shape x_shape = e.shape(a.input(0));
  int64_t count = 1;
  for (size_t d = 2; d < x_shape.size(); ++d) count *= x_shape[d];
  return {e.expand(e.scale(a.dy[0], 1.0 / double(count)), x_shape)};
}

}  // namespace fusebox::autodiff
