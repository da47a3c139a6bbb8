// gather and gather_backward on the GPU, the CPU backend's rule (cpu/gather.cpp):
// data viewed as [outer, extent, inner] around the axis, the indices flattened to [count],
// y as [outer, count, inner]:
//
//   gather:          y[o, j, i] = data[o, idx[j], i]   (idx[j] < 0 counts from the end)
//   gather_backward: ddata = 0, then ddata[o, idx[j], i] += dy[o, j, i] for every j
//
// One thread per element of y (dy), walking it in order, so neighbouring threads copy
// neighbouring elements of one row (an embedding's row of width inner). The forward moves
// words, whatever the dtype. An index outside [-extent, extent) raises the node's error
// (runtime/error_flags.h) and the halt word (bad training data: the step's updates are
// skipped); y's element is then 0.
//
// The backward adds with atomics: repeated indices (the same token twice in a batch) meet
// in one row, so its sums run in no fixed order (not bit-reproducible from run to run, as
// PyTorch's embedding backward with deterministic algorithms off). f16 / bf16 gradients
// are summed in an f32 temporary and rounded once; f32 and f64 in place.
#include <cstdint>

#include "backends/common/gather_view.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"
#include "backends/cuda/runtime/error_flags.h"

namespace fusebox::cuda {

namespace {

template <class W, class I>
__global__ void gather_rows(const W* data, const I* idx, GatherView v, W* y, ErrorRecord* error,
                            int32_t* halt) {
  const int64_t total = v.outer * v.count * v.inner;
  for (int64_t e = global_thread_index(); e < total; e += grid_stride()) {
    const int64_t i = e % v.inner, t = e / v.inner;
    const int64_t j = t % v.count, o = t / v.count;
    int64_t k = int64_t(idx[j]);
    if (k < 0) k += v.extent;
    if (k < 0 || k >= v.extent) {
      raise_error(error, j, int64_t(idx[j]));
      raise_halt(halt);
      y[e] = W(0);
      continue;
    }
    y[e] = data[(o * v.extent + k) * v.inner + i];
  }
}

// acc (ddata's shape, zeroed) += dy at the gathered positions. Out-of-range indices are
// skipped: the forward raised for them.
template <class T, class A, class I>
__global__ void gather_scatter_add(const T* dy, const I* idx, GatherView v, A* acc) {
  const int64_t total = v.outer * v.count * v.inner;
  for (int64_t e = global_thread_index(); e < total; e += grid_stride()) {
    const int64_t i = e % v.inner, t = e / v.inner;
    const int64_t j = t % v.count, o = t / v.count;
    int64_t k = int64_t(idx[j]);
    if (k < 0) k += v.extent;
    if (k < 0 || k >= v.extent) continue;
    atomicAdd(&acc[(o * v.extent + k) * v.inner + i], A(load_compute(dy, e)));
  }
}

template <class T>
__global__ void round_into(const float* acc, int64_t n, T* out) {
  for (int64_t e = global_thread_index(); e < n; e += grid_stride()) store_compute(out, e, acc[e]);
}

template <class F>
void visit_index_dtype(const Node& n, DType t, F&& f) {
  if (t == DType::i64) return f(int64_t{});
  if (t == DType::i32) return f(int32_t{});
  throw Error(node_label(n), cat("indices must be i64 or i32, got ", dtype_name(t)));
}

}  // namespace

void gather(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<GatherAttrs>(n.attrs);
  const DeviceTensor& data = *in[0];
  const DeviceTensor& idx = *in[1];
  const DeviceTensor& y = out[0];
  FUSEBOX_CHECK(data.is_contiguous() && idx.is_contiguous() && y.is_contiguous(), node_label(n),
                "expects contiguous tensors");
  if (y.numel() == 0) return;
  const GatherView v = gather_view(data.shape, a.axis, idx.numel());
  ErrorFlags& flags = ErrorFlags::of(ctx.encoder);
  const ErrorSlot slot = flags.reserve(
      node_label(n), [extent = v.extent, shape = idx.shape, axis = a.axis](int64_t j, int64_t k) {
        return cat("index ", k, " at position ", position_str(j, shape),
                   " of input 1 (indices) is outside [", -extent, ", ", extent, ") (dim ", axis,
                   " of data)");
      });
  BufferList writes{y.range(), slot.range};
  if (flags.halt()) writes.push_back(*flags.halt());
  visit_index_dtype(n, idx.dtype, [&](auto itag) {
    using I = decltype(itag);
    auto launch = [&](auto wtag) {
      using W = decltype(wtag);
      ctx.encoder.launch(&gather_rows<W, I>, dim3(launch_blocks(y.numel())), dim3(kDefaultThreads),
                         0, {data.range(), idx.range()}, writes, data.as<const W>(),
                         idx.as<const I>(), v, y.as<W>(), slot.record, flags.halt_word());
    };
    visit_bytes(dtype_size(data.dtype), launch);
  });
}

void gather_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<GatherBackwardAttrs>(n.attrs);
  const DeviceTensor& dy = *in[0];
  const DeviceTensor& idx = *in[1];
  const DeviceTensor& dx = out[0];
  FUSEBOX_CHECK(dy.is_contiguous() && idx.is_contiguous() && dx.is_contiguous(), node_label(n),
                "expects contiguous tensors");
  if (dx.numel() == 0) return;
  if (dy.numel() == 0) {                // nothing gathered: the gradient is all zeros
    ctx.encoder.memset(dx.range(), 0);  // +0.0 in every float dtype
    return;
  }
  const GatherView v = gather_view(dx.shape, a.gather.axis, idx.numel());
  visit_index_dtype(n, idx.dtype, [&](auto itag) {
    using I = decltype(itag);
    visit_device_float(n, dx.dtype, [&](auto tag) {
      using T = decltype(tag);
      using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
      const dim3 grid(launch_blocks(dy.numel())), block(kDefaultThreads);
      if constexpr (std::is_same_v<T, A>) {
        ctx.encoder.memset(dx.range(), 0);
        ctx.encoder.launch(&gather_scatter_add<T, A, I>, grid, block, 0, {dy.range(), idx.range()},
                           {dx.range()}, dy.as<const T>(), idx.as<const I>(), v, dx.as<A>());
      } else {
        const DeviceTensor acc = temporary_tensor(ctx, DType::f32, dx.shape);
        ctx.encoder.memset(acc.range(), 0);
        ctx.encoder.launch(&gather_scatter_add<T, A, I>, grid, block, 0, {dy.range(), idx.range()},
                           {acc.range()}, dy.as<const T>(), idx.as<const I>(), v, acc.as<float>());
        ctx.encoder.launch(&round_into<T>, dim3(launch_blocks(dx.numel())), block, 0, {acc.range()},
                           {dx.range()}, acc.as<const float>(), dx.numel(), dx.as<T>());
      }
    });
  });
}

}  // namespace fusebox::cuda
