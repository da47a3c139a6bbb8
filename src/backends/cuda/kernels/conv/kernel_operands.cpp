#include "backends/cuda/kernels/conv/kernel_operands.h"

#include "backends/cuda/kernels/conv/engines/implicit_gemm/plan.h"
#include "backends/cuda/kernels/conv/operand_layout.h"

namespace fusebox::cuda {

KernelOperands::KernelOperands(Context& ctx, const ConvCall& call) : result_(&call.out[0]) {
  keep_.reserve(7);
  const ConvOp op = call.op();
  const ConvRoles r = conv_roles(op, call.in, call.out[0]);
  if (!result_->is_channels_last())
    staged_ = temporary_tensor(ctx, result_->dtype, result_->shape, MemoryFormat::channels_last);
  written = staged_ ? &*staged_ : result_;
  if (op != ConvOp::dgrad) x = &channels_last_operand(ctx, *r.x, keep_);
  if (op != ConvOp::wgrad) w = &channels_last_operand(ctx, *r.w, keep_);
  if (op != ConvOp::fprop) y = &channels_last_operand(ctx, *r.y, keep_);
  const ConvEpilogueOperands& e = call.epilogue;
  if (e.bias) bias = &contiguous_operand(ctx, *e.bias, keep_);
  if (e.residual) residual = &channels_last_operand(ctx, *e.residual, keep_);
  aligned =
      aligned16(x) && aligned16(w) && aligned16(y) && aligned16(written) && aligned16(residual);
}

void KernelOperands::finish(Context& ctx) {
  if (staged_) copy_strided(ctx, *staged_, *result_);
}

bool kernel_operands_aligned(const ConvCall& call) {
  auto in_place_aligned = [](const DeviceTensor* t) {
    return t == nullptr || !t->is_channels_last() || aligned16(t);
  };
  const ConvOp op = call.op();
  const ConvRoles r = conv_roles(op, call.in, call.out[0]);
  return (op == ConvOp::dgrad || in_place_aligned(r.x)) &&
         (op == ConvOp::wgrad || in_place_aligned(r.w)) &&
         (op == ConvOp::fprop || in_place_aligned(r.y)) && in_place_aligned(&call.out[0]) &&
         in_place_aligned(call.epilogue.residual);
}

bool kernel_bias_aligned(const ConvCall& call) {
  const DeviceTensor* b = call.epilogue.bias;
  return b == nullptr || !b->is_contiguous() || aligned16(b);
}

std::optional<std::string> implicit_gemm_family_refusal(const ConvCall& call) {
  for (const DeviceTensor* t : call.in)
    if (t != nullptr && t->dtype != call.dtype())
      return cat("mixed dtypes ", dtype_name(t->dtype), " and ", dtype_name(call.dtype()));
  return igemm::cannot_implement(call.op(), call.geometry, call.dtype());
}

}  // namespace fusebox::cuda
