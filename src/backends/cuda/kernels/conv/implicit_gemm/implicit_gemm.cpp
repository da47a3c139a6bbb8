// run_implicit_gemm: the node's tensors to the kernels' layouts, the plan, the launch.
#include "backends/cuda/kernels/conv/implicit_gemm/implicit_gemm.h"

#include <optional>
#include <vector>

#include "backends/common/activation.h"
#include "backends/common/conv_geometry.h"
#include "backends/cuda/kernels/conv/implicit_gemm/launch.h"
#include "backends/cuda/kernels/conv/implicit_gemm/plan.h"
#include "backends/cuda/kernels/conv/operand_layout.h"

namespace fusebox::cuda {

std::optional<std::string> implicit_gemm_cannot_implement(const Node& n, ConvOp op, Inputs in,
                                                          const DeviceTensor& out) {
  for (const DeviceTensor* t : in)
    if (t != nullptr && t->dtype != out.dtype)
      return cat("mixed dtypes ", dtype_name(t->dtype), " and ", dtype_name(out.dtype));
  return igemm::cannot_implement(op, conv_geometry_of(n, op, in, out), out.dtype);
}

std::string run_implicit_gemm(Context& ctx, const Node& n, ConvOp op, Inputs in, Outputs out,
                              const ConvEpilogueOperands& e, const ConvSettings& settings) {
  const ConvGeometry g = conv_geometry_of(n, op, in, out[0]);
  std::vector<DeviceTensor> keep;
  keep.reserve(7);
  const ConvRoles r = conv_roles(op, in, out[0]);
  DeviceTensor& result = out[0];
  // The output: written in place when channels-last, else into a channels-last temporary.
  const bool direct_out = result.is_channels_last();
  std::optional<DeviceTensor> staged;
  if (!direct_out)
    staged = temporary_tensor(ctx, result.dtype, result.shape, MemoryFormat::channels_last);
  const DeviceTensor& written = direct_out ? result : *staged;
  // The inputs in the kernels' layouts.
  const DeviceTensor* x = op == ConvOp::dgrad ? nullptr : &channels_last_operand(ctx, *r.x, keep);
  const DeviceTensor* w = op == ConvOp::wgrad ? nullptr : &channels_last_operand(ctx, *r.w, keep);
  const DeviceTensor* y = op == ConvOp::fprop ? nullptr : &channels_last_operand(ctx, *r.y, keep);
  const DeviceTensor* bias = e.bias ? &contiguous_operand(ctx, *e.bias, keep) : nullptr;
  const DeviceTensor* residual =
      e.residual ? &channels_last_operand(ctx, *e.residual, keep) : nullptr;

  igemm::PlanOptions options;
  options.allow_tf32 = settings.allow_tf32;
  if (!settings.igemm_tile.empty()) options.tile = igemm::parse_tile(settings.igemm_tile);
  options.aligned =
      aligned16(x) && aligned16(w) && aligned16(y) && aligned16(&written) && aligned16(residual);
  const DeviceProperties& device = ctx.device.properties();
  options.wgmma = device.compute_capability() == 90;
  igemm::Plan plan = igemm::make_plan(op, g, result.dtype, options, device.sm_count);
  if (op == ConvOp::dgrad && igemm::is_wgmma(plan.tile)) {
    // The wgmma dgrad reads the filter per group as [C/g][taps][K/g] (K-major): a copy of the
    // KRSC filter through a permuted view.
    const int64_t kg = g.out_per_group(), cg = g.in_per_group(), taps = g.filter_size();
    const DeviceTensor view =
        w->view(w->offset, {g.groups, cg, taps, kg}, {kg * taps * cg, 1, cg, taps * cg});
    keep.push_back(temporary_tensor(ctx, w->dtype, {g.groups, cg, taps, kg}));
    copy_strided(ctx, view, keep.back());
    w = &keep.back();
  }
  igemm::Params& p = plan.params;
  p.x = x ? x->data() : nullptr;
  p.w = w ? w->data() : nullptr;
  p.y = y ? y->data() : nullptr;
  p.result = written.data();
  p.bias = bias ? bias->data() : nullptr;
  p.residual = residual ? residual->data() : nullptr;
  p.activation = activation_fn(e.activation);
  p.residual_activation = activation_fn(e.residual_activation);

  BufferList reads;
  for (const DeviceTensor* t : {x, w, y, bias, residual})
    if (t != nullptr) reads.push_back(t->range());
  switch (op) {
    case ConvOp::fprop:
    case ConvOp::dgrad:
      if (igemm::is_wgmma(plan.tile))
        igemm::launch_sm90(ctx, plan, reads, {written.range()});
      else if (op == ConvOp::fprop)
        igemm::launch_fprop(ctx, plan, reads, {written.range()});
      else
        igemm::launch_dgrad(ctx, plan, reads, {written.range()});
      break;
    case ConvOp::wgrad: {
      std::optional<DeviceTensor> partial;
      if (plan.partial_bytes > 0) {
        partial = temporary_tensor(ctx, DType::f32, {int64_t(plan.partial_bytes / sizeof(float))});
        p.partial = partial->as<float>();
      }
      std::optional<BufferRange> partial_range;
      if (partial) partial_range = partial->range();
      igemm::launch_wgrad(ctx, plan, reads, written.range(),
                          partial_range ? &*partial_range : nullptr);
      break;
    }
  }
  if (staged) copy_strided(ctx, *staged, result);
  return plan.describe();
}

}  // namespace fusebox::cuda
