// Shape and data-movement ops. Everything except cast only moves elements, so
// it works on raw element bytes whatever the dtype (visit_bytes). transpose,
// slice and concat are one strided copy each: a nest over the moved elements
// with a destination and a source stride per dim.
#include <cmath>

#include "data_movement.h"
#include "kernel_util.h"
#include "kernels.h"

namespace fusebox::cpu {

void copy_strided(const Shape& shape, Tensor& dst, Shape dst_strides, int64_t dst_offset,
                  const Tensor& src, Shape src_strides, int64_t src_offset) {
  StridedNest<2> nest{shape, {std::move(dst_strides), std::move(src_strides)}};
  nest.simplify();
  const int64_t sd = nest.inner_stride(0), ss = nest.inner_stride(1);
  visit_bytes(dtype_size(src.dtype()), [&](auto tag) {
    using E = decltype(tag);
    E* d = static_cast<E*>(dst.raw()) + dst_offset;
    const E* s = static_cast<const E*>(src.raw()) + src_offset;
    nest.parallel_runs(kGrain, [&](const std::array<int64_t, 2>& off, int64_t count) {
      for (int64_t j = 0; j < count; ++j) d[off[0] + j * sd] = s[off[1] + j * ss];
    });
  });
}

// reshape, flatten, squeeze, unsqueeze: the same row-major bytes under another shape.
void copy_reshape(const Node& n, Inputs in, Outputs out) {
  FUSEBOX_CHECK(in[0]->nbytes() == out[0].nbytes(), node_label(n), "cannot view ",
                shape_str(in[0]->shape()), " as ", shape_str(out[0].shape()));
  std::memcpy(out[0].raw(), in[0]->raw(), in[0]->nbytes());
}

// y[c] = x[c permuted back]: y walked in order, x at strides[perm[i]].
void transpose(const Node& n, Inputs in, Outputs out) {
  const auto& perm = std::get<TransposeAttrs>(n.attrs).perm;
  const Tensor& x = *in[0];
  FUSEBOX_CHECK(int64_t(perm.size()) == x.rank(), node_label(n), "perm has ", perm.size(),
                " entries for rank ", x.rank());
  const Shape x_strides = contiguous_strides(x.shape());
  Shape src_strides(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) src_strides[i] = x_strides[size_t(perm[i])];
  copy_strided(out[0].shape(), out[0], contiguous_strides(out[0].shape()), 0, x,
               std::move(src_strides), 0);
}

// Each input is copied into its slab of y: y's strides, offset along `axis`.
void concat(const Node& n, Inputs in, Outputs out) {
  const int64_t axis = std::get<ConcatAttrs>(n.attrs).axis;
  Tensor& y = out[0];
  const Shape y_strides = contiguous_strides(y.shape());
  int64_t at = 0;
  for (const Tensor* x : in) {
    copy_strided(x->shape(), y, y_strides, at * y_strides[size_t(axis)], *x,
                 contiguous_strides(x->shape()), 0);
    at += x->dim(axis);
  }
  FUSEBOX_CHECK(at == y.dim(axis), node_label(n), "inputs cover ", at, " of ", y.dim(axis),
                " along axis ", axis);
}

// Attributes are normalised: per listed axis an absolute start in range and a
// step; y's shape already holds each dim's element count. Element c of y is x at
// start + c * step along every dim: a strided copy with strides scaled by the steps.
void slice(const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<SliceAttrs>(n.attrs);
  const Tensor& x = *in[0];
  if (out[0].numel() == 0) return;  // a start may then equal its extent: no offset to take
  Shape src_strides = contiguous_strides(x.shape());
  int64_t src_offset = 0;
  for (size_t i = 0; i < a.axes.size(); ++i) {
    const size_t d = size_t(a.axes[i]);
    src_offset += a.starts[i] * src_strides[d];
    src_strides[d] *= a.steps[i];
  }
  copy_strided(out[0].shape(), out[0], contiguous_strides(out[0].shape()), 0, x,
               std::move(src_strides), src_offset);
}

// pad: per dim, a map from each y position to its x position (-1 for the
// constant). Each y row (innermost dim) either lies wholly in constant padding
// or reads x through the innermost map. Negative pads crop: the map just starts
// further in.
void pad(const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<PadAttrs>(n.attrs);
  const Tensor& x = *in[0];
  Tensor& y = out[0];
  const size_t rank = size_t(x.rank());
  FUSEBOX_CHECK(a.pads.size() == 2 * rank, node_label(n), "pads has ", a.pads.size(),
                " entries for rank ", rank);
  if (y.numel() == 0) return;
  if (rank == 0) {
    std::memcpy(y.raw(), x.raw(), x.nbytes());
    return;
  }
  std::vector<std::vector<int64_t>> source(rank);
  for (size_t d = 0; d < rank; ++d) {
    FUSEBOX_CHECK(a.mode == PadMode::constant || x.dim(int64_t(d)) > 0, node_label(n),
                  "cannot reflect or extend an empty dim ", d);
    for (int64_t o = 0; o < y.dim(int64_t(d)); ++o)
      source[d].push_back(pad_source(a.mode, o, a.pads[d], x.dim(int64_t(d))));
  }
  const Tensor fill = Tensor::scalar(x.dtype(), a.value);  // the value in x's dtype
  const Shape x_strides = contiguous_strides(x.shape());
  const int64_t cols = y.dim(-1), rows = y.numel() / cols;
  const std::vector<int64_t>& inner = source[rank - 1];

  visit_bytes(dtype_size(x.dtype()), [&](auto tag) {
    using E = decltype(tag);
    const E* px = static_cast<const E*>(x.raw());
    E* py = static_cast<E*>(y.raw());
    E value;
    std::memcpy(&value, fill.raw(), sizeof(E));
    parallel_for(rows, std::max<int64_t>(1, kGrain / cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        E* row = py + r * cols;
        int64_t base = 0, rem = r;
        for (size_t d = rank - 1; d-- > 0 && base >= 0;) {
          const int64_t s = source[d][size_t(rem % y.dim(int64_t(d)))];
          rem /= y.dim(int64_t(d));
          base = s < 0 ? -1 : base + s * x_strides[d];
        }
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t s = inner[size_t(j)];
          row[j] = base < 0 || s < 0 ? value : px[base + s];
        }
      }
    });
  });
}

// cast: the one conversion rule (kernel_util.h convert): float narrowing rounds
// to nearest even, float -> int truncates (NaN -> 0, saturating), -> bool is != 0.
void cast(const Node& n, Inputs in, Outputs out) {
  const Tensor& x = *in[0];
  Tensor& y = out[0];
  visit_dtype(x.dtype(), [&](auto from_tag) {
    using From = decltype(from_tag);
    visit_dtype(y.dtype(), [&](auto to_tag) {
      using To = decltype(to_tag);
      const From* src = x.data<From>();
      To* dst = y.data<To>();
      parallel_for(x.numel(), kGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) dst[i] = convert<To>(src[i]);
      });
    });
  });
}

void constant(const Node& n, Inputs in, Outputs out) {
  const Tensor& value = std::get<ConstantAttrs>(n.attrs).value;
  FUSEBOX_CHECK(
      value.defined() && value.dtype() == out[0].dtype() && value.shape() == out[0].shape(),
      node_label(n), "value does not match the output type ", dtype_name(out[0].dtype()),
      shape_str(out[0].shape()));
  std::memcpy(out[0].raw(), value.raw(), value.nbytes());
}

}  // namespace fusebox::cpu
