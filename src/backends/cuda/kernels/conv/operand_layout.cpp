#include "backends/cuda/kernels/conv/operand_layout.h"

namespace fusebox::cuda {

const ConvAttrs& conv_attrs_of(const Node& n) {
  if (const auto* a = std::get_if<ConvAttrs>(&n.attrs)) return *a;
  if (const auto* a = std::get_if<ConvBackwardDataAttrs>(&n.attrs)) return a->conv;
  return std::get<ConvBackwardFilterAttrs>(n.attrs).conv;
}

ConvRoles conv_roles(ConvOp op, Inputs in, const DeviceTensor& out) {
  switch (op) {
    case ConvOp::fprop:
      return {in[0], in[1], &out};
    case ConvOp::dgrad:
      return {&out, in[1], in[0]};
    default:
      return {in[0], &out, in[1]};
  }
}

ConvGeometry conv_geometry_of(const Node& n, ConvOp op, Inputs in, const DeviceTensor& out) {
  const ConvRoles r = conv_roles(op, in, out);
  return make_conv_geometry(conv_attrs_of(n), r.x->shape, r.w->shape, r.y->shape, node_label(n));
}

ActivationFn activation_fn(const FusedActivation& a) {
  return {uint8_t(a.kind), a.min, a.max};
}

const DeviceTensor& channels_last_operand(Context& ctx, const DeviceTensor& t,
                                          std::vector<DeviceTensor>& keep) {
  if (t.is_channels_last()) return t;
  FUSEBOX_CHECK(keep.size() < keep.capacity(), "cuda", "channels_last_operand: keep is full");
  keep.push_back(temporary_tensor(ctx, t.dtype, t.shape, MemoryFormat::channels_last));
  copy_strided(ctx, t, keep.back());
  return keep.back();
}

const DeviceTensor& contiguous_operand(Context& ctx, const DeviceTensor& t,
                                       std::vector<DeviceTensor>& keep) {
  if (t.is_contiguous()) return t;
  FUSEBOX_CHECK(keep.size() < keep.capacity(), "cuda", "contiguous_operand: keep is full");
  keep.push_back(temporary_tensor(ctx, t.dtype, t.shape));
  copy_strided(ctx, t, keep.back());
  return keep.back();
}

bool aligned16(const DeviceTensor* t) {
  return t == nullptr || reinterpret_cast<uintptr_t>(t->data()) % 16 == 0;
}

}  // namespace fusebox::cuda
