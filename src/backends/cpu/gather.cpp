// gather and gather_backward (ops.h). data is viewed as [outer, extent, inner] around the
// axis and the indices flattened to [count], so y is [outer, count, inner]:
//
//   gather:          y[o, j, :] = data[o, idx[j], :], a row copy per (o, j), any dtype
//   gather_backward: ddata = 0; ddata[o, idx[j], :] += dy[o, j, :] for j in order, in f64
//
//   gather_elements: y[p] = data[p with coordinate `axis` replaced by idx[p]] (y has the
//                    indices' shape); its backward adds dy[p] there, in p's order, in f64
//
// The indices are checked before anything is written: one outside [-extent, extent) is an
// Error naming the node, the index and its position.
#include <cstring>

#include "backends/common/gather_view.h"
#include "kernel_util.h"
#include "kernels.h"

namespace fusebox::cpu {

namespace {

// The indices as non-negative positions along the axis, each checked.
std::vector<int64_t> checked_indices(const Node& n, const Tensor& indices, int64_t extent,
                                     int64_t axis) {
  std::vector<int64_t> idx(size_t(indices.numel()));
  if (indices.dtype() == DType::i64) {
    std::memcpy(idx.data(), indices.data<int64_t>(), idx.size() * sizeof(int64_t));
  } else {
    FUSEBOX_CHECK(indices.dtype() == DType::i32, node_label(n), "indices must be i64 or i32, got ",
                  dtype_name(indices.dtype()));
    const int32_t* p = indices.data<int32_t>();
    for (size_t j = 0; j < idx.size(); ++j) idx[j] = p[j];
  }
  for (size_t j = 0; j < idx.size(); ++j) {
    if (idx[j] < 0) idx[j] += extent;
    if (idx[j] < 0 || idx[j] >= extent) {
      throw Error(node_label(n), cat("index ", idx[j] < 0 ? idx[j] - extent : idx[j],
                                     " at position ", position_str(int64_t(j), indices.shape()),
                                     " of input 1 (indices) is outside [", -extent, ", ", extent,
                                     ") (dim ", axis, " of data)"));
    }
  }
  return idx;
}

// gather_elements' map: the flat offset in data of the element position p of the indices
// reads (idx already normalised).
struct ElementsMap {
  Shape index_shape, data_strides;
  int64_t axis;
  int64_t source(int64_t p, int64_t k) const {
    int64_t offset = 0;
    for (size_t d = index_shape.size(); d-- > 0;) {
      const int64_t c = p % index_shape[d];
      p /= index_shape[d];
      offset += (int64_t(d) == axis ? k : c) * data_strides[d];
    }
    return offset;
  }
};

}  // namespace

void gather(const Node& n, Inputs in, Outputs out) {
  const int64_t axis = std::get<GatherAttrs>(n.attrs).axis;
  const Tensor& data = *in[0];
  Tensor& y = out[0];
  const GatherView v = gather_view(data.shape(), axis, in[1]->numel());
  const std::vector<int64_t> idx = checked_indices(n, *in[1], v.extent, axis);
  const size_t row = size_t(v.inner) * dtype_size(data.dtype());
  const auto* src = static_cast<const char*>(data.raw());
  auto* dst = static_cast<char*>(y.raw());
  if (row == 0) return;
  parallel_for(v.outer * v.count, std::max<int64_t>(1, kGrain / v.inner),
               [&](int64_t begin, int64_t end) {
                 for (int64_t r = begin; r < end; ++r) {
                   const int64_t o = r / v.count, j = r % v.count;
                   std::memcpy(dst + r * int64_t(row),
                               src + (o * v.extent + idx[size_t(j)]) * int64_t(row), row);
                 }
               });
}

void gather_backward(const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<GatherBackwardAttrs>(n.attrs);
  const Tensor& dy = *in[0];
  Tensor& dx = out[0];
  const GatherView v = gather_view(dx.shape(), a.gather.axis, in[1]->numel());
  const std::vector<int64_t> idx = checked_indices(n, *in[1], v.extent, a.gather.axis);
  const std::vector<double> g = dy.to_doubles();
  std::vector<double> sum(size_t(dx.numel()), 0.0);
  // Parallel over the outer rows only: within one, several j may add into one row.
  parallel_for(v.outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(v.count * v.inner, 1)),
               [&](int64_t o0, int64_t o1) {
                 for (int64_t o = o0; o < o1; ++o)
                   for (int64_t j = 0; j < v.count; ++j) {
                     const double* src = g.data() + (o * v.count + j) * v.inner;
                     double* dst = sum.data() + (o * v.extent + idx[size_t(j)]) * v.inner;
                     for (int64_t i = 0; i < v.inner; ++i) dst[i] += src[i];
                   }
               });
  store_values(dx, sum);
}

void gather_elements(const Node& n, Inputs in, Outputs out) {
  const int64_t axis = std::get<GatherAttrs>(n.attrs).axis;
  const Tensor& data = *in[0];
  const std::vector<int64_t> idx = checked_indices(n, *in[1], data.shape()[size_t(axis)], axis);
  const ElementsMap map{in[1]->shape(), contiguous_strides(data.shape()), axis};
  visit_bytes(dtype_size(data.dtype()), [&](auto tag) {
    using E = decltype(tag);
    const E* x = static_cast<const E*>(data.raw());
    E* y = static_cast<E*>(out[0].raw());
    parallel_for(int64_t(idx.size()), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) y[p] = x[map.source(p, idx[size_t(p)])];
    });
  });
}

void gather_elements_backward(const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<GatherBackwardAttrs>(n.attrs);
  Tensor& dx = out[0];
  const int64_t axis = a.gather.axis;
  const std::vector<int64_t> idx = checked_indices(n, *in[1], dx.shape()[size_t(axis)], axis);
  const ElementsMap map{in[1]->shape(), contiguous_strides(dx.shape()), axis};
  const std::vector<double> g = in[0]->to_doubles();
  std::vector<double> sum(size_t(dx.numel()), 0.0);
  for (size_t p = 0; p < idx.size(); ++p) sum[size_t(map.source(int64_t(p), idx[p]))] += g[p];
  store_values(dx, sum);
}

}  // namespace fusebox::cpu
