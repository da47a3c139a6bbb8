// VJP rules for the shape and data-movement ops. Each moves dy back to where the
// forward op read its elements.
#include "vjp.h"

namespace fusebox::autodiff {

// reshape, flatten, squeeze, unsqueeze: the same elements in the same order.
Grads vjp_reshape(VjpArgs& a) {
  return {a.e.reshape(a.dy[0], a.e.shape(a.input(0)))};
}

Grads vjp_transpose(VjpArgs& a) {
  // Output dim i is input dim perm[i], so input dim perm[i] comes back from dim i.
  const std::vector<int64_t>& perm = std::get<TransposeAttrs>(a.node.attrs).perm;
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[size_t(perm[i])] = int64_t(i);
  return {a.e.transpose(a.dy[0], inverse)};
}

// concat: input i's gradient is dy's slab [offset, offset + extent) along the axis.
Grads vjp_concat(VjpArgs& a) {
  Emitter& e = a.e;
  const int64_t axis = std::get<ConcatAttrs>(a.node.attrs).axis;  // normalised
  Grads out(a.node.inputs.size(), kNoValue);
  int64_t offset = 0;
  for (size_t i = 0; i < a.node.inputs.size(); ++i) {
    const int64_t extent = e.shape(a.input(i))[size_t(axis)];
    if (a.needs_input(i)) {
      if (a.node.inputs.size() == 1) {
        out[i] = a.dy[0];
      } else {
        SliceAttrs s{{offset}, {offset + extent}, {axis}, {1}, /*normalized=*/true};
        out[i] = e.op1(OpKind::slice, s, {a.dy[0]}, cat("d", i));
      }
    }
    offset += extent;
  }
  return out;
}

Grads vjp_slice(VjpArgs& a) {
  SliceBackwardAttrs s{std::get<SliceAttrs>(a.node.attrs), a.e.shape(a.input(0))};
  return {a.e.op1(OpKind::slice_backward, s, {a.dy[0]}, "dx")};
}

// resize: each dy element goes back to the forward's taps with their weights.
Grads vjp_resize(VjpArgs& a) {
  const ResizeBackwardAttrs r{std::get<ResizeAttrs>(a.node.attrs), a.e.shape(a.input(0))};
  return {a.e.op1(OpKind::resize_backward, r, {a.dy[0]}, "dx")};
}

// gather, gather_elements: ddata adds dy back where each index read; the indices
// (integers) get none.
Grads vjp_gather(VjpArgs& a) {
  Grads out(2, kNoValue);
  if (a.needs_input(0)) {
    GatherBackwardAttrs g{std::get<GatherAttrs>(a.node.attrs), a.e.shape(a.input(0))};
    const OpKind back =
        a.node.op == OpKind::gather ? OpKind::gather_backward : OpKind::gather_elements_backward;
    out[0] = a.e.op1(back, g, {a.dy[0], a.input(1)}, "ddata");
  }
  return out;
}

// top_k: the values are gather_elements(x, indices) along the axis, so dx adds each dvalue
// back where its index read (the indices output has no gradient).
Grads vjp_top_k(VjpArgs& a) {
  const TopKAttrs& t = std::get<TopKAttrs>(a.node.attrs);
  a.expect_gradient_only_on_first(1, "but top_k's indices have no gradient rule");
  const GatherBackwardAttrs g{GatherAttrs{t.axis}, a.e.shape(a.input(0))};
  return {a.e.op1(OpKind::gather_elements_backward, g, {a.dy[0], a.output(1)}, "dx")};
}

// pad: constant mode copies x into the interior, so dx is dy cropped by the same pads
// (a pad by the negated pads: what was padded is cropped and what was cropped comes
// back as zeros). reflect and edge also copy x's elements into the border, which
// pad_backward adds back.
Grads vjp_pad(VjpArgs& a) {
  Emitter& e = a.e;
  const PadAttrs& p = std::get<PadAttrs>(a.node.attrs);
  if (p.mode == PadMode::constant) {
    PadAttrs crop{p.pads, PadMode::constant, 0.0};
    for (int64_t& v : crop.pads) v = -v;
    return {e.op1(OpKind::pad, crop, {a.dy[0]}, "dx")};
  }
  return {e.op1(OpKind::pad_backward, PadBackwardAttrs{p, e.shape(a.input(0))}, {a.dy[0]}, "dx")};
}

// Only float -> float casts carry a gradient (integers are never differentiated).
Grads vjp_cast(VjpArgs& a) {
  const ValueId dy = a.dy[0], x = a.input(0);
  if (a.e.dtype(dy) == a.e.dtype(x)) return {dy};
  return {a.e.op1(OpKind::cast, CastAttrs{a.e.dtype(x)}, {dy}, "dx")};
}

Grads vjp_expand(VjpArgs& a) {
  return {a.e.sum_to_shape(a.dy[0], a.e.shape(a.input(0)))};
}

}  // namespace fusebox::autodiff
