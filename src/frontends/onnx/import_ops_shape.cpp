// Shape and data-movement ops, Cast, and the ops whose results are known at import
// (Constant, Shape, Size, ConstantOfShape, and Gather on known tensors).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "frontends/onnx/import_context.h"
#include "fusebox/core/memory.h"
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

// Pad `x` circularly along dim d by b before and e after (each at most the extent):
// concat(x[D - b:], x, x[:e]). A negative pad crops.
ValueId wrap_pad(NodeContext& c, ValueId x, int64_t d, int64_t b, int64_t e) {
  const int64_t extent = c.graph().value(x).type.shape[size_t(d)];
  c.check(b <= extent && e <= extent, "wrap pads ", b, " and ", e, " of dim ", d,
          " exceed its extent ", extent);
  if (b < 0) x = c.emit1(OpKind::slice, SliceAttrs{{-b}, {extent}, {d}, {1}}, {x}, "crop");
  if (e < 0) {
    const int64_t now = c.graph().value(x).type.shape[size_t(d)];
    x = c.emit1(OpKind::slice, SliceAttrs{{0}, {now + e}, {d}, {1}}, {x}, "crop");
  }
  std::vector<ValueId> parts;
  const int64_t now = c.graph().value(x).type.shape[size_t(d)];
  if (b > 0)
    parts.push_back(
        c.emit1(OpKind::slice, SliceAttrs{{now - b}, {now}, {d}, {1}}, {x}, "wrap_begin"));
  parts.push_back(x);
  if (e > 0)
    parts.push_back(c.emit1(OpKind::slice, SliceAttrs{{0}, {e}, {d}, {1}}, {x}, "wrap_end"));
  return parts.size() == 1 ? x : c.emit1(OpKind::concat, ConcatAttrs{d}, parts, cat("wrap", d));
}

// Pad (opset 11+): pads [b0, b1, ..., e0, e1, ...] and constant_value are inputs; from opset
// 18 the optional input axes names the dims pads lists; opset 19 adds mode wrap (circular,
// as concatenated slices).
void import_pad(NodeContext& c) {
  PadAttrs a;
  const std::string mode = c.attrs().get_string("mode", "constant");
  const bool wrap = mode == "wrap" && c.opset() >= 19;
  if (mode == "constant")
    a.mode = PadMode::constant;
  else if (mode == "reflect")
    a.mode = PadMode::reflect;
  else if (mode == "edge")
    a.mode = PadMode::edge;
  else if (!wrap)
    c.attrs().unsupported_value("mode", mode,
                                c.opset() >= 19 ? "supported: constant, reflect, edge, wrap"
                                                : "supported: constant, reflect, edge");
  const std::vector<int64_t> pads = c.const_ints(1, "pads");
  const int64_t rank = c.input_rank(0);
  if (c.opset() >= 18 && c.input_count() > 3 && c.has_input(3)) {
    std::vector<int64_t> axes = c.const_ints(3, "axes");
    c.check(pads.size() == 2 * axes.size(), "input 1 (pads) has ", pads.size(), " values for ",
            axes.size(), " axes (expected 2 per axis)");
    a.pads.assign(size_t(2 * rank), 0);
    for (size_t i = 0; i < axes.size(); ++i) {
      int64_t d = 0;
      c.check(normalize_axis(axes[i], rank, &d), "input 3 (axes) has ", axes[i],
              ", out of range for rank ", rank);
      a.pads[size_t(d)] = pads[i];
      a.pads[size_t(rank + d)] = pads[axes.size() + i];
    }
  } else {
    c.check(c.opset() >= 18 || c.input_count() <= 3, "takes 2 or 3 inputs before opset 18, got ",
            c.input_count());
    a.pads = pads;
  }
  if (wrap) {
    c.check(int64_t(a.pads.size()) == 2 * rank, "input 1 (pads) has ", a.pads.size(),
            " values for rank ", rank, " (expected ", 2 * rank, ")");
    ValueId x = c.input(0);
    for (int64_t d = 0; d < rank; ++d)
      if (a.pads[size_t(d)] != 0 || a.pads[size_t(rank + d)] != 0)
        x = wrap_pad(c, x, d, a.pads[size_t(d)], a.pads[size_t(rank + d)]);
    c.set_output(0, x == c.input(0) ? c.emit1(OpKind::identity, {}, {x}) : x);
    return;
  }
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
  if (c.opset() >= 19) c.attrs().ignore("saturate");  // float8 targets only
  const int64_t to = c.attrs().required_int("to");
  CastAttrs a;
  if (to < 0 || to > 1000 || !dtype_from_onnx(int(to), &a.to))
    c.attrs().unsupported_value("to", onnx_type_name(int(to)),
                                "fusebox casts to FLOAT, DOUBLE, FLOAT16, BFLOAT16, INT64, "
                                "INT32 and BOOL");
  c.set_output(0, c.emit1(OpKind::cast, a, {c.input(0)}));
}

// CastLike (opset 15): a cast to input 1's dtype (torchlib's exports use it for scalars).
void import_cast_like(NodeContext& c) {
  if (c.opset() >= 19) c.attrs().ignore("saturate");  // float8 targets only
  c.set_output(0, c.emit1(OpKind::cast, CastAttrs{c.input_type(1).dtype}, {c.input(0)}));
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
  c.check(checked_tensor_size(shape, dtype_size(dtype), kMaxKnownTensorBytes).has_value(),
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
// attribute (earlier), known at import; else (opset 18) num_outputs parts of ceil(extent /
// num_outputs), the last one shorter; else equal parts (the extent must divide).
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
  const std::optional<int64_t> parts =
      c.opset() >= 18 ? c.attrs().find_int("num_outputs") : std::nullopt;
  if (parts) {
    c.check(sizes.empty(), "has both input 1 (split) and attribute num_outputs");
    if (*parts != outputs)
      c.attrs().fail("num_outputs", cat("is ", *parts, " but the node has ", outputs, " outputs"));
    const int64_t chunk = (extent + outputs - 1) / outputs;
    for (int i = 0; i < outputs; ++i)
      sizes.push_back(std::max<int64_t>(0, std::min(chunk, extent - int64_t(i) * chunk)));
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
    int64_t extent = 0;
    c.check(!__builtin_mul_overflow(repeats[d], x[d], &extent), "dim ", d, " repeated ", repeats[d],
            " times overflows int64");
    out.push_back(extent);
  }
  const ValueId s = c.emit1(OpKind::reshape, ReshapeAttrs{spread, true}, {c.input(0)}, "spread");
  const ValueId e = c.emit1(OpKind::expand, ExpandAttrs{expanded}, {s}, "repeat");
  c.set_output(0, c.emit1(OpKind::reshape, ReshapeAttrs{out, true}, {e}));
}

// Resize (opsets 11-19): the resize op (ops.h), every mode and coordinate mapping. roi,
// scales and sizes must be known; from opset 18 they may name only some dims (axes), and
// keep_aspect_ratio_policy may shrink or grow sizes to one common scale. As ONNX's
// reference: scales give floor(in * scale) elements; sizes give scales out / in. A nearest
// resize that only repeats every element an integer number of times (PyTorch's Upsample)
// becomes reshape + expand + reshape instead, which later passes see through.
void import_resize(NodeContext& c) {
  const Shape& x = c.input_shape(0);
  const size_t r = x.size();
  ResizeAttrs a;
  const std::string mode = c.attrs().get_string("mode", "nearest");
  bool known = false;
  for (auto m : {ResizeMode::nearest, ResizeMode::linear, ResizeMode::cubic}) {
    if (mode == resize_mode_name(m)) {
      a.mode = m;
      known = true;
    }
  }
  if (!known) c.attrs().unsupported_value("mode", mode, "supported: nearest, linear, cubic");
  const std::string ctm = c.attrs().get_string("coordinate_transformation_mode", "half_pixel");
  known = false;
  for (auto m : {ResizeCoordinates::half_pixel, ResizeCoordinates::half_pixel_symmetric,
                 ResizeCoordinates::pytorch_half_pixel, ResizeCoordinates::align_corners,
                 ResizeCoordinates::asymmetric, ResizeCoordinates::tf_crop_and_resize,
                 ResizeCoordinates::tf_half_pixel_for_nn}) {
    if (ctm == resize_coordinates_name(m) &&
        (m != ResizeCoordinates::half_pixel_symmetric || c.opset() >= 19) &&
        (m != ResizeCoordinates::tf_half_pixel_for_nn || c.opset() < 13)) {
      a.coordinates = m;
      known = true;
    }
  }
  if (!known)
    c.attrs().unsupported_value("coordinate_transformation_mode", ctm,
                                cat("supported in opset ", c.opset(),
                                    ": half_pixel, pytorch_half_pixel, align_corners, asymmetric, "
                                    "tf_crop_and_resize",
                                    c.opset() >= 19 ? ", half_pixel_symmetric" : "",
                                    c.opset() < 13 ? ", tf_half_pixel_for_nn" : ""));
  const std::string nearest = c.attrs().get_string("nearest_mode", "round_prefer_floor");
  known = false;
  for (auto m : {ResizeNearest::round_prefer_floor, ResizeNearest::round_prefer_ceil,
                 ResizeNearest::floor, ResizeNearest::ceil}) {
    if (nearest == resize_nearest_name(m)) {
      a.nearest = m;
      known = true;
    }
  }
  if (!known)
    c.attrs().unsupported_value("nearest_mode", nearest,
                                "supported: round_prefer_floor, round_prefer_ceil, floor, ceil");
  a.cubic_a = c.attrs().get_float("cubic_coeff_a", -0.75);
  a.exclude_outside = c.attrs().get_int("exclude_outside", 0) != 0;
  a.extrapolation_value = c.attrs().get_float("extrapolation_value", 0.0);

  // axes (opset 18): the dims that roi, scales and sizes list; the others keep scale 1.
  std::vector<int64_t> axes;
  if (c.opset() >= 18 && c.attrs().has("axes")) {
    for (int64_t ax : c.attrs().get_ints("axes")) {
      int64_t d = 0;
      if (!normalize_axis(ax, int64_t(r), &d))
        c.attrs().fail("axes", cat("has ", ax, ", out of range for input ", shape_str(x)));
      if (std::find(axes.begin(), axes.end(), d) != axes.end())
        c.attrs().fail("axes", cat("names dim ", d, " twice"));
      axes.push_back(d);
    }
  } else {
    for (size_t d = 0; d < r; ++d) axes.push_back(int64_t(d));
  }
  const size_t k = axes.size();

  a.scales.assign(r, 1.0);
  a.sizes.assign(x.begin(), x.end());
  a.roi_start.assign(r, 0.0);
  a.roi_end.assign(r, 1.0);
  const Tensor* roi = c.optional_const_input(1, "roi");
  if (roi != nullptr && roi->numel() > 0 &&
      a.coordinates == ResizeCoordinates::tf_crop_and_resize) {
    const std::vector<double> v = roi->to_doubles();
    c.check(v.size() == 2 * k, "input 1 (roi) has ", v.size(), " values, expected ", 2 * k,
            " (a start and an end per resized dim)");
    for (size_t i = 0; i < k; ++i) {
      a.roi_start[size_t(axes[i])] = v[i];
      a.roi_end[size_t(axes[i])] = v[k + i];
    }
  }
  const Tensor* scales = c.input_count() > 2 ? c.optional_const_input(2, "scales") : nullptr;
  const Tensor* sizes = c.input_count() > 3 ? c.optional_const_input(3, "sizes") : nullptr;
  const bool has_scales = scales != nullptr && scales->numel() > 0;
  const bool has_sizes = sizes != nullptr && sizes->numel() > 0;
  const std::string policy =
      c.opset() >= 18 ? c.attrs().get_string("keep_aspect_ratio_policy", "stretch") : "stretch";
  c.check(has_scales != has_sizes, has_scales ? "scales and sizes are both given"
                                              : "needs scales (input 2) or sizes (input 3)");
  if (has_sizes) {
    const std::vector<int64_t> v = c.const_ints(3, "sizes");
    c.check(v.size() == k, "input 3 (sizes) has ", v.size(), " values, expected ", k);
    for (size_t i = 0; i < k; ++i) {
      const size_t d = size_t(axes[i]);
      c.check(v[i] >= 0, "input 3 (sizes) has a negative size ", v[i]);
      c.check(x[d] > 0, "dim ", d, " of input 0 ", shape_str(x), " is empty");
      a.sizes[d] = v[i];
      a.scales[d] = double(v[i]) / double(x[d]);
    }
    if (policy == "not_larger" || policy == "not_smaller") {
      double scale = a.scales[size_t(axes[0])];
      for (int64_t d : axes)
        scale = policy == "not_larger" ? std::min(scale, a.scales[size_t(d)])
                                       : std::max(scale, a.scales[size_t(d)]);
      for (int64_t d : axes) {
        a.scales[size_t(d)] = scale;
        a.sizes[size_t(d)] = int64_t(scale * double(x[size_t(d)]) + 0.5);  // half up
      }
    } else if (policy != "stretch") {
      c.attrs().unsupported_value("keep_aspect_ratio_policy", policy,
                                  "supported: stretch, not_larger, not_smaller");
    }
  } else {
    const std::vector<double> v = scales->to_doubles();
    c.check(v.size() == k, "input 2 (scales) has ", v.size(), " values, expected ", k);
    for (size_t i = 0; i < k; ++i) {
      const size_t d = size_t(axes[i]);
      c.check(std::isfinite(v[i]) && v[i] > 0, "input 2 (scales) has the scale ", v[i],
              " (must be finite and > 0)");
      const double out = std::floor(v[i] * double(x[d]));
      c.check(out < 4e18, "input 2 (scales): scale ", v[i], " makes dim ", d, " too long");
      a.scales[d] = v[i];
      a.sizes[d] = int64_t(out);
    }
  }
  // antialias (opset 18) widens linear / cubic filters when downsampling; upsampling is the
  // same either way.
  if (c.opset() >= 18 && c.attrs().get_int("antialias", 0) != 0 && a.mode != ResizeMode::nearest) {
    for (size_t d = 0; d < r; ++d)
      if (a.scales[d] < 1)
        c.unsupported(cat("Resize with antialias=1 downsampling dim ", d, " (scale ", a.scales[d],
                          "): antialiased filters are not implemented"));
  }

  bool same = true, repeats = a.mode == ResizeMode::nearest;
  for (size_t d = 0; d < r; ++d) {
    if (a.sizes[d] == x[d] && a.scales[d] == 1.0) continue;
    same = false;
    const bool integer = x[d] > 0 && a.sizes[d] % x[d] == 0 && a.sizes[d] > x[d] &&
                         a.scales[d] == double(a.sizes[d] / x[d]);
    const bool centred = a.coordinates == ResizeCoordinates::half_pixel ||
                         a.coordinates == ResizeCoordinates::pytorch_half_pixel;
    // Output i reads i / factor (floor) under these mappings and rounding modes.
    repeats = repeats && integer &&
              ((centred && (a.nearest == ResizeNearest::round_prefer_floor ||
                            a.nearest == ResizeNearest::round_prefer_ceil)) ||
               (a.coordinates == ResizeCoordinates::asymmetric &&
                (a.nearest == ResizeNearest::floor ||
                 (a.nearest == ResizeNearest::round_prefer_floor && a.sizes[d] == 2 * x[d]))));
  }
  if (same && a.coordinates != ResizeCoordinates::tf_crop_and_resize) {
    c.set_output(0, c.input(0));  // the loader adds an identity node
    return;
  }
  if (!repeats) {
    c.set_output(0, c.emit1(OpKind::resize, a, {c.input(0)}));
    return;
  }
  Shape spread, expanded;
  for (size_t d = 0; d < r; ++d) {
    spread.push_back(x[d]);
    expanded.push_back(x[d]);
    if (a.sizes[d] > x[d]) {
      spread.push_back(1);
      expanded.push_back(a.sizes[d] / x[d]);
    }
  }
  const ValueId s = c.emit1(OpKind::reshape, ReshapeAttrs{spread, true}, {c.input(0)}, "spread");
  const ValueId e = c.emit1(OpKind::expand, ExpandAttrs{expanded}, {s}, "repeat");
  c.set_output(0, c.emit1(OpKind::reshape, ReshapeAttrs{a.sizes, true}, {e}));
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
  c.check(checked_tensor_size({m, n}, 1, kMaxKnownTensorBytes).has_value(), "its [", m, ", ", n,
          "] mask would pass ", kMaxKnownTensorBytes, " bytes");
  Tensor mask = Tensor::empty(DType::boolean, {m, n});
  // Over the mask's elements, not its rows: an empty mask may have 2^31 rows of none.
  for (int64_t e = 0; e < m * n; ++e) {
    const int64_t i = e / n, j = e % n;
    mask.data<bool>()[e] = upper ? j - i >= k : j - i <= k;
  }
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
    {"Pad", 11, 2, 4, 1, import_pad},
    {"Squeeze", 1, 1, 2, 1, import_squeeze},
    {"Unsqueeze", 1, 1, 2, 1, import_unsqueeze},
    {"Cast", 1, 1, 1, 1, import_cast},
    {"CastLike", 15, 2, 2, 1, import_cast_like},
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
