// Inference for the shape and data-movement ops: reshape, flatten, transpose,
// concat, slice, pad, squeeze, unsqueeze, cast, constant, identity. These take
// any dtype and keep it (cast excepted).
#include <algorithm>
#include <cmath>

#include "infer_common.h"

namespace fusebox::infer {

// reshape (ONNX): 0 copies x's extent at that index (unless allow_zero), one -1 is
// inferred. Normalises shape to the final extents and sets allow_zero, so that a 0
// left in the shape is literal and re-inference changes nothing.
Types infer_reshape(Context& c) {
  ReshapeAttrs& a = c.attrs<ReshapeAttrs>();
  const Shape& x = c.shape(0);
  Shape out = a.shape;
  int64_t inferred = -1;  // index of the -1
  bool has_zero = false;
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t d = out[i];
    if (d == -1) {
      FUSEBOX_INFER_CHECK(c, inferred < 0, "shape ", shape_str(a.shape), " has more than one -1");
      inferred = int64_t(i);
    } else if (d == 0 && !a.allow_zero) {
      FUSEBOX_INFER_CHECK(c, i < x.size(), "shape ", shape_str(a.shape), " has 0 at index ", i,
                          ", which copies that dim of ", c.shaped(0), ", but x has rank ",
                          x.size());
      out[i] = x[i];
    } else {
      FUSEBOX_INFER_CHECK(c, d >= 0, "shape ", shape_str(a.shape), " has extent ", d, " at index ",
                          i, " (extents are >= 0, or -1 for the inferred one)");
      has_zero = has_zero || d == 0;
    }
  }
  FUSEBOX_INFER_CHECK(c, !(has_zero && inferred >= 0), "shape ", shape_str(a.shape),
                      " holds both 0 (literal, allow_zero) and -1, so the -1 cannot be inferred");
  const int64_t total = c.product(x, 0, x.size());
  if (inferred >= 0) {
    out[size_t(inferred)] = 1;
    const int64_t known = c.product(out, 0, out.size());
    FUSEBOX_INFER_CHECK(c, known != 0, "shape ", shape_str(a.shape),
                        ": the -1 cannot be inferred when the other extents multiply to 0");
    FUSEBOX_INFER_CHECK(c, total % known == 0, "shape ", shape_str(a.shape), " does not fit ",
                        c.shaped(0), ": ", total, " elements are not a multiple of ", known);
    out[size_t(inferred)] = total / known;
  }
  const int64_t count = c.product(out, 0, out.size());
  FUSEBOX_INFER_CHECK(c, count == total, "shape ", shape_str(a.shape), " resolves to ",
                      shape_str(out), " (", count, " elements) but ", c.shaped(0), " has ", total);
  a.shape = out;
  a.allow_zero = true;
  return {{c.dtype(0), out}};
}

// flatten: axis in [-rank, rank] (normalised to [0, rank]); [d0..d(axis-1)] x [d(axis)..].
Types infer_flatten(Context& c) {
  FlattenAttrs& a = c.attrs<FlattenAttrs>();
  const Shape& x = c.shape(0);
  const int64_t r = c.rank(0);
  FUSEBOX_INFER_CHECK(c, a.axis >= -r && a.axis <= r, "axis ", a.axis, " is out of range for rank ",
                      r, " (valid: ", -r, " to ", r, ")");
  if (a.axis < 0) a.axis += r;
  const size_t axis = size_t(a.axis);
  return {{c.dtype(0), {c.product(x, 0, axis), c.product(x, axis, x.size())}}};
}

// transpose: output dim i is input dim perm[i]; an empty perm reverses the dims.
Types infer_transpose(Context& c) {
  TransposeAttrs& a = c.attrs<TransposeAttrs>();
  const Shape& x = c.shape(0);
  const int64_t r = c.rank(0);
  if (a.perm.empty()) {
    for (int64_t d = r - 1; d >= 0; --d) a.perm.push_back(d);
  }
  FUSEBOX_INFER_CHECK(c, int64_t(a.perm.size()) == r, "perm ", shape_str(a.perm), " has ",
                      a.perm.size(), " entries but ", c.shaped(0), " has rank ", r);
  std::vector<bool> seen(size_t(r), false);
  Shape y;
  for (size_t i = 0; i < a.perm.size(); ++i) {
    int64_t d = 0;
    FUSEBOX_INFER_CHECK(c, normalize_axis(a.perm[i], r, &d) && !seen[size_t(d)], "perm ",
                        shape_str(a.perm), " is not a permutation of the ", r, " dims of ",
                        c.shaped(0));
    seen[size_t(d)] = true;
    a.perm[i] = d;
    y.push_back(x[size_t(d)]);
  }
  return {{c.dtype(0), y}};
}

// concat: every input has input 0's dtype and rank, and its extents outside `axis`.
Types infer_concat(Context& c) {
  ConcatAttrs& a = c.attrs<ConcatAttrs>();
  const int64_t r = c.rank(0);
  FUSEBOX_INFER_CHECK(c, r >= 1, "cannot concatenate rank-0 tensors (", c.shaped(0), ")");
  a.axis = c.axis(a.axis, r, "axis");
  Shape y = c.shape(0);
  for (int i = 1; i < c.count(); ++i) {
    c.expect_same_dtype(i, 0);
    bool fits = c.rank(i) == r;
    for (int64_t d = 0; fits && d < r; ++d)
      fits = d == a.axis || c.shape(i)[size_t(d)] == y[size_t(d)];
    FUSEBOX_INFER_CHECK(c, fits, c.shaped(i), " does not match ", c.shaped(0), " outside axis ",
                        a.axis);
    y[size_t(a.axis)] = c.add(y[size_t(a.axis)], c.shape(i)[size_t(a.axis)]);
  }
  return {{c.dtype(0), y}};
}

// slice (ONNX): per listed axis, starts/ends count from the end when negative and
// are clamped; steps may be negative, never 0. Normalised (see graph.h): axes and
// steps filled and non-negative axes; with step > 0, start and end in [0, dim];
// with step < 0, start in [0, dim-1] and end in [-1, dim-1], -1 meaning "before
// index 0". SliceAttrs::normalized marks that form, so re-inference reads the bounds
// literally (an ONNX end of -1 with a negative step means dim-1 instead). An axis of
// extent 0 normalises to start = end = 0.
Types infer_slice(Context& c) {
  SliceAttrs& a = c.attrs<SliceAttrs>();
  const Shape& x = c.shape(0);
  const int64_t r = c.rank(0);
  const size_t n = a.starts.size();
  FUSEBOX_INFER_CHECK(c, a.ends.size() == n, "starts ", shape_str(a.starts), " and ends ",
                      shape_str(a.ends), " must have the same length");
  if (a.axes.empty()) {
    for (size_t i = 0; i < n; ++i) a.axes.push_back(int64_t(i));
  }
  if (a.steps.empty()) a.steps.assign(n, 1);
  FUSEBOX_INFER_CHECK(c, a.axes.size() == n, "axes ", shape_str(a.axes),
                      " must have one entry per start (", n, ")");
  FUSEBOX_INFER_CHECK(c, a.steps.size() == n, "steps ", shape_str(a.steps),
                      " must have one entry per start (", n, ")");
  a.axes = c.axes(a.axes, r, "axes");

  Shape y = x;
  for (size_t k = 0; k < n; ++k) {
    const int64_t dim = x[size_t(a.axes[k])], step = a.steps[k];
    FUSEBOX_INFER_CHECK(c, step != 0, "steps ", shape_str(a.steps), " has a 0 at index ", k);
    int64_t start = a.starts[k], end = a.ends[k], count = 0;
    if (dim == 0) {
      start = end = 0;
    } else if (step > 0) {
      if (!a.normalized) {
        start = start < 0 ? start + dim : start;
        end = end < 0 ? end + dim : end;
      }
      start = std::clamp(start, int64_t{0}, dim);
      end = std::clamp(end, int64_t{0}, dim);
      count = end > start ? (end - start - 1) / step + 1 : 0;
    } else {
      if (!a.normalized) {
        start = start < 0 ? start + dim : start;
        end = end < 0 ? end + dim : end;
      }
      start = std::clamp(start, int64_t{0}, dim - 1);
      end = std::clamp(end, int64_t{-1}, dim - 1);
      const uint64_t magnitude = uint64_t(-(step + 1)) + 1;  // |step| without overflow
      count = start > end ? int64_t(uint64_t(start - end - 1) / magnitude) + 1 : 0;
    }
    a.starts[k] = start;
    a.ends[k] = end;
    y[size_t(a.axes[k])] = count;
  }
  a.normalized = true;
  return {{c.dtype(0), y}};
}

// pad: pads = [b0, b1, ..., e0, e1, ...], negative crops. Reflect needs each
// positive pad <= extent - 1; edge needs a non-empty dim to copy.
Types infer_pad(Context& c) {
  const PadAttrs& a = c.attrs<PadAttrs>();
  const Shape& x = c.shape(0);
  const size_t r = x.size();
  FUSEBOX_INFER_CHECK(
      c, a.mode == PadMode::constant || a.mode == PadMode::reflect || a.mode == PadMode::edge,
      "unknown pad mode ", int(a.mode));
  FUSEBOX_INFER_CHECK(c, a.pads.size() == 2 * r, "pads ", shape_str(a.pads), " has ", a.pads.size(),
                      " values but ", c.shaped(0), " needs 2 * rank = ", 2 * r,
                      " ([begin..., end...])");
  if (a.mode == PadMode::constant && !is_floating(c.dtype(0))) {
    FUSEBOX_INFER_CHECK(c, std::isfinite(a.value) && a.value == std::trunc(a.value), "value ",
                        a.value, " cannot be stored in ", dtype_name(c.dtype(0)));
  }
  Shape y(r);
  for (size_t d = 0; d < r; ++d) {
    const int64_t begin = a.pads[d], end = a.pads[r + d];
    y[d] = c.add(c.add(x[d], begin), end);
    FUSEBOX_INFER_CHECK(c, y[d] >= 0, "pads ", shape_str(a.pads), " crop dim ", d, " of ",
                        c.shaped(0), " to a negative extent ", y[d]);
    if (begin <= 0 && end <= 0) continue;
    if (a.mode == PadMode::reflect) {
      FUSEBOX_INFER_CHECK(c, begin <= x[d] - 1 && end <= x[d] - 1, "reflect pads ",
                          shape_str(a.pads), " exceed dim ", d, " of ", c.shaped(0), ": at most ",
                          std::max<int64_t>(x[d] - 1, 0), " per side (extent - 1)");
    } else if (a.mode == PadMode::edge) {
      FUSEBOX_INFER_CHECK(c, x[d] >= 1, "edge pads ", shape_str(a.pads), " extend dim ", d, " of ",
                          c.shaped(0), ", which is empty");
    }
  }
  return {{c.dtype(0), y}};
}

// squeeze: removes the listed dims (each of extent 1), or every dim of extent 1
// when none are listed. Normalises axes to an explicit, sorted list.
Types infer_squeeze(Context& c) {
  AxesAttrs& a = c.attrs<AxesAttrs>();
  const Shape& x = c.shape(0);
  std::vector<int64_t> axes;
  if (a.axes.empty()) {
    for (size_t d = 0; d < x.size(); ++d)
      if (x[d] == 1) axes.push_back(int64_t(d));
  } else {
    axes = c.axes(a.axes, c.rank(0), "axes");
    std::sort(axes.begin(), axes.end());
  }
  for (int64_t d : axes)
    FUSEBOX_INFER_CHECK(c, x[size_t(d)] == 1, "axis ", d, " of ", c.shaped(0), " has extent ",
                        x[size_t(d)], ", not 1, so it cannot be squeezed");
  Shape y;
  for (size_t d = 0; d < x.size(); ++d)
    if (!std::binary_search(axes.begin(), axes.end(), int64_t(d))) y.push_back(x[d]);
  a.axes = axes;
  return {{c.dtype(0), y}};
}

// unsqueeze: inserts dims of extent 1 at the listed positions of the output.
// Normalises axes against the output rank and sorts them.
Types infer_unsqueeze(Context& c) {
  AxesAttrs& a = c.attrs<AxesAttrs>();
  const Shape& x = c.shape(0);
  FUSEBOX_INFER_CHECK(c, !a.axes.empty(), "axes must list at least one new dim");
  const int64_t out_rank = c.rank(0) + int64_t(a.axes.size());
  std::vector<int64_t> axes = c.axes(a.axes, out_rank, "axes");
  std::sort(axes.begin(), axes.end());
  Shape y;
  size_t next = 0;  // next dim of x to copy
  for (int64_t d = 0; d < out_rank; ++d)
    y.push_back(std::binary_search(axes.begin(), axes.end(), d) ? 1 : x[next++]);
  a.axes = axes;
  return {{c.dtype(0), y}};
}

Types infer_cast(Context& c) {
  const DType to = c.attrs<CastAttrs>().to;
  FUSEBOX_INFER_CHECK(c, int(to) < kNumDTypes, "unknown target dtype ", int(to));
  return {{to, c.shape(0)}};
}

Types infer_constant(Context& c) {
  const Tensor& v = c.attrs<ConstantAttrs>().value;
  FUSEBOX_INFER_CHECK(c, v.defined(), "value holds no tensor");
  return {{v.dtype(), v.shape()}};
}

Types infer_identity(Context& c) {
  return {c.type(0)};
}

namespace {
// gather and gather_elements: data of rank >= 1 (any dtype), i64 or i32 indices; the axis
// normalised.
const GatherAttrs& check_gather_inputs(Context& c) {
  GatherAttrs& a = c.attrs<GatherAttrs>();
  FUSEBOX_INFER_CHECK(c, c.rank(0) >= 1, c.op_name(), " from a scalar ", c.shaped(0));
  a.axis = c.axis(a.axis, c.rank(0), "axis");
  FUSEBOX_INFER_CHECK(c, c.dtype(1) == DType::i64 || c.dtype(1) == DType::i32, c.input(1),
                      " must be i64 or i32, got ", dtype_name(c.dtype(1)));
  // No index can name an element of an empty axis (PyTorch refuses such a gather too).
  FUSEBOX_INFER_CHECK(c, c.shape(0)[size_t(a.axis)] > 0 || numel(c.shape(1)) == 0, c.op_name(),
                      " along axis ", a.axis, " of ", c.shaped(0), ", which is empty, with ",
                      c.shaped(1), ": every index would be out of range");
  return a;
}
}  // namespace

// gather: data [.., extent, ..] (any dtype, rank >= 1), indices (i64 or i32, any rank)
// -> data's shape with dim `axis` replaced by the indices' shape; the axis normalised.
Types infer_gather(Context& c) {
  const GatherAttrs& a = check_gather_inputs(c);
  const Shape& data = c.shape(0);
  Shape y(data.begin(), data.begin() + a.axis);
  y.insert(y.end(), c.shape(1).begin(), c.shape(1).end());
  y.insert(y.end(), data.begin() + a.axis + 1, data.end());
  return {{c.dtype(0), y}};
}

// gather_elements: data (any dtype), indices (i64 or i32) of data's rank, at most data's
// extent along every dim but `axis` -> the indices' shape, data's dtype.
Types infer_gather_elements(Context& c) {
  const GatherAttrs& a = check_gather_inputs(c);
  FUSEBOX_INFER_CHECK(c, c.rank(1) == c.rank(0), c.shaped(1), " must have the rank of ",
                      c.shaped(0));
  for (int64_t d = 0; d < c.rank(0); ++d)
    FUSEBOX_INFER_CHECK(c, d == a.axis || c.shape(1)[size_t(d)] <= c.shape(0)[size_t(d)],
                        c.shaped(1), " is longer than ", c.shaped(0), " along dim ", d,
                        " (not the gathered axis)");
  return {{c.dtype(0), c.shape(1)}};
}

// resize (ops.h): sizes, one non-negative extent per dim of x; scales (filled with out / in
// when empty) and roi (filled with [0, 1]) per dim; linear / cubic need floats. A dim of
// extent 0 can only resize to 0 (there is nothing to read).
Types infer_resize(Context& c) {
  ResizeAttrs& a = c.attrs<ResizeAttrs>();
  const Shape& x = c.shape(0);
  const size_t r = x.size();
  FUSEBOX_INFER_CHECK(
      c,
      a.mode == ResizeMode::nearest || a.mode == ResizeMode::linear || a.mode == ResizeMode::cubic,
      "unknown resize mode ", int(a.mode));
  FUSEBOX_INFER_CHECK(c, int(a.coordinates) <= int(ResizeCoordinates::tf_half_pixel_for_nn),
                      "unknown coordinate mode ", int(a.coordinates));
  FUSEBOX_INFER_CHECK(c, int(a.nearest) <= int(ResizeNearest::ceil), "unknown nearest mode ",
                      int(a.nearest));
  if (a.mode != ResizeMode::nearest) c.expect_float(0);
  FUSEBOX_INFER_CHECK(c, a.sizes.size() == r, "sizes ", shape_str(a.sizes), " has ", a.sizes.size(),
                      " values for ", c.shaped(0));
  for (size_t d = 0; d < r; ++d) {
    FUSEBOX_INFER_CHECK(c, a.sizes[d] >= 0, "sizes ", shape_str(a.sizes), " has a negative extent");
    FUSEBOX_INFER_CHECK(c, x[d] > 0 || a.sizes[d] == 0, "dim ", d, " of ", c.shaped(0),
                        " is empty and cannot resize to ", a.sizes[d]);
  }
  if (a.scales.empty())
    for (size_t d = 0; d < r; ++d)
      a.scales.push_back(x[d] > 0 ? double(a.sizes[d]) / double(x[d]) : 1.0);
  FUSEBOX_INFER_CHECK(c, a.scales.size() == r, "scales has ", a.scales.size(), " values for ",
                      c.shaped(0));
  for (double s : a.scales)
    FUSEBOX_INFER_CHECK(c, std::isfinite(s) && s > 0, "scales has the value ", s,
                        " (must be finite and > 0)");
  if (a.roi_start.empty()) a.roi_start.assign(r, 0.0);
  if (a.roi_end.empty()) a.roi_end.assign(r, 1.0);
  FUSEBOX_INFER_CHECK(c, a.roi_start.size() == r && a.roi_end.size() == r, "roi has ",
                      a.roi_start.size(), "+", a.roi_end.size(), " values for ", c.shaped(0),
                      " (one start and one end per dim)");
  for (size_t d = 0; d < r; ++d)
    FUSEBOX_INFER_CHECK(c, std::isfinite(a.roi_start[d]) && std::isfinite(a.roi_end[d]),
                        "roi of dim ", d, " is not finite");
  FUSEBOX_INFER_CHECK(c, std::isfinite(a.cubic_a), "cubic_coeff_a ", a.cubic_a, " must be finite");
  return {{c.dtype(0), Shape(a.sizes.begin(), a.sizes.end())}};
}

}  // namespace fusebox::infer
