// Elementwise maps for the CUDA kernels (include from .cu files only): the launch machinery
// that unary ops, binary ops and cast share.
//
//   launch_map1(ctx, where, x, y, op)     y[i] = op(x[i])        y contiguous, x any strides
//   launch_map2(ctx, where, a, b, y, op, extra_writes)
//                                         y[i] = op(a[i], b[i])  y contiguous, a and b any
//                                         strides, broadcast to y's shape (numpy rules)
//
// `op` is a device functor taking raw elements (In, or A and B) and returning Out; it
// does its own conversions (see UnaryMath / BinaryMath in the pointwise files).
//
// Paths, picked on the host per call:
//   flat, vectorised  every operand contiguous with y's shape, 16-byte aligned, and all
//                     element types of one size: one 128-bit load per operand per thread
//                     step, the tail (n % width) done by scalar steps
//   flat, strided     after merging dims the walk is 1-D: operand k at i * stride_k
//                     (covers contiguous operands that are misaligned, and a broadcast
//                     scalar: stride 0); no index division at all
//   rows, vectorised  after merging the walk is rows of contiguous elements, each operand's
//                     rows at its own stride (a channel slice of a channels-last tensor: a
//                     concat's gradient; a row broadcast, stride 0), every row start and
//                     base 16-byte aligned, element types of one size: 128-bit loads, one
//                     index division per vector (the N-d walk divides per element: UNet's
//                     skip-gradient add read a sliced operand at ~1.3 TB/s on an H200)
//   N-d strided       the general walk: StridedLayout offsets per element, 32-bit index
//                     division when the element count allows
// All three are grid-stride loops over at most kMaxGridStrideBlocks blocks of 256 threads.
#pragma once

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"
#include "backends/cuda/kernels/common/indexing.cuh"

namespace fusebox::cuda {

// ---- one operand ---------------------------------------------------------------------

template <class In, class Out, class Op>
__global__ void map1_vectorised(const In* x, Out* y, int64_t n, Op op) {
  static_assert(sizeof(In) == sizeof(Out));
  constexpr int W = kVecWidth<In>;
  const int64_t vectors = n / W;
  for (int64_t v = global_thread_index(); v < vectors; v += grid_stride()) {
    const Vec<In> in = load_vec(x, v);
    Vec<Out> out;
#pragma unroll
    for (int j = 0; j < W; ++j) out.v[j] = op(in.v[j]);
    store_vec(y, v, out);
  }
  for (int64_t i = vectors * W + global_thread_index(); i < n; i += grid_stride()) y[i] = op(x[i]);
}

template <class In, class Out, class Op>
__global__ void map1_flat(const In* x, int64_t x_stride, Out* y, int64_t n, Op op) {
  for (int64_t i = global_thread_index(); i < n; i += grid_stride()) y[i] = op(x[i * x_stride]);
}

template <class In, class Out, class Op, class Index>
__global__ void map1_rows(const In* x, int64_t x_row, Out* y, int64_t y_row, Index row_vectors,
                          Index vectors, Op op) {
  constexpr int W = kVecWidth<In>;
  for (Index v = Index(global_thread_index()); v < vectors; v += Index(grid_stride())) {
    const Index r = v / row_vectors, c = v - r * row_vectors;
    const Vec<In> in = load_vec(x + int64_t(r) * x_row, int64_t(c));
    Vec<Out> out;
#pragma unroll
    for (int j = 0; j < W; ++j) out.v[j] = op(in.v[j]);
    store_vec(y + int64_t(r) * y_row, int64_t(c), out);
  }
}

// Whether `layout` (rank 2 after merging) walks rows of `w` * k contiguous elements in every
// operand, each operand's row stride a multiple of w (0: the same row each time), and every
// base pointer 16-byte aligned: the rows path (header).
template <int N>
bool rows_of_vectors(const StridedLayout<N>& layout, int64_t w,
                     const std::array<const void*, N>& bases) {
  if (layout.rank != 2 || layout.extent[0] % w != 0) return false;
  for (int k = 0; k < N; ++k)
    if (layout.stride[k][0] != 1 || layout.stride[k][1] % w != 0 ||
        !is_aligned(bases[k], kVecBytes))
      return false;
  return true;
}

template <class In, class Out, class Op, class Index>
__global__ void map1_strided(const In* x, Out* y, StridedLayout<2> layout, Index n, Op op) {
  for (Index i = Index(global_thread_index()); i < n; i += Index(grid_stride())) {
    int64_t off[2];
    layout.offsets(i, off);
    y[off[0]] = op(x[off[1]]);
  }
}

template <class In, class Out, class Op>
void launch_map1(Context& ctx, const Where& where, const DeviceTensor& x, const DeviceTensor& y,
                 Op op) {
  const int64_t n = y.numel();
  if (n == 0) return;
  const In* px = x.as<In>();
  Out* py = y.as<Out>();
  const StridedLayout<2> layout = make_layout<2>(where, y.shape, {y.strides, x.strides});
  const unsigned blocks = launch_blocks(n);
  const BufferList reads{x.range()}, writes{y.range()};
  if (layout.rank == 1) {
    const int64_t sy = layout.inner_stride(0), sx = layout.inner_stride(1);
    if (sy == 1 && sx == 1 && sizeof(In) == sizeof(Out) && is_aligned(px, kVecBytes) &&
        is_aligned(py, kVecBytes)) {
      if constexpr (sizeof(In) == sizeof(Out)) {
        ctx.encoder.launch(map1_vectorised<In, Out, Op>, launch_blocks(n / kVecWidth<In> + 1),
                           kDefaultThreads, 0, reads, writes, px, py, n, op);
        return;
      }
    }
    if (sy == 1) {
      ctx.encoder.launch(map1_flat<In, Out, Op>, blocks, kDefaultThreads, 0, reads, writes, px, sx,
                         py, n, op);
      return;
    }
  }
  if constexpr (sizeof(In) == sizeof(Out)) {
    constexpr int W = kVecWidth<In>;
    if (rows_of_vectors<2>(layout, W, {py, px})) {
      const int64_t row_vectors = layout.extent[0] / W, vectors = n / W;
      const unsigned vector_blocks = launch_blocks(vectors);
      if (fits_u32(vectors))
        ctx.encoder.launch(map1_rows<In, Out, Op, uint32_t>, vector_blocks, kDefaultThreads, 0,
                           reads, writes, px, layout.stride[1][1], py, layout.stride[0][1],
                           uint32_t(row_vectors), uint32_t(vectors), op);
      else
        ctx.encoder.launch(map1_rows<In, Out, Op, uint64_t>, vector_blocks, kDefaultThreads, 0,
                           reads, writes, px, layout.stride[1][1], py, layout.stride[0][1],
                           uint64_t(row_vectors), uint64_t(vectors), op);
      return;
    }
  }
  if (fits_u32(n))
    ctx.encoder.launch(map1_strided<In, Out, Op, uint32_t>, blocks, kDefaultThreads, 0, reads,
                       writes, px, py, layout, uint32_t(n), op);
  else
    ctx.encoder.launch(map1_strided<In, Out, Op, uint64_t>, blocks, kDefaultThreads, 0, reads,
                       writes, px, py, layout, uint64_t(n), op);
}

// ---- two operands --------------------------------------------------------------------

template <class A, class B, class Out, class Op>
__global__ void map2_vectorised(const A* a, const B* b, Out* y, int64_t n, Op op) {
  static_assert(sizeof(A) == sizeof(Out) && sizeof(B) == sizeof(Out));
  constexpr int W = kVecWidth<Out>;
  const int64_t vectors = n / W;
  for (int64_t v = global_thread_index(); v < vectors; v += grid_stride()) {
    const Vec<A> va = load_vec(a, v);
    const Vec<B> vb = load_vec(b, v);
    Vec<Out> out;
#pragma unroll
    for (int j = 0; j < W; ++j) out.v[j] = op(va.v[j], vb.v[j]);
    store_vec(y, v, out);
  }
  for (int64_t i = vectors * W + global_thread_index(); i < n; i += grid_stride())
    y[i] = op(a[i], b[i]);
}

template <class A, class B, class Out, class Op>
__global__ void map2_flat(const A* a, int64_t a_stride, const B* b, int64_t b_stride, Out* y,
                          int64_t n, Op op) {
  for (int64_t i = global_thread_index(); i < n; i += grid_stride())
    y[i] = op(a[i * a_stride], b[i * b_stride]);
}

template <class A, class B, class Out, class Op, class Index>
__global__ void map2_rows(const A* a, int64_t a_row, const B* b, int64_t b_row, Out* y,
                          int64_t y_row, Index row_vectors, Index vectors, Op op) {
  constexpr int W = kVecWidth<Out>;
  for (Index v = Index(global_thread_index()); v < vectors; v += Index(grid_stride())) {
    const Index r = v / row_vectors, c = v - r * row_vectors;
    const Vec<A> va = load_vec(a + int64_t(r) * a_row, int64_t(c));
    const Vec<B> vb = load_vec(b + int64_t(r) * b_row, int64_t(c));
    Vec<Out> out;
#pragma unroll
    for (int j = 0; j < W; ++j) out.v[j] = op(va.v[j], vb.v[j]);
    store_vec(y + int64_t(r) * y_row, int64_t(c), out);
  }
}

template <class A, class B, class Out, class Op, class Index>
__global__ void map2_strided(const A* a, const B* b, Out* y, StridedLayout<3> layout, Index n,
                             Op op) {
  for (Index i = Index(global_thread_index()); i < n; i += Index(grid_stride())) {
    int64_t off[3];
    layout.offsets(i, off);
    y[off[0]] = op(a[off[1]], b[off[2]]);
  }
}

// `extra_writes`: what op itself may write (an ErrorRecord), declared with y.
template <class A, class B, class Out, class Op>
void launch_map2(Context& ctx, const Where& where, const DeviceTensor& a, const DeviceTensor& b,
                 const DeviceTensor& y, Op op, const BufferList& extra_writes = {}) {
  const int64_t n = y.numel();
  if (n == 0) return;
  const A* pa = a.as<A>();
  const B* pb = b.as<B>();
  Out* py = y.as<Out>();
  const StridedLayout<3> layout =
      make_layout<3>(where, y.shape,
                     {y.strides, broadcast_strides(a.shape, a.strides, y.shape),
                      broadcast_strides(b.shape, b.strides, y.shape)});
  const unsigned blocks = launch_blocks(n);
  const BufferList reads{a.range(), b.range()};
  BufferList writes{y.range()};
  writes.insert(writes.end(), extra_writes.begin(), extra_writes.end());
  if (layout.rank == 1 && layout.inner_stride(0) == 1) {
    const int64_t sa = layout.inner_stride(1), sb = layout.inner_stride(2);
    if constexpr (sizeof(A) == sizeof(Out) && sizeof(B) == sizeof(Out)) {
      if (sa == 1 && sb == 1 && is_aligned(pa, kVecBytes) && is_aligned(pb, kVecBytes) &&
          is_aligned(py, kVecBytes)) {
        ctx.encoder.launch(map2_vectorised<A, B, Out, Op>, launch_blocks(n / kVecWidth<Out> + 1),
                           kDefaultThreads, 0, reads, writes, pa, pb, py, n, op);
        return;
      }
    }
    ctx.encoder.launch(map2_flat<A, B, Out, Op>, blocks, kDefaultThreads, 0, reads, writes, pa, sa,
                       pb, sb, py, n, op);
    return;
  }
  if constexpr (sizeof(A) == sizeof(Out) && sizeof(B) == sizeof(Out)) {
    constexpr int W = kVecWidth<Out>;
    if (rows_of_vectors<3>(layout, W, {py, pa, pb})) {
      const int64_t row_vectors = layout.extent[0] / W, vectors = n / W;
      const unsigned vector_blocks = launch_blocks(vectors);
      const int64_t ya = layout.stride[0][1], ra = layout.stride[1][1], rb = layout.stride[2][1];
      if (fits_u32(vectors))
        ctx.encoder.launch(map2_rows<A, B, Out, Op, uint32_t>, vector_blocks, kDefaultThreads, 0,
                           reads, writes, pa, ra, pb, rb, py, ya, uint32_t(row_vectors),
                           uint32_t(vectors), op);
      else
        ctx.encoder.launch(map2_rows<A, B, Out, Op, uint64_t>, vector_blocks, kDefaultThreads, 0,
                           reads, writes, pa, ra, pb, rb, py, ya, uint64_t(row_vectors),
                           uint64_t(vectors), op);
      return;
    }
  }
  if (fits_u32(n))
    ctx.encoder.launch(map2_strided<A, B, Out, Op, uint32_t>, blocks, kDefaultThreads, 0, reads,
                       writes, pa, pb, py, layout, uint32_t(n), op);
  else
    ctx.encoder.launch(map2_strided<A, B, Out, Op, uint64_t>, blocks, kDefaultThreads, 0, reads,
                       writes, pa, pb, py, layout, uint64_t(n), op);
}

}  // namespace fusebox::cuda
