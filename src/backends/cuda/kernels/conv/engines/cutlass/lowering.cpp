#include "backends/cuda/kernels/conv/engines/cutlass/lowering.h"

#include <cstdio>
#include <mutex>
#include <vector>

#include "backends/cuda/kernels/conv/engines/cutlass/launch.h"
#include "backends/cuda/kernels/conv/engines/im2col/im2col.h"
#include "backends/cuda/kernels/conv/kernel_operands.h"
#include "backends/cuda/kernels/conv/operand_layout.h"

namespace fusebox::cuda {

ConvGeometry pointwise_geometry(const ConvGeometry& g, int64_t channels) {
  ConvGeometry p;
  p.spatial_rank = g.spatial_rank;
  p.batch = g.batch;
  p.in_channels = channels;
  p.out_channels = g.out_channels;
  for (int d = 0; d < 3; ++d) p.in[d] = p.out[d] = g.out[d];
  return p;
}

CutlassLowering cutlass_lowering(ConvOp op, const ConvGeometry& g, int sm_count,
                                 std::optional<cutlass_conv::Tile> tile) {
  if (g.groups != 1 || cutlass_conv::is_pointwise(g)) return CutlassLowering::direct;
  // Channels TMA cannot move (below) take the im2col lowering instead, a gather too.
  if (op != ConvOp::dgrad && g.filter_size() == 1 && g.in_channels % 8 == 0) {
    bool unpadded = true;
    for (int d = 0; d < 3; ++d) unpadded = unpadded && g.pad_lo[d] == 0 && g.pad_hi[d] == 0;
    if (unpadded &&
        (op == ConvOp::fprop ||
         cutlass_conv::direct_wgrad_tile(pointwise_geometry(g, g.in_channels), sm_count, tile)))
      return CutlassLowering::gather;
  }
  // The patch matrix under 2^30 elements (2 GiB of 16-bit values).
  const int64_t col = g.batch * g.out_size() * im2col_width(g);
  if ((g.in_channels % 8 != 0 || g.in_channels < 16) && col < (int64_t(1) << 30))
    return CutlassLowering::im2col;
  return CutlassLowering::direct;
}

std::optional<std::string> cutlass_variant_refusal(const std::string& variant) {
  if (variant.empty() || cutlass_conv::parse_tile("cutlass" + variant)) return std::nullopt;
  return cat("no tile '", variant, "' (the CUTLASS tiles: ", kCutlassVariants, ")");
}

std::optional<cutlass_conv::Tile> cutlass_variant_tile(const std::string& variant) {
  if (variant.empty()) return std::nullopt;
  const std::optional<cutlass_conv::Tile> t = cutlass_conv::parse_tile("cutlass" + variant);
  FUSEBOX_CHECK(t.has_value(), "cuda", *cutlass_variant_refusal(variant));
  return t;
}

std::optional<std::string> cutlass_refusal(const ConvCall& call, const ConvGeometry& gw,
                                           bool aligned, cutlass_conv::Epilogue* epilogue) {
  const ConvEpilogueOperands& e = call.epilogue;
  if (auto why = cutlass_conv::cannot_implement(call.op(), gw, call.dtype(),
                                                {call.device.compute_capability, aligned}))
    return why;
  return cutlass_conv::map_epilogue(e.bias != nullptr, activation_fn(e.activation),
                                    e.residual != nullptr, activation_fn(e.residual_activation),
                                    epilogue);
}

namespace {

// The problem the kernels see under `lowering`.
ConvGeometry lowered_geometry(const ConvGeometry& g, CutlassLowering lowering) {
  if (lowering == CutlassLowering::gather) return pointwise_geometry(g, g.in_channels);
  if (lowering == CutlassLowering::im2col) return pointwise_geometry(g, im2col_width(g));
  return g;
}

}  // namespace

std::optional<std::string> cutlass_lowering_refusal(const ConvCall& call, const ConvGeometry& g,
                                                    CutlassLowering lowering, bool aligned) {
  const ConvOp op = call.op();
  const bool bias = call.epilogue.bias != nullptr;
  // A dgrad bias is over dx's channels: col2im's sums come after the GEMM's epilogue.
  if (lowering == CutlassLowering::im2col && op == ConvOp::dgrad && bias)
    return std::string("a dgrad bias (col2im's sums come after the GEMM's epilogue)");
  const ConvGeometry gw = lowered_geometry(g, lowering);
  cutlass_conv::Epilogue epilogue;
  if (auto why = cutlass_refusal(call, gw, aligned, &epilogue)) return why;
  const std::optional<cutlass_conv::Tile> tile = cutlass_variant_tile(call.variant);
  const cutlass_conv::Plan plan =
      cutlass_conv::make_plan(op, gw, call.dtype(), epilogue, call.device.sm_count, tile);
  if (plan.zero_fill && bias)
    return std::string("a strided dgrad with an empty phase and a bias (the phases need it)");
  if (tile && plan.tile != *tile)
    return cat("tile ", cutlass_conv::tile_name(*tile), " is not the plan's for ", conv_op_name(op),
               " (", cutlass_conv::tile_name(plan.tile), ")");
  return std::nullopt;
}

CutlassRecorded record_on_cutlass(Context& ctx, const ConvCall& call, const ConvGeometry& g,
                                  const CutlassTensors& t, bool aligned) {
  const ConvOp op = call.op();
  const DeviceProperties& device = ctx.device.properties();
  const DType dtype = t.written->dtype;
  const std::optional<cutlass_conv::Tile> tile = cutlass_variant_tile(call.variant);
  const CutlassLowering lowering = cutlass_lowering(op, g, device.sm_count, tile);
  const int64_t c = g.in_channels, width = im2col_width(g);
  const ConvGeometry gw = lowered_geometry(g, lowering);  // the problem the kernels see
  // cannot_implement has checked this; the plan needs the epilogue it sets.
  if (auto why = cutlass_lowering_refusal(call, g, lowering, aligned)) return {false, *why};
  cutlass_conv::Epilogue epilogue;
  (void)cutlass_refusal(call, gw, aligned, &epilogue);
  const cutlass_conv::Plan plan =
      cutlass_conv::make_plan(op, gw, dtype, epilogue, device.sm_count, tile);
  // The gathered x or the patch matrix, the wide filter and the wide result, held while
  // recorded.
  std::vector<DeviceTensor> copies;
  copies.reserve(3);
  const DeviceTensor* x = t.x;
  const DeviceTensor* w = t.w;
  const DeviceTensor* written = t.written;
  const int64_t rows = g.batch * g.out_size(), taps_c = g.filter_size() * c;
  if (lowering == CutlassLowering::gather && x != nullptr) {
    const int64_t d1 = g.in[2] * c, d0 = g.in[1] * d1, n_stride = g.in[0] * d0;
    const Shape shape{g.batch, g.out[0], g.out[1], g.out[2], c};
    copies.push_back(temporary_tensor(ctx, dtype, shape));
    copy_strided(ctx,
                 x->view(x->offset, shape,
                         {n_stride, g.stride[0] * d0, g.stride[1] * d1, g.stride[2] * c, 1}),
                 copies.back());
    x = &copies.back();
  }
  // The filter [K][taps*C] as the first columns of [K][width].
  auto filter_columns = [&](const DeviceTensor& v, int64_t columns) {
    return v.view(v.offset, {g.out_channels, taps_c}, {columns, 1});
  };
  if (lowering == CutlassLowering::im2col) {
    if (x != nullptr) {
      copies.push_back(temporary_tensor(ctx, dtype, {rows, width}));
      record_im2col(ctx, g, *x, copies.back());
      x = &copies.back();
    }
    if (w != nullptr) {
      copies.push_back(temporary_tensor(ctx, dtype, {g.out_channels, width}));
      ctx.encoder.memset(copies.back().range(), 0);
      copy_strided(ctx, filter_columns(*w, taps_c), filter_columns(copies.back(), width));
      w = &copies.back();
    }
    // dgrad: the patch matrix's gradient; wgrad: the wide filter's.
    if (op != ConvOp::fprop) {
      const Shape wide = op == ConvOp::dgrad ? Shape{rows, width} : Shape{g.out_channels, width};
      copies.push_back(temporary_tensor(ctx, dtype, wide));
      written = &copies.back();
    }
  }
  cutlass_conv::Operands o;
  BufferList reads;
  for (const DeviceTensor* v : {x, w, t.y, t.bias, t.residual})
    if (v != nullptr) reads.push_back(v->range());
  o.x = x ? x->data() : nullptr;
  o.w = w ? w->data() : nullptr;
  o.y = t.y ? t.y->data() : nullptr;
  o.result = written->data();
  o.bias = t.bias ? t.bias->data() : nullptr;
  o.residual = t.residual ? t.residual->data() : nullptr;
  std::optional<DeviceTensor> partial;
  if (plan.partial_bytes > 0) {
    partial = temporary_tensor(ctx, DType::f32, {int64_t(plan.partial_bytes / sizeof(float))});
    o.partial = partial->as<float>();
  }
  // A strided dgrad's phases read sub-filters: the taps first + t * step of each dim of the
  // KRSC filter, copied dense.
  std::vector<DeviceTensor> sub_filters;
  sub_filters.reserve(plan.phases.size());
  o.phase_filters.assign(plan.phases.size(), nullptr);
  const int64_t s2 = gw.in_channels, s1 = g.filter[2] * s2, s0 = g.filter[1] * s1;
  for (size_t i = 0; i < plan.phases.size(); ++i) {
    const cutlass_conv::DgradPhase& ph = plan.phases[i];
    if (ph.empty()) continue;
    const int64_t offset =
        w->offset + ph.first_tap[0] * s0 + ph.first_tap[1] * s1 + ph.first_tap[2] * s2;
    const Shape shape{g.out_channels, ph.taps[0], ph.taps[1], ph.taps[2], gw.in_channels};
    const DeviceTensor view = w->view(
        offset, shape, {g.filter[0] * s0, ph.step[0] * s0, ph.step[1] * s1, ph.step[2] * s2, 1});
    sub_filters.push_back(temporary_tensor(ctx, w->dtype, shape));
    copy_strided(ctx, view, sub_filters.back());
    o.phase_filters[i] = sub_filters.back().data();
    reads.push_back(sub_filters.back().range());
  }
  if (plan.zero_fill) ctx.encoder.memset(written->range(), 0);
  std::optional<BufferRange> partial_range;
  if (partial) partial_range = partial->range();
  const std::optional<std::string> refused = cutlass_conv::record(
      ctx, plan, gw, o, reads, written->range(), partial_range ? &*partial_range : nullptr);
  if (!refused) {
    switch (lowering) {
      case CutlassLowering::direct:
        return {true, plan.describe()};
      case CutlassLowering::gather:
        return {true, cat(plan.describe(), ", x gathered at stride ", g.stride[2])};
      case CutlassLowering::im2col:
        if (op == ConvOp::dgrad) record_col2im(ctx, g, *written, *t.written);
        if (op == ConvOp::wgrad)
          copy_strided(ctx, filter_columns(*written, width), filter_columns(*t.written, taps_c));
        return {true, cat(plan.describe(), ", im2col ", rows, "x", width)};
    }
  }
  // plan.cpp's checks are meant to mirror CUTLASS's: say so once; the policy's next engine
  // (the implicit GEMM's main loop) overwrites whatever the phases' clearing wrote.
  static std::once_flag warned;
  std::call_once(warned, [&] {
    std::fprintf(stderr, "fusebox: %s: %s; the next engine runs it\n", call.label().c_str(),
                 refused->c_str());
  });
  return {false, *refused};
}

std::optional<std::string> CutlassFamilyEngine::family_refusal(const ConvCall& call) {
  if (auto why = cutlass_variant_refusal(call.variant)) return why;
  return implicit_gemm_family_refusal(call);
}

CutlassLowering CutlassFamilyEngine::lowering_of(const ConvCall& call) {
  return cutlass_lowering(call.op(), call.geometry, call.device.sm_count,
                          cutlass_variant_tile(call.variant));
}

std::optional<std::string> CutlassFamilyEngine::refusal_under(const ConvCall& call,
                                                              CutlassLowering lowering) {
  // CUTLASS's epilogue reads the bias in 16-byte vectors too.
  return cutlass_lowering_refusal(call, call.geometry, lowering,
                                  kernel_operands_aligned(call) && kernel_bias_aligned(call));
}

ConvRecorded CutlassFamilyEngine::record_problem(Context& ctx, const ConvCall& call,
                                                 const ConvEnginePlan& plan) {
  KernelOperands k(ctx, call);
  const CutlassTensors t{k.x, k.w, k.y, k.bias, k.residual, k.written};
  const CutlassRecorded r =
      record_on_cutlass(ctx, call, call.geometry, t, k.aligned && aligned16(k.bias));
  if (!r.ran) return {.ran = false, .reason = r.text};
  k.finish(ctx);
  return {.ran = true, .fused = plan.fused, .plan = r.text};
}

}  // namespace fusebox::cuda
