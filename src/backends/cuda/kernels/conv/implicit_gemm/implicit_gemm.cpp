// run_implicit_gemm: the node's tensors to the kernels' layouts, the plan, the launch.
#include "backends/cuda/kernels/conv/implicit_gemm/implicit_gemm.h"

#include <cstdio>
#include <mutex>
#include <optional>
#include <vector>

#include "backends/common/activation.h"
#include "backends/common/conv_geometry.h"
#include "backends/cuda/kernels/conv/cutlass/launch.h"
#include "backends/cuda/kernels/conv/halo_wgrad/halo_wgrad.h"
#include "backends/cuda/kernels/conv/im2col.h"
#include "backends/cuda/kernels/conv/implicit_gemm/launch.h"
#include "backends/cuda/kernels/conv/implicit_gemm/plan.h"
#include "backends/cuda/kernels/conv/operand_layout.h"
#include "backends/cuda/kernels/conv/patch_wgrad/patch_wgrad.h"
#include "backends/cuda/kernels/conv/phase_dgrad/phase_dgrad.h"
#include "backends/cuda/kernels/conv/space_to_depth.h"

namespace fusebox::cuda {

std::optional<std::string> implicit_gemm_cannot_implement(const Node& n, ConvOp op, Inputs in,
                                                          const DeviceTensor& out) {
  for (const DeviceTensor* t : in)
    if (t != nullptr && t->dtype != out.dtype)
      return cat("mixed dtypes ", dtype_name(t->dtype), " and ", dtype_name(out.dtype));
  return igemm::cannot_implement(op, conv_geometry_of(n, op, in, out), out.dtype);
}

namespace {

// The operands in the kernels' layouts (null where the op has none).
struct ConvTensors {
  const DeviceTensor *x, *w, *y, *bias, *residual, *written;
};

// The pointwise problem a gathered or im2col'd one becomes: rows = N*O pixels of `channels`.
ConvGeometry pointwise_geometry(const ConvGeometry& g, int64_t channels) {
  ConvGeometry p;
  p.spatial_rank = g.spatial_rank;
  p.batch = g.batch;
  p.in_channels = channels;
  p.out_channels = g.out_channels;
  for (int d = 0; d < 3; ++d) p.in[d] = p.out[d] = g.out[d];
  return p;
}

// How try_cutlass hands a problem to the CUTLASS kernels.
enum class CutlassLowering {
  direct,  // as it is
  // A strided 1x1 fprop or wgrad without padding reads only x's sub-lattice: gathered dense (a
  // quarter of x at stride 2), it is a pointwise problem, which runs on the persistent GEMM
  // instead of the im2col kernel (0.55x cuDNN on ResNet-50's stride-2 downsample fprop). A
  // wgrad only where the GEMM runs unsplit (cutlass_conv::direct_wgrad_tile: layer 4's
  // 0.55x); chunked through f32 slices, ResNet-50's three fell from 0.65-1.1x to 0.47-0.66x.
  gather,
  // Channels that are not a multiple of 8 (an RGB stem's 3), or 8: TMA cannot move such rows,
  // or 8 channels would fill an eighth of each 64-deep K step. The patches written out as a
  // matrix (im2col.h) make the problem pointwise, a GEMM over taps*C columns. (Where the
  // space-to-depth lowering applies, try_space_to_depth has run it instead.)
  im2col,
};

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

// True when the node asks for no epilogue (no bias, residual or activation).
bool no_epilogue(const ConvEpilogueOperands& e) {
  return e.bias == nullptr && e.residual == nullptr && !e.activation && !e.residual_activation;
}

// The CUTLASS kernels' own checks of problem `gw` and the epilogue (cutlass_conv::
// cannot_implement, map_epilogue): true, with the epilogue in *out, where they take it.
bool cutlass_takes(const Context& ctx, ConvOp op, const ConvGeometry& gw, DType dtype,
                   const ConvTensors& t, const ConvEpilogueOperands& e, bool aligned,
                   cutlass_conv::Epilogue* out) {
  const int cc = ctx.device.properties().compute_capability();
  return !cutlass_conv::cannot_implement(op, gw, dtype, {cc, aligned}) &&
         !cutlass_conv::map_epilogue(t.bias != nullptr, activation_fn(e.activation),
                                     t.residual != nullptr, activation_fn(e.residual_activation),
                                     out);
}

// Records the problem on the CUTLASS Hopper kernels and returns the plan's description, or
// nullopt (nothing recorded) where they do not take it: cutlass_conv::cannot_implement, an
// epilogue theirs cannot compute, or CUTLASS's own can_implement refusing (said once).
std::optional<std::string> try_cutlass(Context& ctx, const Node& n, ConvOp op,
                                       const ConvGeometry& g, const ConvTensors& t,
                                       const ConvEpilogueOperands& e,
                                       std::optional<cutlass_conv::Tile> tile, bool aligned) {
  const DeviceProperties& device = ctx.device.properties();
  const DType dtype = t.written->dtype;
  const CutlassLowering lowering = cutlass_lowering(op, g, device.sm_count, tile);
  const int64_t c = g.in_channels, width = im2col_width(g);
  ConvGeometry gw = g;  // the problem the kernels see
  if (lowering == CutlassLowering::gather) gw = pointwise_geometry(g, c);
  if (lowering == CutlassLowering::im2col) gw = pointwise_geometry(g, width);
  // A dgrad bias is over dx's channels: col2im's sums come after the GEMM's epilogue.
  if (lowering == CutlassLowering::im2col && op == ConvOp::dgrad && t.bias != nullptr)
    return std::nullopt;
  cutlass_conv::Epilogue epilogue;
  if (!cutlass_takes(ctx, op, gw, dtype, t, e, aligned, &epilogue)) return std::nullopt;
  const cutlass_conv::Plan plan =
      cutlass_conv::make_plan(op, gw, dtype, epilogue, device.sm_count, tile);
  if (plan.zero_fill && t.bias != nullptr) return std::nullopt;  // empty phases need the bias
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
        return plan.describe();
      case CutlassLowering::gather:
        return cat(plan.describe(), ", x gathered at stride ", g.stride[2]);
      case CutlassLowering::im2col:
        if (op == ConvOp::dgrad) record_col2im(ctx, g, *written, *t.written);
        if (op == ConvOp::wgrad)
          copy_strided(ctx, filter_columns(*written, width), filter_columns(*t.written, taps_c));
        return cat(plan.describe(), ", im2col ", rows, "x", width);
    }
  }
  // plan.cpp's checks are meant to mirror CUTLASS's: say so once; the caller runs our main
  // loop (which overwrites whatever the phases' clearing wrote).
  static std::once_flag warned;
  std::call_once(warned, [&] {
    std::fprintf(stderr, "fusebox: %s: %s; the implicit GEMM's own main loop runs it\n",
                 node_label(n).c_str(), refused->c_str());
  });
  return std::nullopt;
}

// Records a convolution over channels TMA cannot move as they are (an RGB stem's 3) on the
// CUTLASS kernels through the space-to-depth lowering (space_to_depth.h), where it applies and
// the kernels take the wide problem: the wide x and filter, the stride-1 problem, a
// gradient's fold. The stem against im2col (H200): fprop 0.47 -> 0.21 ms, dgrad 1.13 -> 0.19
// ms (cuDNN 0.44 / 0.81).
// Returns the plan's description, or nullopt: nothing recorded, except where CUTLASS's own
// can_implement refuses the wide problem after the transforms (said once; the caller's
// fallback then writes the whole result).
std::optional<std::string> try_space_to_depth(Context& ctx, const Node& n, ConvOp op,
                                              const ConvGeometry& g, const ConvTensors& t,
                                              const ConvEpilogueOperands& e,
                                              std::optional<cutlass_conv::Tile> tile,
                                              bool aligned) {
  if (g.in_channels % 8 == 0 && g.in_channels >= 16) return std::nullopt;
  const std::optional<SpaceToDepth> s = space_to_depth_lowering(g);
  if (!s) return std::nullopt;
  // The epilogue's bias, activation and residual are over y; a gradient's wide result is not
  // dx or dw yet.
  if (op != ConvOp::fprop && !no_epilogue(e)) return std::nullopt;
  const DType dtype = t.written->dtype;
  cutlass_conv::Epilogue epilogue;  // try_cutlass's checks, made before anything is recorded
  if (!cutlass_takes(ctx, op, s->problem, dtype, t, e, aligned, &epilogue)) return std::nullopt;
  std::vector<DeviceTensor> wide;  // held while recorded
  wide.reserve(3);
  auto wide_tensor = [&](const PhaseMap& m) {
    wide.push_back(
        temporary_tensor(ctx, dtype, {m.batch, m.wide[0], m.wide[1], m.wide[2], m.wide_channels}));
    return &wide.back();
  };
  ConvTensors ts = t;
  if (t.x != nullptr) {
    ts.x = wide_tensor(s->activations);
    record_space_to_depth(ctx, s->activations, *t.x, *ts.x);
  }
  if (t.w != nullptr) {
    ts.w = wide_tensor(s->filter);
    record_space_to_depth(ctx, s->filter, *t.w, *ts.w);
  }
  if (op == ConvOp::dgrad) ts.written = wide_tensor(s->activations);
  if (op == ConvOp::wgrad) ts.written = wide_tensor(s->filter);
  const std::optional<std::string> plan = try_cutlass(ctx, n, op, s->problem, ts, e, tile, aligned);
  if (!plan) return std::nullopt;
  if (op == ConvOp::dgrad) record_depth_to_space(ctx, s->activations, *ts.written, *t.written);
  if (op == ConvOp::wgrad) record_depth_to_space(ctx, s->filter, *ts.written, *t.written);
  std::string taps;
  for (int d = 3 - g.spatial_rank; d < 3; ++d)
    taps += cat(taps.empty() ? "" : "x", s->problem.filter[d]);
  return cat(*plan, ", space-to-depth: ", taps, " taps of ", s->problem.in_channels, " channels");
}

// Records a weight gradient on a wgrad kernel of our own where one takes the problem and the
// heuristic (or FUSEBOX_CONV_IGEMM_TILE=halo / patch: `tile`) asks for it: a 3x3 stride-1 one
// with 64 filters on the halo wgrad (kernels/conv/halo_wgrad/), a 7x7 one over at most 4
// channels (an RGB stem) on the patch wgrad (kernels/conv/patch_wgrad/). Returns the plan's
// description, or nullopt (nothing recorded).
std::optional<std::string> try_own_wgrad(Context& ctx, const ConvGeometry& g, const DeviceTensor& x,
                                         const DeviceTensor& dy, const DeviceTensor& dw,
                                         bool aligned, const std::string& tile) {
  const DeviceProperties& device = ctx.device.properties();
  const int cc = device.compute_capability();
  auto partial_for = [&](size_t bytes) {
    return temporary_tensor(ctx, DType::f32, {int64_t(bytes / sizeof(float))});
  };
  if (!halo_wgrad::cannot_implement(g, dw.dtype, cc, aligned) &&
      (tile == halo_wgrad::kTileName || (tile.empty() && halo_wgrad::preferred(g)))) {
    const halo_wgrad::Plan plan = halo_wgrad::make_plan(g, dw.dtype, device.sm_count);
    const DeviceTensor partial = partial_for(plan.partial_bytes);
    halo_wgrad::record(ctx, plan, g, {x.data(), dy.data(), dw.data(), partial.as<float>()},
                       {x.range(), dy.range()}, dw.range(), partial.range());
    return plan.describe();
  }
  if (!patch_wgrad::cannot_implement(g, dw.dtype, cc, aligned) &&
      (tile == patch_wgrad::kTileName || tile.empty())) {
    const patch_wgrad::Plan plan = patch_wgrad::make_plan(g, dw.dtype, device.sm_count);
    const DeviceTensor partial = partial_for(plan.partial_bytes);
    patch_wgrad::record(ctx, plan, g, {x.data(), dy.data(), dw.data(), partial.as<float>()},
                        {x.range(), dy.range()}, dw.range(), partial.range());
    return plan.describe();
  }
  return std::nullopt;
}

// Records a 3x3 stride-2 backward-data convolution without an epilogue on the phase dgrad
// (kernels/conv/phase_dgrad/) where it takes the problem and the heuristic (or
// FUSEBOX_CONV_IGEMM_TILE=phase: `tile`) asks for it. Returns the plan's description, or
// nullopt (nothing recorded).
std::optional<std::string> try_phase_dgrad(Context& ctx, const ConvGeometry& g,
                                           const DeviceTensor& dy, const DeviceTensor& w,
                                           const DeviceTensor& dx, const ConvEpilogueOperands& e,
                                           bool aligned, const std::string& tile) {
  const DeviceProperties& device = ctx.device.properties();
  if (!no_epilogue(e) ||
      phase_dgrad::cannot_implement(g, dx.dtype, device.compute_capability(), aligned))
    return std::nullopt;
  if (tile != phase_dgrad::kTileName && !tile.empty()) return std::nullopt;
  const phase_dgrad::Plan plan = phase_dgrad::make_plan(g, dx.dtype, device.sm_count);
  phase_dgrad::record(ctx, plan, g, dy.data(), w.data(), dx.data(), {dy.range(), w.range()},
                      dx.range());
  return plan.describe();
}

}  // namespace

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
  // Hopper: a weight gradient one of our wgrad kernels takes runs there; the CUTLASS kernels
  // (kernels/conv/cutlass/) run what they take, unless a tile of the project's main loops is
  // forced.
  const bool own_kernel_forced = settings.igemm_tile == halo_wgrad::kTileName ||
                                 settings.igemm_tile == patch_wgrad::kTileName ||
                                 settings.igemm_tile == phase_dgrad::kTileName;
  if (op == ConvOp::wgrad && (settings.igemm_tile.empty() || own_kernel_forced)) {
    if (auto plan = try_own_wgrad(ctx, g, *x, *y, written, options.aligned, settings.igemm_tile)) {
      if (staged) copy_strided(ctx, *staged, result);
      return *plan;
    }
  }
  if (op == ConvOp::dgrad && (settings.igemm_tile.empty() || own_kernel_forced)) {
    if (auto plan =
            try_phase_dgrad(ctx, g, *y, *w, written, e, options.aligned, settings.igemm_tile)) {
      if (staged) copy_strided(ctx, *staged, result);
      return *plan;
    }
  }
  const std::optional<cutlass_conv::Tile> cutlass_tile =
      cutlass_conv::parse_tile(settings.igemm_tile);
  if (settings.igemm_tile.empty() || cutlass_tile || own_kernel_forced) {
    const ConvTensors t{x, w, y, bias, residual, &written};
    // CUTLASS's epilogue reads the bias in 16-byte vectors too.
    const bool aligned = options.aligned && aligned16(bias);
    std::optional<std::string> plan =
        try_space_to_depth(ctx, n, op, g, t, e, cutlass_tile, aligned);
    if (!plan) plan = try_cutlass(ctx, n, op, g, t, e, cutlass_tile, aligned);
    if (plan) {
      if (staged) copy_strided(ctx, *staged, result);
      return *plan;
    }
  }
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
