#include "backends/cuda/kernels/conv/problem.h"

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "backends/common/conv_geometry.h"
#include "backends/cuda/kernels/conv/engines.h"
#include "backends/cuda/runtime/plan_cache.h"
#include "backends/cuda/runtime/settings.h"

namespace fusebox::cuda {

namespace {

// -1: FUSEBOX_AUTOTUNE decides; 0 / 1: set by set_conv_autotune_override.
std::atomic<int> g_autotune_override{-1};

// The tensor as cuDNN gets it: dims and strides, 1-D lowered to 2-D by a leading spatial
// extent of 1 whose stride continues the layout (stride of the spatial dim times its
// extent), so NCL stays NCHW-packed and NLC stays NHWC-packed.
ConvTensor lowered(const DeviceTensor& t, bool lower_1d) {
  ConvTensor c;
  c.dtype = t.dtype;
  c.dims.assign(t.shape.begin(), t.shape.end());
  c.strides.assign(t.strides.begin(), t.strides.end());
  // A size-1 dim's stride is never used to address memory; give it a positive value
  // (a view may carry 0 there) so that it does not read as a broadcast.
  for (size_t i = 0; i < c.dims.size(); ++i)
    if (c.dims[i] == 1 && c.strides[i] <= 0) c.strides[i] = 1;
  if (lower_1d) {
    c.dims.insert(c.dims.begin() + 2, 1);
    c.strides.insert(c.strides.begin() + 2, c.strides[2] * c.dims[3]);
  }
  c.alignment = pointer_alignment(t.data());
  c.present = true;
  return c;
}

const char* layout_name(const ConvTensor& t) {
  // Packed NCHW / NHWC (NCDHW / NDHWC) recognised; anything else is "strided".
  const size_t rank = t.dims.size();
  std::vector<int64_t> nchw(rank), nhwc(rank);
  int64_t s = 1;
  for (size_t i = rank; i-- > 0;) {
    nchw[i] = s;
    s *= t.dims[i];
  }
  s = t.dims[1];
  nhwc[1] = 1;
  for (size_t i = rank; i-- > 2;) {
    nhwc[i] = s;
    s *= t.dims[i];
  }
  nhwc[0] = s;
  auto matches = [&](const std::vector<int64_t>& want) {
    for (size_t i = 0; i < rank; ++i)
      if (t.dims[i] != 1 && t.strides[i] != want[i]) return false;
    return true;
  };
  if (matches(nchw)) return rank == 5 ? "ncdhw" : "nchw";
  if (matches(nhwc)) return rank == 5 ? "ndhwc" : "nhwc";
  return "strided";
}

std::string join(const std::vector<int64_t>& v, const char* sep = ",") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

void add_tensor(CacheKeyBuilder& key, const char* name, const ConvTensor& t) {
  const std::string n(name);
  key.add(n + ".present", int64_t(t.present));
  if (!t.present) return;
  key.add(n + ".dtype", dtype_name(t.dtype));
  key.add(n + ".dims", std::span<const int64_t>(t.dims));
  key.add(n + ".strides", std::span<const int64_t>(t.strides));
  key.add(n + ".align", int64_t(t.alignment));
}

CacheKeyBuilder key_builder(const ConvProblem& p) {
  CacheKeyBuilder key;
  key.add("op", conv_op_name(p.op));
  if (p.lowering != ConvLowering::standard) key.add("lowering", conv_lowering_name(p.lowering));
  if (p.forced_plan_index >= 0) key.add("forced_plan_index", p.forced_plan_index);
  for (const std::string& engine : barred_engines(p)) key.add("barred_engine", engine);
  key.add("spatial_rank", int64_t(p.spatial_rank));
  add_tensor(key, "x", p.x);
  add_tensor(key, "w", p.w);
  add_tensor(key, "y", p.y);
  add_tensor(key, "bias", p.bias);
  // Epilogue fields only where there is one: the keys of plain problems stay as they were.
  auto add_activation = [&](const char* name, const FusedActivation& a) {
    if (!a) return;
    key.add(cat(name, ".kind"), activation_name(a.kind));
    if (a.kind == Activation::clip) {  // the bounds exactly (hex floats)
      char bounds[64];
      std::snprintf(bounds, sizeof bounds, "%a,%a", a.min, a.max);
      key.add(cat(name, ".bounds"), std::string_view(bounds));
    }
  };
  add_activation("activation", p.activation);
  if (p.residual.present) add_tensor(key, "residual", p.residual);
  add_activation("residual_activation", p.residual_activation);
  if (p.refuse_fusion) key.add("refuse_fusion", int64_t(1));
  key.add("pad_lo", std::span<const int64_t>(p.pad_lo));
  key.add("pad_hi", std::span<const int64_t>(p.pad_hi));
  key.add("stride", std::span<const int64_t>(p.stride));
  key.add("dilation", std::span<const int64_t>(p.dilation));
  key.add("groups", p.groups);
  key.add("device", int64_t(p.device));
  key.add("tf32", int64_t(p.allow_tf32));
  key.add("deterministic", int64_t(p.deterministic));
  return key;
}

}  // namespace

const char* conv_op_name(ConvOp op) {
  switch (op) {
    case ConvOp::fprop:
      return "conv_fprop";
    case ConvOp::dgrad:
      return "conv_dgrad";
    case ConvOp::wgrad:
      return "conv_wgrad";
  }
  return "?";
}

const char* conv_fusion_name(ConvFusion f) {
  switch (f) {
    case ConvFusion::none:
      return "none";
    case ConvFusion::bias:
      return "bias";
    case ConvFusion::epilogue:
      return "epilogue";
  }
  return "?";
}

std::optional<std::string> ConvProblem::epilogue_refusal() const {
  if (refuse_fusion) return "fused graphs refused (FUSEBOX_CUDNN_FUSION=refuse)";
  // cuDNN 9.19 on the H100 runs RELU_FWD with an upper clip only on its reference engine
  // (eng0): 120 ms for a ResNet 3x3 layer that takes 0.15 ms plain (probe, bench/results).
  if (activation.kind == Activation::clip || residual_activation.kind == Activation::clip)
    return "clip: cuDNN's only engine for a clipped relu is its reference kernel (~1000x slower)";
  return std::nullopt;
}

std::vector<ConvFusion> ConvProblem::fusions() const {
  std::vector<ConvFusion> out;
  if (has_epilogue() && !epilogue_refusal()) out.push_back(ConvFusion::epilogue);
  if (!refuse_fusion && bias.present) out.push_back(ConvFusion::bias);
  out.push_back(ConvFusion::none);
  return out;
}

const char* conv_lowering_name(ConvLowering l) {
  switch (l) {
    case ConvLowering::standard:
      return "standard";
    case ConvLowering::subsampled_1x1:
      return "subsampled_1x1";
  }
  return "?";
}

ConvSettings conv_settings() {
  ConvSettings s = settings().conv;
  const int override_value = g_autotune_override.load();
  if (override_value >= 0) s.autotune = override_value == 1;
  if (std::optional<ConvEngineChoice> engine = conv_engine_override())
    set_conv_engine(s, *engine, "set_conv_engine_override");
  return s;
}

void set_conv_autotune_override(std::optional<bool> autotune) {
  g_autotune_override.store(autotune ? int(*autotune) : -1);
}

uint32_t pointer_alignment(const void* address) {
  const uint64_t bits = uint64_t(reinterpret_cast<uintptr_t>(address)) | 256;
  return uint32_t(bits & (~bits + 1));
}

int64_t effective_pad_hi(int64_t in, int64_t out, int64_t filter, int64_t stride, int64_t dilation,
                         int64_t pad_lo, int64_t pad_hi) {
  if (pad_hi != pad_lo && conv_output_extent(in, filter, stride, dilation, pad_lo, pad_lo) == out) {
    return pad_lo;
  }
  return pad_hi;
}

double ConvProblem::flops() const {
  double f = 2.0 * double(y.dims[0]) * double(y.dims[1]) * double(w.dims[1]);
  for (size_t i = 2; i < y.dims.size(); ++i) f *= double(y.dims[i]) * double(w.dims[i]);
  return f;
}

std::string ConvProblem::describe() const {
  auto tensor = [](const char* name, const ConvTensor& t) {
    return cat(name, "[", join(t.dims), "]/", layout_name(t));
  };
  std::string s = cat(conv_op_name(op), " ", dtype_name(x.dtype), " ", tensor("x", x), " ",
                      tensor("w", w), " ", tensor("y", y));
  if (bias.present) s += " +bias";
  if (activation) s += cat(" +", activation_name(activation.kind));
  if (residual.present) s += " +residual";
  if (residual_activation) s += cat(" +", activation_name(residual_activation.kind));
  s += cat(" pad ", join(pad_lo), "/", join(pad_hi), " s ", join(stride), " d ", join(dilation),
           " g ", groups);
  if (lowering != ConvLowering::standard) s += cat(" (", conv_lowering_name(lowering), ")");
  if (forced_plan_index >= 0) s += cat(" (FUSEBOX_CONV_PLAN_INDEX=", forced_plan_index, ")");
  return s;
}

ConvProblem make_conv_problem(const Node& n, const std::vector<const DeviceTensor*>& inputs,
                              const DeviceTensor& output, const ConvSettings& settings,
                              int device) {
  const std::string where = node_label(n);
  ConvProblem p;
  p.label = where;
  p.device = device;
  p.allow_tf32 = settings.allow_tf32;
  p.deterministic = settings.deterministic;
  p.allow_barred_engines = settings.allow_barred_engines;
  p.forced_plan_index = settings.forced_plan_index;
  p.refuse_fusion = settings.refuse_fusion;
  const ConvAttrs* attrs = nullptr;
  const DeviceTensor *x = nullptr, *w = nullptr, *y = nullptr, *bias = nullptr, *residual = nullptr;
  auto input = [&](size_t i) { return i < inputs.size() ? inputs[i] : nullptr; };
  switch (n.op) {
    case OpKind::conv:
      p.op = ConvOp::fprop;
      attrs = &std::get<ConvAttrs>(n.attrs);
      x = input(0), w = input(1), bias = input(2), residual = input(3), y = &output;
      p.activation = attrs->activation;
      p.residual_activation = attrs->residual_activation;
      break;
    case OpKind::conv_backward_data:
      p.op = ConvOp::dgrad;
      attrs = &std::get<ConvBackwardDataAttrs>(n.attrs).conv;
      y = input(0), w = input(1), bias = input(2), x = &output;
      break;
    case OpKind::conv_backward_filter:
      p.op = ConvOp::wgrad;
      attrs = &std::get<ConvBackwardFilterAttrs>(n.attrs).conv;
      x = input(0), y = input(1), w = &output;
      break;
    default:
      throw Error(where, "not a convolution");
  }
  FUSEBOX_CHECK(x && w && y, where, "missing a convolution operand");
  const ConvGeometry g = make_conv_geometry(*attrs, x->shape, w->shape, y->shape, where);
  if (bias) {
    const int64_t channels = p.op == ConvOp::fprop ? g.out_channels : g.in_channels;
    FUSEBOX_CHECK(bias->shape == Shape{channels}, where, "bias ", shape_str(bias->shape),
                  " should be [", channels, "]");
  }
  p.groups = g.groups;
  p.spatial_rank = g.spatial_rank;
  const bool lower_1d = g.spatial_rank == 1;
  // The geometry's trailing max(2, rank) dims: a 1-D problem keeps one leading filler dim.
  for (int d = 3 - std::max(2, g.spatial_rank); d < 3; ++d) {
    p.pad_lo.push_back(g.pad_lo[d]);
    p.pad_hi.push_back(effective_pad_hi(g.in[d], g.out[d], g.filter[d], g.stride[d], g.dilation[d],
                                        g.pad_lo[d], g.pad_hi[d]));
    p.stride.push_back(g.stride[d]);
    p.dilation.push_back(g.dilation[d]);
  }
  p.x = lowered(*x, lower_1d);
  p.w = lowered(*w, lower_1d);
  p.y = lowered(*y, lower_1d);
  if (residual) {
    FUSEBOX_CHECK(residual->shape == y->shape && residual->dtype == y->dtype, where, "residual ",
                  dtype_name(residual->dtype), shape_str(residual->shape), " should be ",
                  dtype_name(y->dtype), shape_str(y->shape), " (the output's)");
    p.residual = lowered(*residual, lower_1d);
  }
  if (bias) {
    p.bias.dtype = bias->dtype;
    p.bias.dims = bias->shape;
    p.bias.strides = bias->strides;
    p.bias.alignment = pointer_alignment(bias->data());
    p.bias.present = true;
  }
  return p;
}

std::optional<ConvProblem> subsampled_1x1(const ConvProblem& p) {
  if (p.op != ConvOp::fprop || p.groups != 1 || p.lowering != ConvLowering::standard) {
    return std::nullopt;
  }
  const size_t spatial = p.stride.size();
  bool strided = false;
  for (size_t d = 0; d < spatial; ++d) {
    if (p.w.dims[2 + d] != 1 || p.pad_lo[d] != 0 || p.pad_hi[d] != 0) return std::nullopt;
    strided = strided || p.stride[d] > 1;
  }
  if (!strided) return std::nullopt;
  // Output pixel o reads input pixel o * s (1x1, no padding): the view's element o is at
  // o * s * x.stride, and its extent is the output's ((D - 1) / s + 1 <= D, never past x).
  ConvProblem q = p;
  q.lowering = ConvLowering::subsampled_1x1;
  for (size_t d = 0; d < spatial; ++d) {
    q.x.dims[2 + d] = p.y.dims[2 + d];
    if (q.x.dims[2 + d] > 1) q.x.strides[2 + d] = p.x.strides[2 + d] * p.stride[d];
    q.stride[d] = 1;
    q.dilation[d] = 1;
  }
  return q;
}

std::string conv_problem_key(const ConvProblem& p) {
  return key_builder(p).bytes();
}

std::string conv_problem_key_text(const ConvProblem& p) {
  return key_builder(p).describe();
}

std::optional<std::string> cudnn_cannot_implement(const ConvProblem& p) {
  const DType t = p.x.dtype;
  if (t != DType::f32 && t != DType::f16 && t != DType::bf16) {
    return cat("cuDNN path takes f32, f16 and bf16, not ", dtype_name(t));
  }
  for (const ConvTensor* other : {&p.w, &p.y, &p.bias, &p.residual}) {
    if (other->present && other->dtype != t) {
      return cat("mixed dtypes (", dtype_name(t), " and ", dtype_name(other->dtype), ")");
    }
  }
  if (p.lowered_spatial_rank() < 2 || p.lowered_spatial_rank() > 3) {
    return cat(p.lowered_spatial_rank(), " spatial dims (cuDNN takes 1 to 3)");
  }
  const std::pair<const char*, const ConvTensor*> tensors[] = {
      {"x", &p.x}, {"w", &p.w}, {"y", &p.y}, {"bias", &p.bias}, {"residual", &p.residual}};
  for (const auto& [name, tensor] : tensors) {
    if (!tensor->present) continue;
    for (size_t i = 0; i < tensor->dims.size(); ++i) {
      if (tensor->dims[i] == 0) return cat(name, " is empty");
      if (tensor->dims[i] > 1 && tensor->strides[i] <= 0) {
        return cat(name, " has stride ", tensor->strides[i], " in dim ", i,
                   " (broadcast or reversed view)");
      }
    }
    if (tensor->alignment < dtype_size(tensor->dtype)) {
      return cat(name, " is not aligned to its element size");
    }
  }
  return std::nullopt;
}

std::vector<std::string> barred_engines(const ConvProblem& p) {
  if (p.allow_barred_engines) return {};
  const bool half = p.x.dtype == DType::f16 || p.x.dtype == DType::bf16;
  if (p.op == ConvOp::wgrad && p.groups > 1 && half && p.lowered_spatial_rank() == 3)
    return {"eng1", "eng20"};
  const bool asymmetric = p.pad_lo != p.pad_hi;
  if (p.op == ConvOp::dgrad && p.groups > 1 && half && asymmetric) return {"eng6"};
  return {};
}

}  // namespace fusebox::cuda
