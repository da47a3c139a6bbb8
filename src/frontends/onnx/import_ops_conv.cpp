// Conv, ConvTranspose and the pools.
//
// ONNX pads are [x1_begin, x2_begin, ..., x1_end, x2_end, ...]; ours are split into
// pads_begin / pads_end. auto_pad SAME_UPPER / SAME_LOWER is resolved here into
// explicit pads (the IR is static): output = ceil(D / stride), the total padding
// (output-1)*stride + dilation*(k-1) + 1 - D split evenly, the odd element at the
// end (UPPER) or the beginning (LOWER).
#include <optional>

#include "frontends/onnx/import_context.h"

namespace fusebox::onnx_import {
namespace {

// Strides, dilations and kernel extents beyond this are refused before any arithmetic
// on them, so that no product below can overflow.
constexpr int64_t kMaxWindowValue = int64_t(1) << 30;
constexpr int64_t kMaxExtent = int64_t(1) << 40;

// A per-spatial-dim INTS attribute (strides, dilations, output_padding) of length S.
std::vector<int64_t> spatial_ints(NodeContext& c, const char* name, size_t S, int64_t fallback,
                                  int64_t min_value) {
  std::vector<int64_t> v = c.attrs().get_ints(name, std::vector<int64_t>(S, fallback));
  if (v.size() != S)
    c.attrs().fail(name, cat("has ", v.size(), " values ", shape_str(v), ", expected ", S,
                             " (one per spatial dim)"));
  for (int64_t x : v) {
    if (x < min_value || x > kMaxWindowValue)
      c.attrs().fail(name, cat("has the value ", x, " (", shape_str(v), "), expected ", min_value,
                               " to ", kMaxWindowValue));
  }
  return v;
}

// kernel_shape, when given, must agree with the weight's spatial extents.
void check_kernel_shape(NodeContext& c, const std::vector<int64_t>& kernel) {
  if (std::optional<std::vector<int64_t>> ks = c.attrs().find_ints("kernel_shape")) {
    if (*ks != kernel)
      c.attrs().fail("kernel_shape", cat("is ", shape_str(*ks),
                                         " but the weight's spatial "
                                         "extents are ",
                                         shape_str(kernel)));
  }
}

std::vector<int64_t> spatial_of(const Shape& s) {
  return {s.begin() + 2, s.end()};
}

struct SpatialPads {
  std::vector<int64_t> begin, end;
};

// The explicit `pads` attribute split into begin / end (zeros when absent).
SpatialPads explicit_pads(NodeContext& c, size_t S) {
  SpatialPads p{std::vector<int64_t>(S, 0), std::vector<int64_t>(S, 0)};
  std::optional<std::vector<int64_t>> pads = c.attrs().find_ints("pads");
  if (!pads) return p;
  if (pads->size() != 2 * S)
    c.attrs().fail("pads", cat("has ", pads->size(), " values ", shape_str(*pads), ", expected ",
                               2 * S, " ([begin..., end...] for ", S, " spatial dims)"));
  for (int64_t x : *pads) {
    if (x < 0 || x > kMaxWindowValue)
      c.attrs().fail("pads", cat("has the value ", x, " (", shape_str(*pads), "), expected 0 to ",
                                 kMaxWindowValue));
  }
  for (size_t i = 0; i < S; ++i) {
    p.begin[i] = (*pads)[i];
    p.end[i] = (*pads)[S + i];
  }
  return p;
}

// auto_pad and pads of a windowed op (Conv, the pools) over input extents `spatial`.
SpatialPads resolve_pads(NodeContext& c, const std::vector<int64_t>& spatial,
                         const std::vector<int64_t>& kernel, const std::vector<int64_t>& strides,
                         const std::vector<int64_t>& dilations) {
  const size_t S = spatial.size();
  const std::string auto_pad = c.attrs().get_string("auto_pad", "NOTSET");
  SpatialPads p = explicit_pads(c, S);
  if (auto_pad == "NOTSET") return p;
  const bool same_upper = auto_pad == "SAME_UPPER";
  if (auto_pad != "VALID" && !same_upper && auto_pad != "SAME_LOWER")
    c.attrs().unsupported_value("auto_pad", auto_pad,
                                "supported: NOTSET, VALID, SAME_UPPER, SAME_LOWER");
  for (size_t i = 0; i < S; ++i) {
    if (p.begin[i] != 0 || p.end[i] != 0)
      c.attrs().fail("pads", cat("is non-zero while auto_pad=", auto_pad,
                                 "; the two cannot be used together"));
  }
  if (auto_pad == "VALID") return p;
  for (size_t i = 0; i < S; ++i) {
    const int64_t out = (spatial[i] + strides[i] - 1) / strides[i];
    const int64_t window = dilations[i] * (kernel[i] - 1) + 1;
    const int64_t total = std::max<int64_t>(0, (out - 1) * strides[i] + window - spatial[i]);
    p.begin[i] = same_upper ? total / 2 : total - total / 2;
    p.end[i] = total - p.begin[i];
  }
  return p;
}

// Checks x [N, C, D...] against a window of S spatial dims, with extents small enough
// for the pad arithmetic below.
void expect_spatial_rank(NodeContext& c, int input, const char* role, size_t S) {
  const Shape& s = c.input_shape(input);
  c.check(s.size() == S + 2, "input ", input, " (", role, ") must have rank ", S + 2,
          " ([N, C] and ", S, " spatial dims), got shape ", shape_str(s));
  for (size_t i = 2; i < s.size(); ++i)
    c.check(s[i] <= kMaxExtent, "input ", input, " (", role, ") has a spatial extent over ",
            kMaxExtent, ": ", shape_str(s));
}

void import_conv(NodeContext& c) {
  const Shape& w = c.input_shape(1);
  c.check(w.size() >= 3 && w.size() <= 5, "input 1 (W) must have rank 3 to 5 ",
          "([M, C/group, k...]), got shape ", shape_str(w));
  const size_t S = w.size() - 2;
  expect_spatial_rank(c, 0, "X", S);
  const std::vector<int64_t> kernel = spatial_of(w);
  check_kernel_shape(c, kernel);
  for (int64_t k : kernel) c.check(k >= 1 && k <= kMaxWindowValue, "W has a kernel extent ", k);
  ConvAttrs a;
  a.strides = spatial_ints(c, "strides", S, 1, 1);
  a.dilations = spatial_ints(c, "dilations", S, 1, 1);
  a.groups = c.attrs().get_int("group", 1);
  SpatialPads p = resolve_pads(c, spatial_of(c.input_shape(0)), kernel, a.strides, a.dilations);
  a.pads_begin = p.begin;
  a.pads_end = p.end;
  std::vector<ValueId> in{c.input(0), c.input(1)};
  if (c.has_input(2)) in.push_back(c.input(2));
  c.set_output(0, c.emit1(OpKind::conv, a, in));
}

// ConvTranspose is our conv_backward_data: X [N, C_in, I...] plays dy, W [C_in, C_out/g, k...]
// is our w [K, C/g, R...] with K = C_in, and the output extent D is computed here.
// Per ONNX: full = stride*(I-1) + output_padding + dilation*(k-1) + 1; with output_shape
// (or auto_pad SAME_*, where output_shape = I*stride) the total padding full - output_shape
// is split (SAME_UPPER: begin = floor(total/2); otherwise end = floor(total/2)); else pads.
// D = full - pad_begin - pad_end. A negative end pad (output larger than the transposed
// extent) becomes extra zero rows at the end, which our op allows up to stride - 1.
void import_conv_transpose(NodeContext& c) {
  const Shape& w = c.input_shape(1);
  c.check(w.size() >= 3 && w.size() <= 5, "input 1 (W) must have rank 3 to 5 ",
          "([C_in, C_out/group, k...]), got shape ", shape_str(w));
  const size_t S = w.size() - 2;
  expect_spatial_rank(c, 0, "X", S);
  const std::vector<int64_t> kernel = spatial_of(w);
  const std::vector<int64_t> in = spatial_of(c.input_shape(0));
  check_kernel_shape(c, kernel);
  for (int64_t k : kernel) c.check(k >= 1 && k <= kMaxWindowValue, "W has a kernel extent ", k);
  ConvBackwardDataAttrs a;
  a.conv.strides = spatial_ints(c, "strides", S, 1, 1);
  a.conv.dilations = spatial_ints(c, "dilations", S, 1, 1);
  a.conv.groups = c.attrs().get_int("group", 1);
  const std::vector<int64_t> output_padding = spatial_ints(c, "output_padding", S, 0, 0);
  std::optional<std::vector<int64_t>> output_shape = c.attrs().find_ints("output_shape");
  if (output_shape && output_shape->size() == S + 2)  // some exporters include N and C
    output_shape->erase(output_shape->begin(), output_shape->begin() + 2);
  if (output_shape && output_shape->size() != S)
    c.attrs().fail("output_shape", cat("has ", output_shape->size(), " values, expected ", S));

  const std::string auto_pad = c.attrs().get_string("auto_pad", "NOTSET");
  const bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  if (auto_pad != "NOTSET" && auto_pad != "VALID" && !same)
    c.attrs().unsupported_value("auto_pad", auto_pad,
                                "supported: NOTSET, VALID, SAME_UPPER, SAME_LOWER");
  SpatialPads p = explicit_pads(c, S);
  const bool pads_given = c.attrs().has("pads");
  if ((output_shape || auto_pad != "NOTSET") && pads_given) {
    for (size_t i = 0; i < S; ++i) {
      if (p.begin[i] != 0 || p.end[i] != 0)
        c.attrs().fail("pads", output_shape ? "cannot be combined with output_shape"
                                            : "cannot be combined with auto_pad");
    }
  }
  a.input_spatial.resize(S);
  a.conv.pads_begin.resize(S);
  a.conv.pads_end.resize(S);
  for (size_t i = 0; i < S; ++i) {
    const int64_t stride = a.conv.strides[i];
    c.check(in[i] >= 1, "input 0 (X) has an empty spatial dim: ", shape_str(c.input_shape(0)));
    const int64_t full =
        stride * (in[i] - 1) + output_padding[i] + a.conv.dilations[i] * (kernel[i] - 1) + 1;
    int64_t begin = p.begin[i], end = p.end[i];
    if (output_shape || same) {
      const int64_t target = output_shape ? (*output_shape)[i] : in[i] * stride;
      if (target < 1) c.attrs().fail("output_shape", cat("has the non-positive extent ", target));
      const int64_t total = full - target;
      const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);  // floor(total / 2)
      if (auto_pad == "SAME_UPPER") {
        begin = half;
        end = total - half;
      } else {
        end = half;
        begin = total - half;
      }
    } else if (auto_pad == "VALID") {
      begin = end = 0;
    }
    const int64_t extent = full - begin - end;
    // Rows past the transposed extent (a negative end pad, or output_padding) are zeros;
    // our op expresses them through D alone, and only up to stride - 1 of them.
    const int64_t extra_zeros = (end < 0 ? -end : 0) + output_padding[i];
    if (begin < 0 || extra_zeros >= stride) {
      c.unsupported(cat("spatial dim ", i, ": the output extent ", extent, " needs ",
                        begin < 0 ? cat(-begin, " zero rows before the transposed result")
                                  : cat(extra_zeros, " zero rows after it (at most stride - 1 = ",
                                        stride - 1, " are supported)")));
    }
    a.conv.pads_begin[i] = begin;
    a.conv.pads_end[i] = std::max<int64_t>(end, 0);
    a.input_spatial[i] = extent;
  }
  std::vector<ValueId> ins{c.input(0), c.input(1)};
  if (c.has_input(2)) ins.push_back(c.input(2));
  c.set_output(0, c.emit1(OpKind::conv_backward_data, a, ins));
}

// The pools' shared attributes; `dilations` only where the op has it (MaxPool; AveragePool
// from opset 19).
PoolAttrs pool_attrs(NodeContext& c, bool has_dilations) {
  c.check(c.input_rank(0) >= 3 && c.input_rank(0) <= 5, "input 0 (X) must have rank 3 to 5 ",
          "([N, C, D...]), got shape ", shape_str(c.input_shape(0)));
  const size_t S = size_t(c.input_rank(0)) - 2;
  expect_spatial_rank(c, 0, "X", S);
  PoolAttrs a;
  a.kernel = c.attrs().required_ints("kernel_shape");
  if (a.kernel.size() != S)
    c.attrs().fail("kernel_shape", cat("has ", a.kernel.size(), " values ", shape_str(a.kernel),
                                       ", expected ", S, " (one per spatial dim of X)"));
  for (int64_t k : a.kernel) {
    if (k < 1 || k > kMaxWindowValue)
      c.attrs().fail("kernel_shape", cat("has the value ", k, ", expected 1 to ", kMaxWindowValue));
  }
  a.strides = spatial_ints(c, "strides", S, 1, 1);
  a.dilations = has_dilations ? spatial_ints(c, "dilations", S, 1, 1) : std::vector<int64_t>(S, 1);
  SpatialPads p = resolve_pads(c, spatial_of(c.input_shape(0)), a.kernel, a.strides, a.dilations);
  a.pads_begin = p.begin;
  a.pads_end = p.end;
  a.ceil_mode = c.attrs().get_bool("ceil_mode", false);
  return a;
}

void import_max_pool(NodeContext& c) {
  PoolAttrs a = pool_attrs(c, true);
  const int64_t storage_order = c.attrs().get_int("storage_order", 0);
  if (storage_order != 0)
    c.attrs().unsupported_value("storage_order", std::to_string(storage_order), "only 0");
  a.return_indices = c.wants_output(1);
  std::vector<ValueId> outs = c.emit(OpKind::max_pool, a, {c.input(0)});
  c.set_output(0, outs.at(0));
  if (a.return_indices) c.set_output(1, outs.at(1));
}

void import_avg_pool(NodeContext& c) {
  PoolAttrs a = pool_attrs(c, c.opset() >= 19);  // dilations from opset 19
  a.count_include_pad = c.attrs().get_bool("count_include_pad", false);
  c.set_output(0, c.emit1(OpKind::avg_pool, a, {c.input(0)}));
}

void import_global_avg_pool(NodeContext& c) {
  c.set_output(0, c.emit1(OpKind::global_avg_pool, {}, {c.input(0)}));
}

// GlobalMaxPool: the maximum over every spatial dim, kept as extent 1.
void import_global_max_pool(NodeContext& c) {
  c.check(c.input_rank(0) >= 3, "input 0 (X) must have rank 3 or more ([N, C, D...]), got ",
          shape_str(c.input_shape(0)));
  ReduceAttrs a;
  for (int64_t d = 2; d < c.input_rank(0); ++d) a.axes.push_back(d);
  a.keepdims = true;
  c.set_output(0, c.emit1(OpKind::reduce_max, a, {c.input(0)}));
}

const OpSpec kOps[] = {
    {"Conv", 1, 2, 3, 1, import_conv},
    {"ConvTranspose", 1, 2, 3, 1, import_conv_transpose},
    {"MaxPool", 1, 1, 1, 2, import_max_pool},
    {"AveragePool", 1, 1, 1, 1, import_avg_pool},
    {"GlobalAveragePool", 1, 1, 1, 1, import_global_avg_pool},
    {"GlobalMaxPool", 1, 1, 1, 1, import_global_max_pool},
};

}  // namespace

std::span<const OpSpec> conv_pool_ops() {
  return kOps;
}

}  // namespace fusebox::onnx_import
