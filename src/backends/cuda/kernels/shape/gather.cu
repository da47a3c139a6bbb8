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
// gather_elements (and its backward) map each index position p of the indices' shape to
// data's offset with p's coordinate along the axis replaced by idx[p] (ElementsMap).
//
// The backwards add with atomics: repeated indices (the same token twice in a batch) meet
// in one row, so its sums run in no fixed order (not bit-reproducible from run to run, as
// PyTorch's embedding backward with deterministic algorithms off). f16 / bf16 gradients
// are summed in an f32 temporary and rounded once; f32 and f64 in place.
#include <cstdint>

#include "backends/common/gather_view.h"
#include "backends/cuda/device/strided_layout.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"
#include "backends/cuda/kernels/common/scatter_sum.cuh"
#include "backends/cuda/runtime/error_flags.h"

namespace fusebox::cuda {

namespace {

// Index k along an axis of `extent` as a position in [0, extent) (negative ones count from
// the end); -1 when out of range.
template <class I>
__device__ __forceinline__ int64_t position_along(I k, int64_t extent) {
  const int64_t p = int64_t(k) < 0 ? int64_t(k) + extent : int64_t(k);
  return p >= 0 && p < extent ? p : -1;
}

template <class W, class I>
__global__ void gather_rows(const W* data, const I* idx, GatherView v, W* y, ErrorRecord* error,
                            int32_t* halt) {
  const int64_t total = v.outer * v.count * v.inner;
  for (int64_t e = global_thread_index(); e < total; e += grid_stride()) {
    const int64_t i = e % v.inner, t = e / v.inner;
    const int64_t j = t % v.count, o = t / v.count;
    const int64_t k = position_along(idx[j], v.extent);
    if (k < 0) {
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
    const int64_t k = position_along(idx[j], v.extent);
    if (k < 0) continue;
    atomicAdd(&acc[(o * v.extent + k) * v.inner + i], A(load_compute(dy, e)));
  }
}

// gather_elements' map (rank <= kMaxDims): index position p -> data offset.
struct ElementsMap {
  int rank, axis;
  int64_t extent;                  // data's along the axis
  int64_t index_shape[kMaxDims];   // outermost first
  int64_t data_strides[kMaxDims];  // contiguous, outermost first
  __device__ __forceinline__ int64_t source(int64_t p, int64_t k) const {
    int64_t offset = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t c = p % index_shape[d];
      p /= index_shape[d];
      offset += (d == axis ? k : c) * data_strides[d];
    }
    return offset;
  }
};

ElementsMap elements_map(const Node& n, const Shape& data, const Shape& indices, int64_t axis) {
  FUSEBOX_CHECK(data.size() <= size_t(kMaxDims), node_label(n), "gather_elements of rank ",
                data.size(), "; the CUDA kernel handles at most ", kMaxDims);
  ElementsMap m{int(data.size()), int(axis), data[size_t(axis)], {}, {}};
  const Shape strides = contiguous_strides(data);
  for (size_t d = 0; d < data.size(); ++d) {
    m.index_shape[d] = indices[d];
    m.data_strides[d] = strides[d];
  }
  return m;
}

template <class W, class I>
__global__ void gather_elements_kernel(const W* data, const I* idx, int64_t count, ElementsMap m,
                                       W* y, ErrorRecord* error, int32_t* halt) {
  for (int64_t p = global_thread_index(); p < count; p += grid_stride()) {
    const int64_t k = position_along(idx[p], m.extent);
    if (k < 0) {
      raise_error(error, p, int64_t(idx[p]));
      raise_halt(halt);
      y[p] = W(0);
      continue;
    }
    y[p] = data[m.source(p, k)];
  }
}

template <class T, class A, class I>
__global__ void gather_elements_scatter_add(const T* dy, const I* idx, int64_t count, ElementsMap m,
                                            A* acc) {
  for (int64_t p = global_thread_index(); p < count; p += grid_stride()) {
    const int64_t k = position_along(idx[p], m.extent);
    if (k < 0) continue;  // the forward raised for it
    atomicAdd(&acc[m.source(p, k)], A(load_compute(dy, p)));
  }
}

template <class F>
void visit_index_dtype(const Node& n, DType t, F&& f) {
  if (t == DType::i64) return f(int64_t{});
  if (t == DType::i32) return f(int32_t{});
  throw Error(node_label(n), cat("indices must be i64 or i32, got ", dtype_name(t)));
}

// gather and gather_elements: checks, the node's error record, one launch.
void run_gather(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const int64_t axis = std::get<GatherAttrs>(n.attrs).axis;
  const DeviceTensor& data = *in[0];
  const DeviceTensor& idx = *in[1];
  const DeviceTensor& y = out[0];
  FUSEBOX_CHECK(data.is_contiguous() && idx.is_contiguous() && y.is_contiguous(), node_label(n),
                "expects contiguous tensors");
  if (y.numel() == 0) return;
  const int64_t extent = data.shape[size_t(axis)];
  ErrorFlags& flags = ErrorFlags::of(ctx.encoder);
  const ErrorSlot slot =
      flags.reserve(node_label(n), [extent, shape = idx.shape, axis](int64_t j, int64_t k) {
        return cat("index ", k, " at position ", position_str(j, shape),
                   " of input 1 (indices) is outside [", -extent, ", ", extent, ") (dim ", axis,
                   " of data)");
      });
  const BufferList reads{data.range(), idx.range()};
  BufferList writes{y.range(), slot.range};
  if (flags.halt()) writes.push_back(*flags.halt());
  const dim3 grid(launch_blocks(y.numel())), block(kDefaultThreads);
  visit_index_dtype(n, idx.dtype, [&](auto itag) {
    using I = decltype(itag);
    visit_bytes(dtype_size(data.dtype), [&](auto wtag) {
      using W = decltype(wtag);
      if (n.op == OpKind::gather)
        ctx.encoder.launch(&gather_rows<W, I>, grid, block, 0, reads, writes, data.as<const W>(),
                           idx.as<const I>(), gather_view(data.shape, axis, idx.numel()), y.as<W>(),
                           slot.record, flags.halt_word());
      else
        ctx.encoder.launch(&gather_elements_kernel<W, I>, grid, block, 0, reads, writes,
                           data.as<const W>(), idx.as<const I>(), idx.numel(),
                           elements_map(n, data.shape, idx.shape, axis), y.as<W>(), slot.record,
                           flags.halt_word());
    });
  });
}

// gather_backward and gather_elements_backward: zeros, then the scatter-add (into an f32
// temporary for f16 / bf16, rounded once).
void run_gather_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const int64_t axis = std::get<GatherBackwardAttrs>(n.attrs).gather.axis;
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
  visit_index_dtype(n, idx.dtype, [&](auto itag) {
    using I = decltype(itag);
    visit_device_float(n, dx.dtype, [&](auto tag) {
      using T = decltype(tag);
      using A = typename ScatterSum<T>::A;
      const dim3 grid(launch_blocks(dy.numel())), block(kDefaultThreads);
      const ScatterSum<T> sum(ctx, dx);
      if (n.op == OpKind::gather_backward)
        ctx.encoder.launch(&gather_scatter_add<T, A, I>, grid, block, 0, {dy.range(), idx.range()},
                           {sum.range()}, dy.as<const T>(), idx.as<const I>(),
                           gather_view(dx.shape, axis, idx.numel()), sum.acc());
      else
        ctx.encoder.launch(&gather_elements_scatter_add<T, A, I>, grid, block, 0,
                           {dy.range(), idx.range()}, {sum.range()}, dy.as<const T>(),
                           idx.as<const I>(), idx.numel(),
                           elements_map(n, dx.shape, idx.shape, axis), sum.acc());
      sum.finish(ctx);
    });
  });
}

}  // namespace

void gather(Context& ctx, const Node& n, Inputs in, Outputs out) {
  run_gather(ctx, n, in, out);
}
void gather_elements(Context& ctx, const Node& n, Inputs in, Outputs out) {
  run_gather(ctx, n, in, out);
}
void gather_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  run_gather_backward(ctx, n, in, out);
}
void gather_elements_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  run_gather_backward(ctx, n, in, out);
}

}  // namespace fusebox::cuda
