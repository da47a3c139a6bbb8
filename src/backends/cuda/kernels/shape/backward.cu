// expand and the gradients of the element-moving ops on the GPU, with the CPU backend's
// semantics (backends/cpu/backward.cpp):
//
// expand:         y = x broadcast: copy_strided from a view of x whose strides are 0 along
//                 the broadcast dims (x may itself be a strided view).
// slice_backward: dx = 0 (a memset), then dy copied to where the slice read: the forward's
//                 strided view, now of dx, as the copy's destination.
// pad_backward:   the adjoint of pad's index map, one padded dim at a time (separable, as
//                 the CPU): along dim d, g'[.., i, ..] = sum of g[.., o, ..] over the padded
//                 positions o that read i, in increasing o (the interior o = i + before;
//                 for edge the padding before / after it when i is the first / last; for
//                 reflect every o with (o - before) = +-i mod 2 (len - 1); none for a
//                 constant pad or a cropped i). One thread per element of g'; the sums run
//                 in f64 and the intermediate results between dims are f64 (the CPU's
//                 precision), the last dim's pass rounds once into dx.
#include <cstdint>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"
#include "backends/cuda/kernels/common/indexing.cuh"

namespace fusebox::cuda {

namespace {

// One padded dim: g [outer, padded, inner] folds into out [outer, len, inner].
struct PadFold {
  int64_t outer, padded, len, inner;
  int64_t before;  // pads[d] (negative: cropped)
  PadMode mode;
};

// Calls add(o) for every padded position o in [0, padded) that reads source index i
// (the inverse of pad_source), in increasing o.
template <class F>
__device__ __forceinline__ void for_each_reader(const PadFold& f, int64_t i, F&& add) {
  const int64_t interior = i + f.before;
  if (f.mode == PadMode::constant) {
    if (interior >= 0 && interior < f.padded) add(interior);
    return;
  }
  if (f.mode == PadMode::edge) {
    if (i == 0)
      for (int64_t o = 0; o < min(f.before, f.padded); ++o) add(o);
    if (interior >= 0 && interior < f.padded) add(interior);
    if (i == f.len - 1)
      for (int64_t o = max(f.before + f.len, int64_t(0)); o < f.padded; ++o) add(o);
    return;
  }
  // reflect: j = o - before reads i where j = i or j = -i modulo the period 2 (len - 1)
  // (every o reads index 0 when len == 1).
  const int64_t j_lo = -f.before, j_hi = f.padded - f.before;
  if (f.len == 1) {
    for (int64_t o = 0; o < f.padded; ++o) add(o);
    return;
  }
  const int64_t period = 2 * (f.len - 1);
  auto first_from = [&](int64_t residue) {  // smallest j >= j_lo with j = residue (mod period)
    int64_t r = (residue - j_lo) % period;
    if (r < 0) r += period;
    return j_lo + r;
  };
  const int64_t mirrored = (period - i) % period;
  int64_t a = first_from(i);
  int64_t b = mirrored == i ? INT64_MAX : first_from(mirrored);
  while (a < j_hi || b < j_hi) {
    if (a < b) {
      add(a + f.before);
      a += period;
    } else {
      add(b + f.before);
      b += period;
    }
  }
}

template <class In, class Out>
__global__ void pad_fold_kernel(const In* g, Out* out, PadFold f, int64_t total) {
  for (int64_t idx = global_thread_index(); idx < total; idx += grid_stride()) {
    const int64_t k = idx % f.inner, rest = idx / f.inner;
    const int64_t i = rest % f.len, r = rest / f.len;
    const In* src = g + r * f.padded * f.inner + k;
    double sum = 0.0;
    for_each_reader(f, i,
                    [&](int64_t o) { sum += double(convert<compute_t<In>>(src[o * f.inner])); });
    out[idx] = convert<Out>(sum);
  }
}

template <class T>
void pad_backward_typed(Context& ctx, const PadAttrs& a, const DeviceTensor& dy,
                        const DeviceTensor& dx) {
  const size_t rank = dx.shape.size();
  std::vector<size_t> folded;  // the dims with padding, outermost first
  for (size_t d = 0; d < rank; ++d)
    if (a.pads[d] != 0 || a.pads[rank + d] != 0) folded.push_back(d);
  if (folded.empty()) {
    ctx.encoder.memcpy(dx.range(), dy.range());
    return;
  }
  Shape shape = dy.shape;
  const void* src = dy.data();
  BufferRange src_range = dy.range();
  for (size_t step = 0; step < folded.size(); ++step) {
    const size_t d = folded[step];
    const bool first = step == 0, last = step + 1 == folded.size();
    PadFold f{numel(Shape(shape.begin(), shape.begin() + int64_t(d))),   shape[d],  dx.shape[d],
              numel(Shape(shape.begin() + int64_t(d) + 1, shape.end())), a.pads[d], a.mode};
    shape[d] = f.len;
    const int64_t total = numel(shape);
    DeviceBuffer next;
    void* dst = dx.data();
    BufferRange dst_range = dx.range();
    if (!last) {
      next = ctx.allocator.allocate(std::max<size_t>(size_t(total) * sizeof(double), 1));
      ctx.encoder.add_temporary(next);
      dst = next.data();
      dst_range = BufferRange(next);
    }
    const unsigned blocks = launch_blocks(total);
    const BufferList reads{src_range}, writes{dst_range};
    if (first && last)
      ctx.encoder.launch(pad_fold_kernel<T, T>, blocks, kDefaultThreads, 0, reads, writes,
                         static_cast<const T*>(src), static_cast<T*>(dst), f, total);
    else if (first)
      ctx.encoder.launch(pad_fold_kernel<T, double>, blocks, kDefaultThreads, 0, reads, writes,
                         static_cast<const T*>(src), static_cast<double*>(dst), f, total);
    else if (last)
      ctx.encoder.launch(pad_fold_kernel<double, T>, blocks, kDefaultThreads, 0, reads, writes,
                         static_cast<const double*>(src), static_cast<T*>(dst), f, total);
    else
      ctx.encoder.launch(pad_fold_kernel<double, double>, blocks, kDefaultThreads, 0, reads, writes,
                         static_cast<const double*>(src), static_cast<double*>(dst), f, total);
    src = dst;
    src_range = dst_range;
  }
}

}  // namespace

// x -> y = broadcast_to(x, shape); x may be a strided view.
void expand(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const DeviceTensor& x = *in[0];
  const DeviceTensor& y = out[0];
  Shape merged;
  FUSEBOX_CHECK(
      x.dtype == y.dtype && broadcast_shapes(x.shape, y.shape, &merged) && merged == y.shape,
      node_label(n), "x ", shape_str(x.shape), " does not broadcast to ", shape_str(y.shape));
  if (y.numel() == 0) return;
  copy_strided(ctx, x.view(x.offset, y.shape, broadcast_strides(x.shape, x.strides, y.shape)), y);
}

// (dy) -> dx of input_shape; the slice attributes are normalised against it.
void slice_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const SliceAttrs& a = std::get<SliceBackwardAttrs>(n.attrs).slice;
  const DeviceTensor& dy = *in[0];
  const DeviceTensor& dx = out[0];
  FUSEBOX_CHECK(
      a.normalized && dy.dtype == dx.dtype && dy.rank() == dx.rank() && dx.is_contiguous(),
      node_label(n), "dy ", shape_str(dy.shape), " and dx ", shape_str(dx.shape),
      " do not fit a normalised slice");
  if (dx.numel() == 0) return;
  ctx.encoder.memset(dx.range(), 0);  // +0.0 in every float dtype
  if (dy.numel() == 0) return;        // a start may then equal its extent: no offset to take
  Shape strides = dx.strides;
  int64_t offset = dx.offset;
  for (size_t i = 0; i < a.axes.size(); ++i) {
    const size_t d = size_t(a.axes[i]);
    offset += a.starts[i] * dx.strides[d];
    strides[d] *= a.steps[i];
  }
  copy_strided(ctx, dy, dx.view(offset, dy.shape, std::move(strides)));
}

// (dy) -> dx of input_shape.
void pad_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const PadAttrs& a = std::get<PadBackwardAttrs>(n.attrs).pad;
  const DeviceTensor& dy = *in[0];
  const DeviceTensor& dx = out[0];
  const size_t rank = size_t(dx.rank());
  FUSEBOX_CHECK(a.pads.size() == 2 * rank && dy.rank() == dx.rank() && dy.dtype == dx.dtype &&
                    dy.is_contiguous(),
                node_label(n), "pads ", shape_str(a.pads), " do not fit dy ", shape_str(dy.shape),
                " and dx ", shape_str(dx.shape));
  for (size_t d = 0; d < rank; ++d) {
    FUSEBOX_CHECK(dy.shape[d] == dx.shape[d] + a.pads[d] + a.pads[rank + d], node_label(n), "dy ",
                  shape_str(dy.shape), " is not dx ", shape_str(dx.shape), " padded by ",
                  shape_str(a.pads));
  }
  if (dx.numel() == 0) return;
  visit_device_float(n, dx.dtype,
                     [&](auto tag) { pad_backward_typed<decltype(tag)>(ctx, a, dy, dx); });
}

}  // namespace fusebox::cuda
