// Shape and data-movement ops, Cast, and the ops whose results are known at import
// (Constant, Shape, Size, ConstantOfShape, and Gather on known tensors).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "frontends/onnx/import_context.h"
#include "io/bytes.h"
#include "io/tensor_proto.h"

namespace fusebox::onnx_import {
namespace {

// Tensors made at import (ConstantOfShape) are refused beyond this size.
constexpr uint64_t kMaxKnownTensorBytes = uint64_t(1) << 32;

void import_reshape(NodeContext& c) {
  ReshapeAttrs a;
  a.shape = c.const_ints(1, "shape");
  if (c.opset() >= 14) a.allow_zero = c.attrs().get_bool("allowzero", false);
  c.set_output(0, c.emit1(OpKind::reshape, a, {c.input(0)}));
}

void import_flatten(NodeContext& c) {
  FlattenAttrs a{c.attrs().get_int("axis", 1)};
  c.set_output(0, c.emit1(OpKind::flatten, a, {c.input(0)}));
}

void import_transpose(NodeContext& c) {
  TransposeAttrs a{c.attrs().get_ints("perm")};
  c.set_output(0, c.emit1(OpKind::transpose, a, {c.input(0)}));
}

void import_concat(NodeContext& c) {
  ConcatAttrs a{c.attrs().required_int("axis")};
  std::vector<ValueId> in;
  for (int i = 0; i < c.input_count(); ++i) in.push_back(c.input(i));
  c.set_output(0, c.emit1(OpKind::concat, a, in));
}

// Slice (opset 10+): starts, ends, axes and steps are inputs that must be known.
void import_slice(NodeContext& c) {
  SliceAttrs a;
  a.starts = c.const_ints(1, "starts");
  a.ends = c.const_ints(2, "ends");
  if (c.has_input(3)) a.axes = c.const_ints(3, "axes");
  if (c.has_input(4)) a.steps = c.const_ints(4, "steps");
  c.set_output(0, c.emit1(OpKind::slice, a, {c.input(0)}));
}

// Pad (opset 11+): pads [b0, b1, ..., e0, e1, ...] and constant_value are inputs.
void import_pad(NodeContext& c) {
  PadAttrs a;
  const std::string mode = c.attrs().get_string("mode", "constant");
  if (mode == "constant")
    a.mode = PadMode::constant;
  else if (mode == "reflect")
    a.mode = PadMode::reflect;
  else if (mode == "edge")
    a.mode = PadMode::edge;
  else
    c.attrs().unsupported_value("mode", mode, "supported: constant, reflect, edge");
  a.pads = c.const_ints(1, "pads");
  if (c.has_input(2)) a.value = c.const_scalar(2, "constant_value");
  c.set_output(0, c.emit1(OpKind::pad, a, {c.input(0)}));
}

// Squeeze / Unsqueeze: axes is an attribute before opset 13, an input from 13 on.
std::vector<int64_t> axes_of(NodeContext& c, bool required) {
  if (c.opset() >= 13) {
    if (required || c.has_input(1)) return c.const_ints(1, "axes");
    return {};
  }
  c.check(c.input_count() == 1, "takes 1 input before opset 13 (axes is an attribute), got ",
          c.input_count());
  return required ? c.attrs().required_ints("axes") : c.attrs().get_ints("axes");
}

void import_squeeze(NodeContext& c) {
  AxesAttrs a{axes_of(c, false)};
  c.set_output(0, c.emit1(OpKind::squeeze, a, {c.input(0)}));
}

void import_unsqueeze(NodeContext& c) {
  AxesAttrs a{axes_of(c, true)};
  c.set_output(0, c.emit1(OpKind::unsqueeze, a, {c.input(0)}));
}

void import_cast(NodeContext& c) {
  const int64_t to = c.attrs().required_int("to");
  CastAttrs a;
  if (to < 0 || to > 1000 || !dtype_from_onnx(int(to), &a.to))
    c.attrs().unsupported_value("to", onnx_type_name(int(to)),
                                "fusebox casts to FLOAT, DOUBLE, FLOAT16, BFLOAT16, INT64, "
                                "INT32 and BOOL");
  c.set_output(0, c.emit1(OpKind::cast, a, {c.input(0)}));
}

// Constant: exactly one of value, value_float(s), value_int(s).
void import_constant(NodeContext& c) {
  const std::vector<std::string> names = c.attrs().names();
  c.check(names.size() == 1, "needs exactly one value attribute, got ", names.size());
  const std::string& name = names[0];
  Tensor t;
  if (name == "value") {
    const onnx::TensorProto& p = *c.attrs().find_tensor("value");
    DType dt;
    if (!dtype_from_onnx(p.data_type(), &dt))
      c.unsupported(cat("attribute 'value' has element type ", onnx_type_name(p.data_type())));
    try {
      t = tensor_from_proto(p, c.where());
    } catch (const Error& e) {
      c.fail(cat("attribute 'value': ", message_of(e)));
    }
  } else if (name == "value_float") {
    t = Tensor::from_vector<float>({}, {float(c.attrs().get_float(name, 0))});
  } else if (name == "value_floats") {
    std::vector<float> v;
    for (double x : c.attrs().get_floats(name)) v.push_back(float(x));
    t = Tensor::from_vector<float>({int64_t(v.size())}, v);
  } else if (name == "value_int") {
    t = Tensor::from_vector<int64_t>({}, {c.attrs().get_int(name, 0)});
  } else if (name == "value_ints") {
    std::vector<int64_t> v = c.attrs().get_ints(name);
    t = Tensor::from_vector<int64_t>({int64_t(v.size())}, v);
  } else if (name == "sparse_value" || name == "value_string" || name == "value_strings") {
    c.unsupported(cat("attribute '", name, "' is not supported"));
  } else {
    c.attrs().fail(name, "is not a Constant attribute");
  }
  c.set_output(0, t);
}

// Shape (start/end since opset 15, clamped to [0, rank] after adding rank to negatives).
void import_shape(NodeContext& c) {
  const Shape& s = c.input_shape(0);
  const int64_t rank = int64_t(s.size());
  int64_t start = 0, end = rank;
  if (c.opset() >= 15) {
    start = c.attrs().get_int("start", 0);
    end = c.attrs().get_int("end", rank);
  }
  auto clamp = [rank](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + rank : i, 0, rank); };
  start = clamp(start);
  end = std::max(start, clamp(end));
  c.set_output(0,
               Tensor::from_vector<int64_t>({end - start}, {s.begin() + start, s.begin() + end}));
}

void import_size(NodeContext& c) {
  c.set_output(0, Tensor::from_vector<int64_t>({}, {numel(c.input_shape(0))}));
}

// ConstantOfShape: the shape is a known int64 input; `value` a one-element tensor
// (default float 0).
void import_constant_of_shape(NodeContext& c) {
  Shape shape = c.const_ints(0, "input");
  DType dtype = DType::f32;
  double value = 0;
  if (const onnx::TensorProto* p = c.attrs().find_tensor("value")) {
    if (!dtype_from_onnx(p->data_type(), &dtype))
      c.unsupported(cat("attribute 'value' has element type ", onnx_type_name(p->data_type())));
    Tensor v;
    try {
      v = tensor_from_proto(*p, c.where());
    } catch (const Error& e) {
      c.fail(cat("attribute 'value': ", message_of(e)));
    }
    if (v.numel() != 1)
      c.attrs().fail("value", cat("must hold one element, got shape ", shape_str(v.shape())));
    value = v.get(0);
  }
  uint64_t nbytes = 0;
  c.check(io::shape_nbytes(shape, dtype_size(dtype), kMaxKnownTensorBytes, &nbytes),
          "input 0 (shape) ", shape_str(shape), " must be non-negative and at most ",
          kMaxKnownTensorBytes, " bytes of ", dtype_name(dtype));
  c.set_output(0, Tensor::full(dtype, shape, value));
}

// Gather on known tensors (the Shape -> Gather -> Concat chains of exported models): the
// result is known at import. out = data[:axis] + indices.shape + data[axis+1:].
// Gather from data computed at run time with known indices (attention's qkv[0], a class
// token's x[:, 0]): a scalar index is a slice and a squeeze, consecutive indices one slice
// (views, no copy); any other known indices (Swin V2's relative-position bias table) and
// indices computed at run time (an embedding's token ids) the gather op. Known indices are
// checked here; run-time ones by the kernels.
void import_gather_runtime(NodeContext& c) {
  const Shape& data = c.input_shape(0);
  const int64_t axis_attr = c.attrs().get_int("axis", 0);
  int64_t axis = 0;
  if (!normalize_axis(axis_attr, int64_t(data.size()), &axis))
    c.attrs().fail("axis", cat("is ", axis_attr, ", out of range for data ", shape_str(data)));
  const ValueId x = c.input(0);
  auto gather_op = [&] {
    c.set_output(0, c.emit1(OpKind::gather, GatherAttrs{axis}, {x, c.input(1)}));
  };
  if (!c.input_known(1)) return gather_op();
  const Shape& index_shape = c.input_shape(1);
  std::vector<int64_t> indices = c.const_ints_any_rank(1, "indices");
  const int64_t extent = data[size_t(axis)];
  for (int64_t& i : indices) {
    if (i < 0) i += extent;
    c.check(i >= 0 && i < extent, "input 1 (indices) has ", i < 0 ? i - extent : i,
            ", out of range for dim ", axis, " of extent ", extent);
  }
  if (index_shape.empty()) {
    const int64_t i = indices.at(0);
    const ValueId one = c.emit1(OpKind::slice, SliceAttrs{{i}, {i + 1}, {axis}, {1}}, {x}, "pick");
    c.set_output(0, c.emit1(OpKind::squeeze, AxesAttrs{{axis}}, {one}));
    return;
  }
  const bool one_run = index_shape.size() == 1 && !indices.empty() &&
                       indices.back() - indices.front() + 1 == int64_t(indices.size()) &&
                       std::is_sorted(indices.begin(), indices.end()) &&
                       std::adjacent_find(indices.begin(), indices.end()) == indices.end();
  if (!one_run) return gather_op();
  c.set_output(0, c.emit1(OpKind::slice,
                          SliceAttrs{{indices.front()}, {indices.back() + 1}, {axis}, {1}}, {x}));
}

void import_gather(NodeContext& c) {
  if (!c.input_known(0) || !c.input_known(1)) return import_gather_runtime(c);
  const Tensor& data = c.const_input(0, "data");
  std::vector<int64_t> indices = c.const_ints_any_rank(1, "indices");
  const Shape& index_shape = c.input_shape(1);
  const int64_t axis_attr = c.attrs().get_int("axis", 0);
  int64_t axis = 0;
  if (!normalize_axis(axis_attr, data.rank(), &axis))
    c.attrs().fail("axis",
                   cat("is ", axis_attr, ", out of range for data ", shape_str(data.shape())));
  const int64_t extent = data.shape()[size_t(axis)];
  Shape out_shape(data.shape().begin(), data.shape().begin() + axis);
  out_shape.insert(out_shape.end(), index_shape.begin(), index_shape.end());
  out_shape.insert(out_shape.end(), data.shape().begin() + axis + 1, data.shape().end());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= data.shape()[size_t(d)];
  for (int64_t d = axis + 1; d < data.rank(); ++d) inner *= data.shape()[size_t(d)];
  for (int64_t& i : indices) {
    if (i < 0) i += extent;
    c.check(i >= 0 && i < extent, "input 1 (indices) has ", i < 0 ? i - extent : i,
            ", out of range for dim ", axis, " of extent ", extent);
  }
  Tensor out = Tensor::empty(data.dtype(), out_shape);
  const size_t row = size_t(inner) * dtype_size(data.dtype());
  const auto* src = static_cast<const char*>(data.raw());
  auto* dst = static_cast<char*>(out.raw());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i : indices) {
      if (row) std::memcpy(dst, src + (o * extent + i) * int64_t(row), row);
      dst += row;
    }
  }
  c.set_output(0, out);
}

// Split: one slice per output along `axis`; the sizes from the `split` input (opset 13+) or
// attribute (earlier), known at import, else equal parts (the extent must divide).
void import_split(NodeContext& c) {
  const Shape& x = c.input_shape(0);
  const int64_t axis_attr = c.attrs().get_int("axis", 0);
  int64_t axis = 0;
  if (!normalize_axis(axis_attr, int64_t(x.size()), &axis))
    c.attrs().fail("axis", cat("is ", axis_attr, ", out of range for input ", shape_str(x)));
  const int64_t extent = x[size_t(axis)];
  const int outputs = c.output_count();
  std::vector<int64_t> sizes;
  if (c.opset() >= 13) {
    if (c.has_input(1)) sizes = c.const_ints(1, "split");
  } else {
    sizes = c.attrs().get_ints("split");
  }
  if (sizes.empty()) {
    c.check(extent % outputs == 0, "dim ", axis, " of input 0 ", shape_str(x),
            " does not split into ", outputs, " equal parts");
    sizes.assign(size_t(outputs), extent / outputs);
  }
  c.check(int64_t(sizes.size()) == outputs, "split has ", sizes.size(), " sizes for ", outputs,
          " outputs");
  int64_t offset = 0;
  for (int64_t s : sizes) {
    c.check(s >= 0, "split has a negative size ", s);
    offset += s;
  }
  c.check(offset == extent, "split sizes add up to ", offset, ", not dim ", axis, "'s extent ",
          extent);
  offset = 0;
  const ValueId in = c.input(0);
  for (int i = 0; i < outputs; ++i) {
    const int64_t size = sizes[size_t(i)];
    if (c.wants_output(i)) {
      SliceAttrs a{{offset}, {offset + size}, {axis}, {1}};
      c.set_output(i, c.emit1(OpKind::slice, a, {in}, outputs == 1 ? "" : cat("part", i)));
    }
    offset += size;
  }
}

// Tile(input, repeats known): x [d...] -> reshape [1, d0, 1, d1, ...] -> expand
// [r0, d0, r1, d1, ...] -> reshape [r0 d0, r1 d1, ...].
void import_tile(NodeContext& c) {
  const Shape& x = c.input_shape(0);
  const std::vector<int64_t> repeats = c.const_ints(1, "repeats");
  c.check(repeats.size() == x.size(), "input 1 (repeats) has ", repeats.size(),
          " values for an input of rank ", x.size());
  Shape spread, expanded, out;
  for (size_t d = 0; d < x.size(); ++d) {
    c.check(repeats[d] >= 0, "input 1 (repeats) has a negative repeat ", repeats[d]);
    spread.insert(spread.end(), {1, x[d]});
    expanded.insert(expanded.end(), {repeats[d], x[d]});
    out.push_back(repeats[d] * x[d]);
  }
  const ValueId s = c.emit1(OpKind::reshape, ReshapeAttrs{spread, true}, {c.input(0)}, "spread");
  const ValueId e = c.emit1(OpKind::expand, ExpandAttrs{expanded}, {s}, "repeat");
  c.set_output(0, c.emit1(OpKind::reshape, ReshapeAttrs{out, true}, {e}));
}

// Linear (bilinear, trilinear) upsampling by integer factors under half_pixel coordinates, as
// PyTorch's interpolate(align_corners=False): separable, one spatial dim at a time, each an
// edge pad of 1 (source coordinates clamp at the borders) and a depthwise transposed
// convolution with stride s, pad 2s and the 3s-tap kernel that puts the two interpolation
// weights of output i = q s + r on the padded inputs it reads:
//   source x = q + (r + 1/2) / s - 1/2, weights 1 - frac(x) and frac(x) on floor(x), floor(x)+1.
// Tap k (d = k - 2s) of the kernel: d in [0, s): max(0, 1/2 - (d + 1/2) / s);
// d in [-s, 0): 1/2 + (d + s + 1/2) / s while that is <= 1, else 3/2 - (d + s + 1/2) / s;
// d in [-2s, -s): max(0, (d + 2s + 1/2) / s - 1/2).
ValueId linear_upsample(NodeContext& c, ValueId x, const std::vector<int64_t>& factor) {
  Shape shape = c.graph().value(x).type.shape;
  const DType dtype = c.graph().value(x).type.dtype;
  const int64_t rank = int64_t(shape.size()), channels = shape[1];
  for (int64_t d = 2; d < rank; ++d) {
    const int64_t s = factor[size_t(d)];
    if (s == 1) continue;
    std::vector<double> taps(size_t(3 * s));
    for (int64_t k = 0; k < 3 * s; ++k) {
      const double t = double(k - 2 * s);
      const double pos = (t + double(s) * (t < -double(s) ? 2 : t < 0 ? 1 : 0) + 0.5) / double(s);
      if (t >= 0)
        taps[size_t(k)] = std::max(0.0, 0.5 - pos);
      else if (t >= -double(s))
        taps[size_t(k)] = pos < 0.5 ? 0.5 + pos : 1.5 - pos;
      else
        taps[size_t(k)] = std::max(0.0, pos - 0.5);
    }
    // Depthwise filter [C, 1, 1.., 3s, 1..]: the taps along dim d, extent 1 elsewhere.
    Shape w_shape(size_t(rank), 1);
    w_shape[0] = channels;
    w_shape[size_t(d)] = 3 * s;
    std::vector<double> w;
    for (int64_t ch = 0; ch < channels; ++ch) w.insert(w.end(), taps.begin(), taps.end());
    const std::string dim = std::to_string(d);
    const ValueId filter = c.constant(Tensor::from_doubles(dtype, w_shape, w), "taps" + dim);
    PadAttrs pad;
    pad.pads.assign(size_t(2 * rank), 0);
    pad.pads[size_t(d)] = pad.pads[size_t(rank + d)] = 1;
    pad.mode = PadMode::edge;
    const ValueId padded = c.emit1(OpKind::pad, pad, {x}, "edge" + dim);
    ConvBackwardDataAttrs a;
    const int64_t spatial = rank - 2;
    a.conv.strides.assign(size_t(spatial), 1);
    a.conv.dilations.assign(size_t(spatial), 1);
    a.conv.pads_begin.assign(size_t(spatial), 0);
    a.conv.pads_end.assign(size_t(spatial), 0);
    a.conv.strides[size_t(d - 2)] = s;
    a.conv.pads_begin[size_t(d - 2)] = a.conv.pads_end[size_t(d - 2)] = 2 * s;
    a.conv.groups = channels;
    shape[size_t(d)] *= s;
    a.input_spatial.assign(shape.begin() + 2, shape.end());
    x = c.emit1(OpKind::conv_backward_data, a, {padded, filter}, "interpolate" + dim);
  }
  return x;
}

// Resize (opsets 11-17) where it is a repeat: mode nearest with an integer upsampling factor
// per dim, under a coordinate mapping whose nearest pixel for output i is i / factor (floor):
// half_pixel and pytorch_half_pixel with round_prefer_floor or round_prefer_ceil, asymmetric
// with floor (or round_prefer_floor at factor 2). Dims of factor 1 pass through under any
// mode. As reshape + expand + reshape. Everything else (linear, cubic, downsampling,
// fractional factors, align_corners, ...) is refused as unsupported: it needs a resize kernel.
void import_resize(NodeContext& c) {
  const Shape& x = c.input_shape(0);
  const std::string mode = c.attrs().get_string("mode", "nearest");
  const std::string ctm = c.attrs().get_string("coordinate_transformation_mode", "half_pixel");
  const std::string nearest = c.attrs().get_string("nearest_mode", "round_prefer_floor");
  (void)c.attrs().get_float("cubic_coeff_a", -0.75);
  (void)c.attrs().get_int("exclude_outside", 0);
  (void)c.attrs().get_float("extrapolation_value", 0.0);
  Shape out = x;
  const Tensor* scales = c.optional_const_input(2, "scales");
  const Tensor* sizes = c.input_count() > 3 ? c.optional_const_input(3, "sizes") : nullptr;
  if (sizes != nullptr && sizes->numel() > 0) {
    c.check(scales == nullptr || scales->numel() == 0, "scales and sizes are both given");
    out = c.const_ints(3, "sizes");
    c.check(out.size() == x.size(), "input 3 (sizes) has ", out.size(), " values for rank ",
            x.size());
  } else {
    c.check(scales != nullptr && scales->numel() == int64_t(x.size()),
            "input 2 (scales) must hold ", x.size(), " values (or sizes must be given)");
    const std::vector<double> s = scales->to_doubles();
    for (size_t d = 0; d < x.size(); ++d) {
      c.check(s[d] > 0, "input 2 (scales) has a non-positive scale ", s[d]);
      out[d] = int64_t(std::floor(double(x[d]) * s[d]));
    }
  }
  std::vector<int64_t> factor(x.size(), 1);
  bool any = false;
  for (size_t d = 0; d < x.size(); ++d) {
    if (out[d] == x[d]) continue;
    if (x[d] == 0 || out[d] % x[d] != 0 || out[d] < x[d])
      c.unsupported(cat("Resize from ", shape_str(x), " to ", shape_str(out),
                        ": only integer upsampling factors (dim ", d, ": ", x[d], " -> ", out[d],
                        ")"));
    factor[d] = out[d] / x[d];
    any = true;
  }
  const bool centred = ctm == "half_pixel" || ctm == "pytorch_half_pixel";
  if (any && mode == "linear" && centred && factor[0] == 1 && factor[1] == 1) {
    c.set_output(0, linear_upsample(c, c.input(0), factor));
    return;
  }
  if (any) {
    if (mode != "nearest")
      c.unsupported(cat("Resize mode '", mode, "' with coordinate_transformation_mode '", ctm,
                        "' (only nearest upsampling by integer factors, and linear with "
                        "half_pixel or pytorch_half_pixel on the spatial dims)"));
    int64_t widest = 1;
    for (int64_t f : factor) widest = std::max(widest, f);
    const bool repeats =
        (centred && (nearest == "round_prefer_floor" || nearest == "round_prefer_ceil")) ||
        (ctm == "asymmetric" &&
         (nearest == "floor" || (nearest == "round_prefer_floor" && widest == 2)));
    if (!repeats)
      c.unsupported(cat("Resize nearest with coordinate_transformation_mode '", ctm,
                        "' and nearest_mode '", nearest, "' (not a plain repeat)"));
  }
  if (!any) {
    c.set_output(0, c.input(0));  // the loader adds an identity node
    return;
  }
  Shape spread, expanded;
  for (size_t d = 0; d < x.size(); ++d) {
    spread.push_back(x[d]);
    expanded.push_back(x[d]);
    if (factor[d] > 1) {
      spread.push_back(1);
      expanded.push_back(factor[d]);
    }
  }
  const ValueId s = c.emit1(OpKind::reshape, ReshapeAttrs{spread, true}, {c.input(0)}, "spread");
  const ValueId e = c.emit1(OpKind::expand, ExpandAttrs{expanded}, {s}, "repeat");
  c.set_output(0, c.emit1(OpKind::reshape, ReshapeAttrs{out, true}, {e}));
}

// GatherElements (torch.gather): the gather_elements op; its inference checks the indices.
void import_gather_elements(NodeContext& c) {
  const GatherAttrs a{c.attrs().get_int("axis", 0)};
  c.set_output(0, c.emit1(OpKind::gather_elements, a, {c.input(0), c.input(1)}));
}

// Trilu (torch.triu / tril): the last two dims [M, N] keep element (i, j) where j - i >= k
// (upper, the default) or j - i <= k (lower); k (input 1, default 0) must be known. A
// where over a known [M, N] mask, the rest zeros of x's dtype (folded when x is known too).
void import_trilu(NodeContext& c) {
  const Shape& x = c.input_shape(0);
  c.check(x.size() >= 2, "input 0 ", shape_str(x), " must have rank >= 2");
  int64_t k = 0;
  if (c.has_input(1)) {
    const std::vector<int64_t> ks = c.const_ints_any_rank(1, "k");
    c.check(ks.size() == 1, "input 1 (k) must hold one value, got ", ks.size());
    k = ks[0];
  }
  const bool upper = c.attrs().get_int("upper", 1) != 0;
  const int64_t m = x[x.size() - 2], n = x[x.size() - 1];
  uint64_t nbytes = 0;
  c.check(io::shape_nbytes({m, n}, 1, kMaxKnownTensorBytes, &nbytes), "its [", m, ", ", n,
          "] mask would pass ", kMaxKnownTensorBytes, " bytes");
  Tensor mask = Tensor::empty(DType::boolean, {m, n});
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) mask.data<bool>()[i * n + j] = upper ? j - i >= k : j - i <= k;
  const ValueId keep = c.constant(std::move(mask), "mask");
  const ValueId zero = c.constant(Tensor::scalar(c.input_type(0).dtype, 0.0), "zero");
  c.set_output(0, c.emit1(OpKind::where, {}, {keep, c.input(0), zero}));
}

const OpSpec kOps[] = {
    {"Resize", 11, 1, 4, 1, import_resize},
    {"Split", 11, 1, 2, kVariadic, import_split},
    {"Tile", 6, 2, 2, 1, import_tile},
    {"Reshape", 5, 2, 2, 1, import_reshape},
    {"Flatten", 1, 1, 1, 1, import_flatten},
    {"Transpose", 1, 1, 1, 1, import_transpose},
    {"Concat", 1, 1, kVariadic, 1, import_concat},
    {"Slice", 10, 3, 5, 1, import_slice},
    {"Pad", 11, 2, 3, 1, import_pad},
    {"Squeeze", 1, 1, 2, 1, import_squeeze},
    {"Unsqueeze", 1, 1, 2, 1, import_unsqueeze},
    {"Cast", 1, 1, 1, 1, import_cast},
    {"Constant", 1, 0, 0, 1, import_constant},
    {"Shape", 1, 1, 1, 1, import_shape},
    {"Size", 1, 1, 1, 1, import_size},
    {"ConstantOfShape", 9, 1, 1, 1, import_constant_of_shape},
    {"Gather", 1, 2, 2, 1, import_gather},
    {"GatherElements", 11, 2, 2, 1, import_gather_elements},
    {"Trilu", 14, 1, 2, 1, import_trilu},
};

}  // namespace

std::span<const OpSpec> shape_ops() {
  return kOps;
}

}  // namespace fusebox::onnx_import
