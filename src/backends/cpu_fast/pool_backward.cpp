// max_pool_backward of a 2-D f32 pool on the fast CPU path, in every build (oneDNN's max pool
// backward needs the workspace of a training forward, which the graph does not keep):
//
//   for each (n, c) plane, on the threads:
//     1. for each output (row-major): its window's argmax in x, found as the forward finds it
//        (the first of equal maxima in row-major window order, a NaN winning and staying)
//     2. dy of that output added, in f64, to a scratch plane at the argmax
//     3. the scratch plane rounded once into dx
//
// The reference's algorithm (backends/cpu/pool_backward.cpp) over the same tabulated windows
// (pool_window.h), so the same sums in the same order: the same bits. What makes it faster is
// what it leaves out and how it selects: one rank (2-D) and one dtype, the window two plain loops
// over precomputed tap ranges with branch-free selects, each thread keeping its scratch plane.
#include <algorithm>
#include <vector>

#include "backends/cpu/pool_window.h"
#include "backends/cpu_fast/kernels.h"
#include "backends/cpu_fast/threads.h"

namespace fusebox::cpu_fast {
namespace {

// Step 1 for output (o1, o2) of plane x: the argmax's plane offset, -1 for a window without an
// in-bounds tap (dilation only). Selects without branches: a data-dependent branch per tap
// mispredicts on real activations (ResNet-18's stem pool backward, [16, 64, 32, 32] on 2 cores:
// 4.1 ms with the branch, 2.2-3.1 ms without; the reference kernel 4.5 ms).
inline int64_t window_argmax_2d(const cpu::PoolGeometry& g, const float* x, const TapRange& rows,
                                const TapRange& cols) {
  if (rows.count == 0 || cols.count == 0) return -1;
  const int64_t first = rows.first * g.in[2] + cols.first;
  float best = x[first];  // the first tap is taken whatever it is
  int64_t at = first;
  for (int64_t a = 0; a < rows.count; ++a) {
    const int64_t row = (rows.first + a * g.dilation[1]) * g.in[2] + cols.first;
    for (int64_t b = a == 0 ? 1 : 0; b < cols.count; ++b) {
      const int64_t i = row + b * g.dilation[2];
      const float v = x[i];
      // Larger, or NaN, unless a NaN is held (best != best): the reference's rule.
      const bool take = !(v <= best) && best == best;
      best = take ? v : best;
      at = take ? i : at;
    }
  }
  return at;
}

class MaxPoolBackward2d final : public Kernel {
 public:
  explicit MaxPoolBackward2d(cpu::PoolGeometry g) : g_(std::move(g)) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    const float* dy = in[0]->data<float>();
    const float* x = in[1]->data<float>();
    float* dx = out[0].data<float>();
    const int64_t in_size = g_.in_size(), out_size = g_.out_size();
    split_over_threads(g_.planes(), 4, [&](int64_t first, int64_t last) {
      std::vector<double> plane(static_cast<size_t>(in_size));
      for (int64_t p = first; p < last; ++p) {
        std::fill(plane.begin(), plane.end(), 0.0);
        const float* xp = x + p * in_size;
        const float* dyp = dy + p * out_size;
        for (int64_t o1 = 0; o1 < g_.out[1]; ++o1) {
          const TapRange& rows = g_.taps[1][size_t(o1)];
          for (int64_t o2 = 0; o2 < g_.out[2]; ++o2) {
            const int64_t at = window_argmax_2d(g_, xp, rows, g_.taps[2][size_t(o2)]);
            if (at >= 0) plane[size_t(at)] += double(dyp[o1 * g_.out[2] + o2]);
          }
        }
        float* dxp = dx + p * in_size;
        for (int64_t i = 0; i < in_size; ++i) dxp[i] = float(plane[size_t(i)]);
      }
    });
  }

  std::string describe() const override { return "own 2-D max_pool_backward (f32)"; }

 private:
  cpu::PoolGeometry g_;
};

}  // namespace

Planned plan_max_pool_backward(const Graph& g, const Node& n) {
  auto refuse = [](std::string why) { return Planned{nullptr, std::move(why)}; };
  for (ValueId v : {n.inputs[0], n.inputs[1], n.outputs[0]})
    if (g.value(v).type.dtype != DType::f32) return refuse("not f32");
  const Shape& x = g.value(n.inputs[1]).type.shape;
  const Shape& dy = g.value(n.inputs[0]).type.shape;
  if (x.size() != 4) return refuse("not a 2-D pool");
  const auto& a = std::get<PoolBackwardAttrs>(n.attrs);
  if (a.pool.return_indices) return refuse("indices returned");
  cpu::PoolGeometry geometry = cpu::make_pool_geometry(a.pool, x, dy, node_label(n));
  if (geometry.in[0] != 1 || geometry.out[0] != 1) return refuse("not a 2-D pool");
  return {std::make_unique<MaxPoolBackward2d>(std::move(geometry)), ""};
}

}  // namespace fusebox::cpu_fast
