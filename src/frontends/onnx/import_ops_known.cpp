// Ops fusebox evaluates at import on inputs known there: the comparisons, logic, Where, Mod,
// Range, ScatterND, ScatterElements and GatherND that exporters put into shape arithmetic and
// constant masks (Shape -> Equal -> Where -> Reshape, window padding via Mod, index ranges). Their
// results are known tensors, so the chain folds to constants before any node reaches the
// graph. On values computed at run time: the comparisons, logic ops and Where become the
// graph's ops of the same names (a causal mask applied with Where); Mod (float or integer) becomes
// arithmetic; the scatters and GatherND with known indices become gathers (and wheres); Range
// is refused as unsupported, naming the input (NodeContext::const_input). Expand is
// imported as the graph's expand op (any input; the shape must be known).
#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "frontends/onnx/import_context.h"

namespace fusebox::onnx_import {
namespace {

// Known tensors are refused beyond this many elements (Range): 16 Mi, 128 MiB of the importer's
// own vectors, which the host budget does not see (2^28 let a 182-byte model take 1 GiB and more
// at import). Values known at import are shapes and index tables, far below it.
constexpr int64_t kMaxKnownElements = int64_t(1) << 24;

// A known input's values: exactly as int64 for integer and bool tensors (INT64_MAX, the
// exporters' "to the end" sentinel, survives), as double for floating ones.
struct Values {
  DType dtype = DType::f32;
  Shape shape;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  bool integer() const { return !is_floating(dtype); }
};

Values known(NodeContext& c, int i, const char* role) {
  const Tensor& t = c.const_input(i, role);
  Values v;
  v.dtype = t.dtype();
  v.shape = t.shape();
  if (v.dtype == DType::boolean) {
    v.ints.resize(size_t(t.numel()));
    for (int64_t k = 0; k < t.numel(); ++k) v.ints[size_t(k)] = t.data<bool>()[k] ? 1 : 0;
  } else if (v.integer()) {
    v.ints = c.const_ints_any_rank(i, role);
  } else {
    v.floats = t.to_doubles();
  }
  return v;
}

// For each element of the broadcast of `shapes`, the flat index into each input.
std::vector<std::vector<int64_t>> broadcast_indices(NodeContext& c,
                                                    const std::vector<Shape>& shapes,
                                                    Shape* out_shape) {
  Shape out = shapes[0];
  for (size_t i = 1; i < shapes.size(); ++i) {
    Shape next;
    c.check(broadcast_shapes(out, shapes[i], &next), "inputs ", shape_str(out), " and ",
            shape_str(shapes[i]), " do not broadcast");
    out = next;
  }
  *out_shape = out;
  const int64_t count = numel(out);
  std::vector<std::vector<int64_t>> index(shapes.size(), std::vector<int64_t>(size_t(count)));
  for (size_t k = 0; k < shapes.size(); ++k) {
    // Strides of input k over the output's dims (0 where it broadcasts).
    const Shape& s = shapes[k];
    Shape strides(out.size(), 0);
    int64_t stride = 1;
    for (size_t d = s.size(); d-- > 0;) {
      const size_t od = out.size() - s.size() + d;
      strides[od] = s[d] == 1 ? 0 : stride;
      stride *= s[d];
    }
    for (int64_t e = 0; e < count; ++e) {
      int64_t rem = e, at = 0;
      for (size_t d = out.size(); d-- > 0;) {
        at += (rem % out[d]) * strides[d];
        rem /= out[d];
      }
      index[k][size_t(e)] = at;
    }
  }
  return index;
}

enum class Compare { equal, less, greater, less_or_equal, greater_or_equal };

// Whether every input is known at import (then the op is evaluated here); else the node
// becomes the graph's op `kind` on its inputs.
bool fold_or_emit(NodeContext& c, OpKind kind) {
  bool known = true;
  for (int i = 0; i < c.input_count(); ++i) known = known && c.input_known(i);
  if (known) return true;
  std::vector<ValueId> inputs;
  for (int i = 0; i < c.input_count(); ++i) inputs.push_back(c.input(i));
  c.set_output(0, c.emit1(kind, {}, std::move(inputs)));
  return false;
}

template <class T>
bool compare(Compare op, T a, T b) {
  switch (op) {
    case Compare::equal:
      return a == b;
    case Compare::less:
      return a < b;
    case Compare::greater:
      return a > b;
    case Compare::less_or_equal:
      return a <= b;
    default:
      return a >= b;
  }
}

void import_compare(NodeContext& c, Compare op) {
  constexpr OpKind kKinds[] = {OpKind::equal, OpKind::less, OpKind::greater, OpKind::less_equal,
                               OpKind::greater_equal};
  if (!fold_or_emit(c, kKinds[int(op)])) return;
  const Values a = known(c, 0, "A"), b = known(c, 1, "B");
  c.check(a.dtype == b.dtype, "inputs have different element types ", dtype_name(a.dtype), " and ",
          dtype_name(b.dtype));
  Shape shape;
  const auto index = broadcast_indices(c, {a.shape, b.shape}, &shape);
  std::vector<double> out(index[0].size());
  for (size_t e = 0; e < out.size(); ++e) {
    const size_t i = size_t(index[0][e]), j = size_t(index[1][e]);
    out[e] =
        a.integer() ? compare(op, a.ints[i], b.ints[j]) : compare(op, a.floats[i], b.floats[j]);
  }
  c.set_output(0, Tensor::from_doubles(DType::boolean, shape, out));
}

void import_equal(NodeContext& c) {
  import_compare(c, Compare::equal);
}
void import_less(NodeContext& c) {
  import_compare(c, Compare::less);
}
void import_greater(NodeContext& c) {
  import_compare(c, Compare::greater);
}
void import_less_or_equal(NodeContext& c) {
  import_compare(c, Compare::less_or_equal);
}
void import_greater_or_equal(NodeContext& c) {
  import_compare(c, Compare::greater_or_equal);
}

Values known_bool(NodeContext& c, int i, const char* role) {
  Values v = known(c, i, role);
  c.check(v.dtype == DType::boolean, "input ", i, " (", role, ") must be bool, got ",
          dtype_name(v.dtype));
  return v;
}

void import_not(NodeContext& c) {
  if (!fold_or_emit(c, OpKind::logical_not)) return;
  const Values x = known_bool(c, 0, "X");
  std::vector<double> out(x.ints.size());
  for (size_t e = 0; e < out.size(); ++e) out[e] = x.ints[e] == 0;
  c.set_output(0, Tensor::from_doubles(DType::boolean, x.shape, out));
}

enum class Logic { and_, or_, xor_ };

void import_logic(NodeContext& c, Logic op) {
  constexpr OpKind kKinds[] = {OpKind::logical_and, OpKind::logical_or, OpKind::logical_xor};
  if (!fold_or_emit(c, kKinds[int(op)])) return;
  const Values a = known_bool(c, 0, "A"), b = known_bool(c, 1, "B");
  Shape shape;
  const auto index = broadcast_indices(c, {a.shape, b.shape}, &shape);
  std::vector<double> out(index[0].size());
  for (size_t e = 0; e < out.size(); ++e) {
    const bool x = a.ints[size_t(index[0][e])] != 0, y = b.ints[size_t(index[1][e])] != 0;
    out[e] = op == Logic::and_ ? (x && y) : op == Logic::or_ ? (x || y) : (x != y);
  }
  c.set_output(0, Tensor::from_doubles(DType::boolean, shape, out));
}

void import_and(NodeContext& c) {
  import_logic(c, Logic::and_);
}
void import_or(NodeContext& c) {
  import_logic(c, Logic::or_);
}
void import_xor(NodeContext& c) {
  import_logic(c, Logic::xor_);
}

// A known tensor of `dtype` from exact int64 values (integer dtypes) or doubles.
Tensor make_tensor(DType dtype, const Shape& shape, const std::vector<int64_t>& ints,
                   const std::vector<double>& floats) {
  if (is_floating(dtype)) return Tensor::from_doubles(dtype, shape, floats);
  if (dtype == DType::i64) return Tensor::from_vector<int64_t>(shape, ints);
  std::vector<double> as_doubles(ints.begin(), ints.end());  // i32, bool: exact in a double
  return Tensor::from_doubles(dtype, shape, as_doubles);
}

void import_where(NodeContext& c) {
  if (!fold_or_emit(c, OpKind::where)) return;
  const Values cond = known_bool(c, 0, "condition");
  const Values x = known(c, 1, "X"), y = known(c, 2, "Y");
  c.check(x.dtype == y.dtype, "inputs X and Y have different element types ", dtype_name(x.dtype),
          " and ", dtype_name(y.dtype));
  Shape shape;
  const auto index = broadcast_indices(c, {cond.shape, x.shape, y.shape}, &shape);
  std::vector<int64_t> ints;
  std::vector<double> floats;
  for (size_t e = 0; e < index[0].size(); ++e) {
    const bool pick_x = cond.ints[size_t(index[0][e])] != 0;
    const size_t i = size_t(index[1][e]), j = size_t(index[2][e]);
    if (x.integer())
      ints.push_back(pick_x ? x.ints[i] : y.ints[j]);
    else
      floats.push_back(pick_x ? x.floats[i] : y.floats[j]);
  }
  c.set_output(0, make_tensor(x.dtype, shape, ints, floats));
}

// Mod: fmod = 0 (integers only) takes the divisor's sign, as Python's %; fmod = 1 the
// dividend's, as C's fmod.
// Mod of float tensors on run-time data (fmod = 1, C's fmod): a - b * trunc(a / b), trunc(q)
// = q < 0 ? ceil(q) : floor(q). Where b is infinite the result is a when a is finite and NaN
// when it is not (fmod(inf, inf) is NaN in C and onnxruntime); where b is 0 it is NaN; an
// infinite a with a finite b gives NaN through inf - inf. Exact while the quotient's product
// b * trunc(a / b) is (small quotients, the usual case); for quotients past 2^24 (f32) it can
// differ from fmod by rounding.
void emit_float_mod(NodeContext& c) {
  const DType t = c.input_type(0).dtype;
  c.check(c.input_type(1).dtype == t, "inputs have different element types ", dtype_name(t),
          " and ", dtype_name(c.input_type(1).dtype));
  const ValueId a = c.input(0), b = c.input(1);
  const ValueId zero = c.constant(Tensor::scalar(t, 0.0), "zero");
  const ValueId inf = c.constant(Tensor::scalar(t, INFINITY), "inf");
  const ValueId q = c.emit1(OpKind::div, {}, {a, b}, "quotient");
  const ValueId negative = c.emit1(OpKind::less, {}, {q, zero}, "negative");
  const ValueId up = c.emit1(OpKind::ceil, {}, {q}, "ceil");
  const ValueId down = c.emit1(OpKind::floor, {}, {q}, "floor");
  const ValueId whole = c.emit1(OpKind::where, {}, {negative, up, down}, "trunc");
  const ValueId product = c.emit1(OpKind::mul, {}, {b, whole}, "product");
  const ValueId rest = c.emit1(OpKind::sub, {}, {a, product}, "rest");
  const ValueId size = c.emit1(OpKind::abs, {}, {b}, "divisor_size");
  const ValueId infinite = c.emit1(OpKind::equal, {}, {size, inf}, "infinite_divisor");
  // a - (a - a): a itself where a is finite (-0 kept: -0 - +0 is -0), NaN where it is not.
  const ValueId a_minus_a = c.emit1(OpKind::sub, {}, {a, a}, "zero_unless_infinite");
  const ValueId a_if_finite = c.emit1(OpKind::sub, {}, {a, a_minus_a}, "dividend_if_finite");
  c.set_output(0, c.emit1(OpKind::where, {}, {infinite, a_if_finite, rest}));  // broadcasts a
}

// Mod of integer tensors on run-time data: r = a - b * div(a, b) (div truncates: C's %, the
// dividend's sign, fmod = 1); fmod = 0 (Python's %) adds b where r is not 0 and its sign
// differs from b's. The wrap of the integer ops makes MIN % -1 = 0; a zero divisor is div's
// run-time error ("integer division by zero"), naming this node's quotient.
void emit_integer_mod(NodeContext& c, bool fmod) {
  const DType t = c.input_type(0).dtype;
  c.check(c.input_type(1).dtype == t, "inputs have different element types ", dtype_name(t),
          " and ", dtype_name(c.input_type(1).dtype));
  const ValueId a = c.input(0), b = c.input(1);
  const ValueId q = c.emit1(OpKind::div, {}, {a, b}, "quotient");
  const ValueId product = c.emit1(OpKind::mul, {}, {b, q}, "product");
  const ValueId rest = c.emit1(OpKind::sub, {}, {a, product}, fmod ? "" : "rest");
  if (fmod) return c.set_output(0, rest);
  const ValueId zero = c.constant(Tensor::scalar(t, 0.0), "zero");
  const ValueId rest_negative = c.emit1(OpKind::less, {}, {rest, zero}, "rest_negative");
  const ValueId divisor_negative = c.emit1(OpKind::less, {}, {b, zero}, "divisor_negative");
  const ValueId signs_differ =
      c.emit1(OpKind::logical_xor, {}, {rest_negative, divisor_negative}, "signs_differ");
  const ValueId rest_zero = c.emit1(OpKind::equal, {}, {rest, zero}, "rest_zero");
  const ValueId rest_nonzero = c.emit1(OpKind::logical_not, {}, {rest_zero}, "rest_nonzero");
  const ValueId shift =
      c.emit1(OpKind::logical_and, {}, {rest_nonzero, signs_differ}, "takes_divisor_sign");
  const ValueId shifted = c.emit1(OpKind::add, {}, {rest, b}, "shifted");
  c.set_output(0, c.emit1(OpKind::where, {}, {shift, shifted, rest}));
}

void import_mod(NodeContext& c) {
  const bool fmod_attr = c.attrs().get_int("fmod", 0) != 0;
  if (!(c.input_known(0) && c.input_known(1))) {
    if (is_integer(c.input_type(0).dtype)) return emit_integer_mod(c, fmod_attr);
    if (is_floating(c.input_type(0).dtype)) {
      if (!fmod_attr) c.attrs().fail("fmod", "must be 1 for floating-point inputs");
      return emit_float_mod(c);
    }
  }
  const Values a = known(c, 0, "A"), b = known(c, 1, "B");
  c.check(a.dtype == b.dtype, "inputs have different element types ", dtype_name(a.dtype), " and ",
          dtype_name(b.dtype));
  const bool fmod = fmod_attr;
  if (!a.integer() && !fmod) c.attrs().fail("fmod", "must be 1 for floating-point inputs");
  Shape shape;
  const auto index = broadcast_indices(c, {a.shape, b.shape}, &shape);
  std::vector<int64_t> ints;
  std::vector<double> floats;
  for (size_t e = 0; e < index[0].size(); ++e) {
    const size_t i = size_t(index[0][e]), j = size_t(index[1][e]);
    if (a.integer()) {
      const int64_t x = a.ints[i], y = b.ints[j];
      c.check(y != 0, "input 1 (B) has a zero divisor at element ", j);
      int64_t r = y == -1 ? 0 : x % y;  // x % -1 overflows for INT64_MIN
      if (!fmod && r != 0 && ((r < 0) != (y < 0))) r += y;
      ints.push_back(r);
    } else {
      floats.push_back(std::fmod(a.floats[i], b.floats[j]));
    }
  }
  c.set_output(0, make_tensor(a.dtype, shape, ints, floats));
}

// Range's element count, max(ceil((limit - start) / delta), 0), in unsigned arithmetic: limit -
// start passes int64 when they lie far apart on both sides of 0. Counts past int64 give its max.
int64_t range_count(int64_t start, int64_t limit, int64_t delta) {
  if (delta > 0 ? limit <= start : limit >= start) return 0;
  const uint64_t span =
      delta > 0 ? uint64_t(limit) - uint64_t(start) : uint64_t(start) - uint64_t(limit);
  const uint64_t step = delta > 0 ? uint64_t(delta) : 0 - uint64_t(delta);
  const uint64_t count = span / step + (span % step != 0 ? 1 : 0);
  return int64_t(std::min<uint64_t>(count, uint64_t(std::numeric_limits<int64_t>::max())));
}

// Range(start, limit, delta): max(ceil((limit - start) / delta), 0) elements start + i delta.
void import_range(NodeContext& c) {
  const Values start = known(c, 0, "start"), limit = known(c, 1, "limit"),
               delta = known(c, 2, "delta");
  for (const Values* v : {&start, &limit, &delta}) {
    c.check(numel(v->shape) == 1, "start, limit and delta must be scalars, got shape ",
            shape_str(v->shape));
    c.check(v->dtype == start.dtype, "start, limit and delta have different element types");
  }
  std::vector<int64_t> ints;
  std::vector<double> floats;
  if (start.integer()) {
    const int64_t s = start.ints[0], l = limit.ints[0], d = delta.ints[0];
    c.check(d != 0, "input 2 (delta) is 0");
    const int64_t count = range_count(s, l, d);
    c.check(count <= kMaxKnownElements, "the range has ", count, " elements, more than ",
            kMaxKnownElements);
    // Each element lies between start and limit, but i * delta alone may pass int64: the sum is
    // taken modulo 2^64.
    for (int64_t i = 0; i < count; ++i)
      ints.push_back(int64_t(uint64_t(s) + uint64_t(i) * uint64_t(d)));
  } else {
    const double s = start.floats[0], l = limit.floats[0], d = delta.floats[0];
    c.check(d != 0 && std::isfinite(s) && std::isfinite(l) && std::isfinite(d),
            "start, limit and delta must be finite and delta nonzero");
    const double count = std::max(0.0, std::ceil((l - s) / d));
    c.check(count <= double(kMaxKnownElements), "the range has ", count, " elements, more than ",
            kMaxKnownElements);
    for (int64_t i = 0; i < int64_t(count); ++i) floats.push_back(s + double(i) * d);
  }
  const int64_t n = int64_t(start.integer() ? ints.size() : floats.size());
  c.set_output(0, make_tensor(start.dtype, {n}, ints, floats));
}

// ScatterND and ScatterElements: a copy of data with some of its rows replaced by, or
// combined (reduction add / mul, and max / min from opset 18) with, rows of the updates, in
// the updates' order. The indices must be known at import; data and updates may be computed
// at run time. Both come down to the same targets: data viewed as rows [P, S], updates as
// rows [U, S], and the data row each update row goes to.
//   ScatterND(data, indices [..., k], updates): a row is a slice over data's trailing dims
//     (S = their product), addressed by k leading coordinates.
//   ScatterElements(data, indices, updates, axis): rows of one element (S = 1); update p goes
//     to p with its coordinate along axis replaced by indices[p] (indices and updates have
//     one shape, at most data's extents).
struct ScatterTargets {
  Shape data_shape;
  int64_t rows = 1;                    // P
  int64_t row_size = 1;                // S
  std::vector<int64_t> row_of_update;  // for each of the U update rows, its data row
};

// An index along a dim of `extent`, negative from the end, checked.
int64_t scatter_index(NodeContext& c, int64_t at, int64_t extent, size_t dim) {
  const int64_t i = at < 0 ? at + extent : at;
  c.check(i >= 0 && i < extent, "input 1 (indices) has ", at, " out of range for dim ", dim,
          " of extent ", extent);
  return i;
}

ScatterTargets scatter_nd_targets(NodeContext& c, const Shape& data_shape,
                                  const Shape& updates_shape) {
  const std::vector<int64_t> indices = c.const_ints_any_rank(1, "indices");
  const Shape& index_shape = c.input_shape(1);
  c.check(!index_shape.empty() && index_shape.back() >= 1 &&
              index_shape.back() <= int64_t(data_shape.size()),
          "input 1 (indices) ", shape_str(index_shape), " does not index data ",
          shape_str(data_shape));
  const size_t k = size_t(index_shape.back());
  ScatterTargets t;
  t.data_shape = data_shape;
  for (size_t d = 0; d < data_shape.size(); ++d) (d < k ? t.rows : t.row_size) *= data_shape[d];
  Shape expected(index_shape.begin(), index_shape.end() - 1);
  expected.insert(expected.end(), data_shape.begin() + int64_t(k), data_shape.end());
  c.check(updates_shape == expected, "input 2 (updates) is ", shape_str(updates_shape),
          ", expected ", shape_str(expected));
  const int64_t count = numel(index_shape) / int64_t(k);
  for (int64_t i = 0; i < count; ++i) {
    int64_t row = 0;
    for (size_t d = 0; d < k; ++d)
      row = row * data_shape[d] + scatter_index(c, indices[size_t(i) * k + d], data_shape[d], d);
    t.row_of_update.push_back(row);
  }
  return t;
}

ScatterTargets scatter_elements_targets(NodeContext& c, const Shape& data_shape,
                                        const Shape& updates_shape) {
  const std::vector<int64_t> indices = c.const_ints_any_rank(1, "indices");
  const Shape& index_shape = c.input_shape(1);
  const int64_t rank = int64_t(data_shape.size());
  c.check(rank >= 1, "data is a scalar");
  int64_t axis = c.attrs().get_int("axis", 0);
  c.check(axis >= -rank && axis < rank, "axis ", axis, " is out of range for rank ", rank);
  if (axis < 0) axis += rank;
  c.check(index_shape.size() == data_shape.size() && updates_shape == index_shape, "indices ",
          shape_str(index_shape), " and updates ", shape_str(updates_shape),
          " must have one shape of data's rank (data ", shape_str(data_shape), ")");
  for (size_t d = 0; d < data_shape.size(); ++d)
    c.check(int64_t(d) == axis || index_shape[d] <= data_shape[d], "indices ",
            shape_str(index_shape), " exceed data ", shape_str(data_shape), " along dim ", d);
  ScatterTargets t;
  t.data_shape = data_shape;
  t.rows = numel(data_shape);
  const Shape data_strides = contiguous_strides(data_shape);
  for (int64_t p = 0; p < numel(index_shape); ++p) {
    int64_t rest = p, row = 0;
    for (size_t d = index_shape.size(); d-- > 0;) {
      const int64_t coord = rest % index_shape[d];
      rest /= index_shape[d];
      const int64_t at =
          int64_t(d) == axis ? scatter_index(c, indices[size_t(p)], data_shape[d], d) : coord;
      row += at * data_strides[d];
    }
    t.row_of_update.push_back(row);
  }
  return t;
}

std::string scatter_reduction(NodeContext& c) {
  const std::string reduction = c.attrs().get_string("reduction", "none");
  const bool known = reduction == "none" || reduction == "add" || reduction == "mul" ||
                     (c.opset() >= 18 && (reduction == "max" || reduction == "min"));
  if (!known)
    c.attrs().unsupported_value(
        "reduction", reduction,
        c.opset() >= 18 ? "supported: none, add, mul, max, min" : "supported: none, add, mul");
  return reduction;
}

template <class T>
T scatter_combine(const std::string& reduction, T to, T u) {
  if (reduction == "add") return to + u;
  if (reduction == "mul") return to * u;
  if (reduction == "max") return std::max(to, u);
  if (reduction == "min") return std::min(to, u);
  return u;
}

// On run-time data or updates: the update rows are dealt into layers, layer j holding each
// data row's j-th update (one layer unless rows repeat), and each layer is one gather of the
// update rows it places plus a where:
//   out = where(placed_j [P, 1], combine(out, gather(updates, source_j [P])), out)
// so repeated rows combine in the updates' order (the last one wins without a reduction),
// as on known tensors, and the gradient flows through where and gather.
void emit_scatter(NodeContext& c, const ScatterTargets& t, const std::string& reduction) {
  const int64_t updates = int64_t(t.row_of_update.size());
  ValueId out = c.emit1(OpKind::reshape, ReshapeAttrs{{t.rows, t.row_size}}, {c.input(0)}, "rows");
  const ValueId update_rows = updates == 0
                                  ? kNoValue
                                  : c.emit1(OpKind::reshape, ReshapeAttrs{{updates, t.row_size}},
                                            {c.input(2)}, "update_rows");
  // Kept per update, not per data row: the rows (data's size) may be far more than the updates,
  // and only the layers' tensors, which the host memory budget counts, are that large.
  std::unordered_map<int64_t, size_t> seen;                      // updates dealt to a row so far
  std::vector<std::vector<std::pair<int64_t, int64_t>>> layers;  // layer j: (row, update index)
  for (int64_t u = 0; u < updates; ++u) {
    const int64_t row = t.row_of_update[size_t(u)];
    const size_t j = seen[row]++;
    if (j == layers.size()) layers.emplace_back();
    layers[j].emplace_back(row, u);
  }
  static const std::pair<const char*, OpKind> kCombine[] = {
      {"add", OpKind::add}, {"mul", OpKind::mul}, {"max", OpKind::max}, {"min", OpKind::min}};
  for (size_t j = 0; j < layers.size(); ++j) {
    const std::string layer = "layer" + std::to_string(j);
    Tensor source = Tensor::zeros(DType::i64, {t.rows});
    Tensor placed = Tensor::zeros(DType::boolean, {t.rows, 1});
    for (const auto& [row, u] : layers[j]) {
      source.data<int64_t>()[row] = u;
      placed.data<bool>()[row] = true;
    }
    const bool every_row = int64_t(layers[j].size()) == t.rows;  // a row at most once a layer
    const ValueId picked =
        c.emit1(OpKind::gather, GatherAttrs{0},
                {update_rows, c.constant(source, layer + "_source")}, layer + "_pick");
    ValueId next = picked;
    for (const auto& [name, op] : kCombine)
      if (reduction == name) next = c.emit1(op, {}, {out, picked}, layer + "_" + name);
    out = every_row ? next
                    : c.emit1(OpKind::where, {}, {c.constant(placed, layer + "_placed"), next, out},
                              layer + "_place");
  }
  c.set_output(0, c.emit1(OpKind::reshape, ReshapeAttrs{t.data_shape}, {out}, "unrows"));
}

template <ScatterTargets (*Targets)(NodeContext&, const Shape&, const Shape&)>
void import_scatter(NodeContext& c) {
  const std::string reduction = scatter_reduction(c);
  c.check(c.input_type(2).dtype == c.input_type(0).dtype, "updates are ",
          dtype_name(c.input_type(2).dtype), ", data ", dtype_name(c.input_type(0).dtype));
  const ScatterTargets t = Targets(c, c.input_shape(0), c.input_shape(2));
  if (!c.input_known(0) || !c.input_known(2)) return emit_scatter(c, t, reduction);
  const Values data = known(c, 0, "data");
  const Values updates = known(c, 2, "updates");
  std::vector<int64_t> ints = data.ints;
  std::vector<double> floats = data.floats;
  for (size_t u = 0; u < t.row_of_update.size(); ++u) {
    for (int64_t e = 0; e < t.row_size; ++e) {
      const size_t to = size_t(t.row_of_update[u] * t.row_size + e);
      const size_t from = size_t(int64_t(u) * t.row_size + e);
      if (data.integer())
        ints[to] = scatter_combine(reduction, ints[to], updates.ints[from]);
      else
        floats[to] = scatter_combine(reduction, floats[to], updates.floats[from]);
    }
  }
  c.set_output(0, make_tensor(data.dtype, data.shape, ints, floats));
}

// GatherND(data, indices [..., k], batch_dims b) with known indices: data viewed as rows
// [P, S] (P over its first b + k dims, S over the rest), each index tuple (after the batch
// position it sits at) names one row, so the node is one gather of rows at known positions,
// reshaped to indices.shape[:-1] + data.shape[b + k:]. On known data it folds like any gather.
void import_gather_nd(NodeContext& c) {
  const Shape& data = c.input_shape(0);
  const Shape& index_shape = c.input_shape(1);
  const std::vector<int64_t> indices = c.const_ints_any_rank(1, "indices");
  const int64_t b = c.attrs().get_int("batch_dims", 0);
  const int64_t rank = int64_t(data.size()), q = int64_t(index_shape.size());
  c.check(q >= 1 && b >= 0 && b < std::min(rank, q), "batch_dims ", b,
          " must be below the ranks of data ", shape_str(data), " and indices ",
          shape_str(index_shape));
  const int64_t k = index_shape.back();
  c.check(k >= 1 && b + k <= rank, "input 1 (indices) ", shape_str(index_shape), " indexes ", k,
          " dims of data ", shape_str(data), " after ", b, " batch dims");
  for (int64_t d = 0; d < b; ++d)
    c.check(index_shape[size_t(d)] == data[size_t(d)], "batch dim ", d, " of indices ",
            shape_str(index_shape), " differs from data's ", shape_str(data));
  int64_t rows = 1, row_size = 1, batch = 1;
  for (int64_t d = 0; d < rank; ++d) (d < b + k ? rows : row_size) *= data[size_t(d)];
  for (int64_t d = 0; d < b; ++d) batch *= data[size_t(d)];
  const int64_t tuples = numel(index_shape) / k, per_batch = tuples / std::max<int64_t>(batch, 1);
  std::vector<int64_t> flat;
  for (int64_t t = 0; t < tuples; ++t) {
    int64_t row = per_batch > 0 ? t / per_batch : 0;  // the batch position, over data[:b]
    for (int64_t d = 0; d < k; ++d)
      row = row * data[size_t(b + d)] +
            scatter_index(c, indices[size_t(t * k + d)], data[size_t(b + d)], size_t(b + d));
    flat.push_back(row);
  }
  Shape out(index_shape.begin(), index_shape.end() - 1);
  out.insert(out.end(), data.begin() + b + k, data.end());
  const ValueId data_rows =
      c.emit1(OpKind::reshape, ReshapeAttrs{{rows, row_size}}, {c.input(0)}, "rows");
  const ValueId positions =
      c.constant(Tensor::from_vector<int64_t>({int64_t(flat.size())}, flat), "positions");
  const ValueId picked = c.emit1(OpKind::gather, GatherAttrs{0}, {data_rows, positions}, "pick");
  c.set_output(0, c.emit1(OpKind::reshape, ReshapeAttrs{out}, {picked}));
}

// Expand(input, shape): input broadcast with shape (both ways: shape's dims may be 1 where
// the input's are larger); the graph's expand op, so the input may be computed at run time.
void import_expand(NodeContext& c) {
  const Shape target = c.const_ints(1, "shape");
  for (int64_t d : target) c.check(d >= 0, "input 1 (shape) has a negative extent ", d);
  Shape out;
  c.check(broadcast_shapes(c.input_shape(0), target, &out), "input 0 ", shape_str(c.input_shape(0)),
          " does not broadcast with shape ", shape_str(target));
  c.set_output(0, c.emit1(OpKind::expand, ExpandAttrs{out}, {c.input(0)}));
}

const OpSpec kOps[] = {
    {"Equal", 1, 2, 2, 1, import_equal},
    {"Less", 1, 2, 2, 1, import_less},
    {"Greater", 1, 2, 2, 1, import_greater},
    {"LessOrEqual", 12, 2, 2, 1, import_less_or_equal},
    {"GreaterOrEqual", 12, 2, 2, 1, import_greater_or_equal},
    {"Not", 1, 1, 1, 1, import_not},
    {"And", 1, 2, 2, 1, import_and},
    {"Or", 1, 2, 2, 1, import_or},
    {"Xor", 1, 2, 2, 1, import_xor},
    {"Where", 9, 3, 3, 1, import_where},
    {"Mod", 10, 2, 2, 1, import_mod},
    {"Range", 11, 3, 3, 1, import_range},
    {"ScatterND", 11, 3, 3, 1, import_scatter<scatter_nd_targets>},
    {"ScatterElements", 11, 3, 3, 1, import_scatter<scatter_elements_targets>},
    {"GatherND", 11, 2, 2, 1, import_gather_nd},
    {"Expand", 8, 2, 2, 1, import_expand},
};

}  // namespace

std::span<const OpSpec> known_ops() {
  return kOps;
}

}  // namespace fusebox::onnx_import
