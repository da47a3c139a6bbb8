// resize and resize_backward (ops.h) on the tap tables of backends/common/resize_map.h:
//
//   resize:          y[e] = sum over e's tap combinations of weight * x[offset]   (f64)
//                    nearest: one tap of weight 1, a word copy (any dtype)
//   resize_backward: dx = 0; dx[offset] += weight * dy[e] for every e in order (f64)
//
// tf_crop_and_resize's reads outside the crop give extrapolation_value (and no gradient).
#include <cstring>

#include "backends/common/resize_map.h"
#include "kernel_util.h"
#include "kernels.h"

namespace fusebox::cpu {

void resize(const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<ResizeAttrs>(n.attrs);
  const Tensor& x = *in[0];
  Tensor& y = out[0];
  const ResizeMap m = make_resize_map(a, x.shape(), node_label(n));
  const int64_t total = y.numel();
  if (total == 0) return;
  if (a.mode == ResizeMode::nearest && a.coordinates != ResizeCoordinates::tf_crop_and_resize) {
    visit_bytes(dtype_size(x.dtype()), [&](auto tag) {
      using E = decltype(tag);
      const E* src = static_cast<const E*>(x.raw());
      E* dst = static_cast<E*>(y.raw());
      parallel_for(total, kGrain, [&](int64_t begin, int64_t end) {
        for (int64_t e = begin; e < end; ++e)
          for_each_resize_tap(m, e, [&](int64_t offset, double) { dst[e] = src[offset]; });
      });
    });
    return;
  }
  const std::vector<double> v = x.to_doubles();
  std::vector<double> r(static_cast<size_t>(total));
  parallel_for(total, kGrain / 16, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      double sum = 0;
      const bool inside = for_each_resize_tap(
          m, e, [&](int64_t offset, double w) { sum += w * v[size_t(offset)]; });
      r[size_t(e)] = inside ? sum : m.extrapolation;
    }
  });
  store_values(y, r);
}

void resize_backward(const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<ResizeBackwardAttrs>(n.attrs);
  Tensor& dx = out[0];
  const ResizeMap m = make_resize_map(a.resize, dx.shape(), node_label(n));
  const std::vector<double> g = in[0]->to_doubles();
  std::vector<double> sum(size_t(dx.numel()), 0.0);
  for (int64_t e = 0; e < int64_t(g.size()); ++e)
    for_each_resize_tap(m, e,
                        [&](int64_t offset, double w) { sum[size_t(offset)] += w * g[size_t(e)]; });
  store_values(dx, sum);
}

}  // namespace fusebox::cpu
