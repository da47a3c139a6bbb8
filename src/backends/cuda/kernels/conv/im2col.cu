// im2col / col2im (im2col.h).
//
// im2col: one thread per 8 columns of a row (one 16-byte store): each column's (tap, c) and
// the input position it reads, zero outside x. Moves bits only, so one kernel serves bf16 and
// f16 (as uint16_t). x is small next to col (the stem: 19 MB against 244 MB), so its
// scattered reads hit L2; the writes are coalesced.
// col2im: one thread per dx element, walking the taps and keeping those whose output
// position is whole and inside O; adjacent threads are adjacent channels of one pixel, so
// their reads of a dcol row are adjacent too.
#include "backends/cuda/kernels/conv/im2col.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cuda/device/math.cuh"

namespace fusebox::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void im2col_kernel(ConvGeometry g, int64_t width, const uint16_t* x, uint16_t* col) {
  const int64_t vectors = width / 8, rows = g.batch * g.out_size();
  const int64_t c_count = g.in_channels, used = g.filter_size() * c_count;
  for (int64_t i = global_thread_index(); i < rows * vectors; i += grid_stride()) {
    const int64_t row = i / vectors, first = (i % vectors) * 8;
    int64_t o[3], t = row;
    for (int d = 2; d >= 0; --d) o[d] = t % g.out[d], t /= g.out[d];
    const int64_t n = t;
    alignas(16) uint16_t v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int64_t j = first + e;
      v[e] = 0;
      if (j >= used) continue;
      int64_t tap = j / c_count, r[3];
      const int64_t c = j % c_count;
      for (int d = 2; d >= 0; --d) r[d] = tap % g.filter[d], tap /= g.filter[d];
      int64_t pos = n;
      bool inside = true;
      for (int d = 0; d < 3; ++d) {
        const int64_t p = o[d] * g.stride[d] - g.pad_lo[d] + r[d] * g.dilation[d];
        inside = inside && p >= 0 && p < g.in[d];
        pos = pos * g.in[d] + p;
      }
      if (inside) v[e] = x[pos * c_count + c];
    }
    *reinterpret_cast<uint4*>(col + row * width + first) = *reinterpret_cast<const uint4*>(v);
  }
}

template <class T>
__global__ void col2im_kernel(ConvGeometry g, int64_t width, const T* dcol, T* dx) {
  const int64_t c_count = g.in_channels, count = g.batch * g.in_size() * c_count;
  for (int64_t i = global_thread_index(); i < count; i += grid_stride()) {
    const int64_t c = i % c_count;
    int64_t d[3], t = i / c_count;
    for (int k = 2; k >= 0; --k) d[k] = t % g.in[k], t /= g.in[k];
    const int64_t n = t;
    float sum = 0;
    for (int64_t r0 = 0; r0 < g.filter[0]; ++r0) {
      const int64_t q0 = d[0] + g.pad_lo[0] - r0 * g.dilation[0];
      if (q0 < 0 || q0 % g.stride[0] != 0 || q0 / g.stride[0] >= g.out[0]) continue;
      for (int64_t r1 = 0; r1 < g.filter[1]; ++r1) {
        const int64_t q1 = d[1] + g.pad_lo[1] - r1 * g.dilation[1];
        if (q1 < 0 || q1 % g.stride[1] != 0 || q1 / g.stride[1] >= g.out[1]) continue;
        for (int64_t r2 = 0; r2 < g.filter[2]; ++r2) {
          const int64_t q2 = d[2] + g.pad_lo[2] - r2 * g.dilation[2];
          if (q2 < 0 || q2 % g.stride[2] != 0 || q2 / g.stride[2] >= g.out[2]) continue;
          const int64_t row =
              ((n * g.out[0] + q0 / g.stride[0]) * g.out[1] + q1 / g.stride[1]) * g.out[2] +
              q2 / g.stride[2];
          const int64_t tap = (r0 * g.filter[1] + r1) * g.filter[2] + r2;
          sum += load_compute(dcol, row * width + tap * c_count + c);
        }
      }
    }
    store_compute(dx, i, sum);
  }
}

void check_16bit(const DeviceTensor& t, const char* what) {
  if (t.dtype != DType::bf16 && t.dtype != DType::f16)
    throw Error("im2col", cat(what, " is ", dtype_name(t.dtype), "; im2col takes bf16 and f16"));
}

}  // namespace

int64_t im2col_width(const ConvGeometry& g) {
  return (g.filter_size() * g.in_channels + 7) / 8 * 8;
}

void record_im2col(Context& ctx, const ConvGeometry& g, const DeviceTensor& x,
                   const DeviceTensor& col) {
  check_16bit(x, "x");
  const int64_t width = im2col_width(g), rows = g.batch * g.out_size();
  FUSEBOX_CHECK(col.numel() == rows * width && x.numel() == g.batch * g.in_size() * g.in_channels,
                "im2col", "col / x extents do not match the geometry");
  ctx.encoder.launch(&im2col_kernel, dim3(launch_blocks(rows * (width / 8), kThreads)),
                     dim3(kThreads), 0, {x.range()}, {col.range()}, g, width,
                     static_cast<const uint16_t*>(x.data()), static_cast<uint16_t*>(col.data()));
}

void record_col2im(Context& ctx, const ConvGeometry& g, const DeviceTensor& dcol,
                   const DeviceTensor& dx) {
  check_16bit(dx, "dx");
  const int64_t width = im2col_width(g), count = g.batch * g.in_size() * g.in_channels;
  FUSEBOX_CHECK(dcol.numel() == g.batch * g.out_size() * width && dx.numel() == count, "col2im",
                "dcol / dx extents do not match the geometry");
  const dim3 grid(launch_blocks(count, kThreads)), block(kThreads);
  if (dx.dtype == DType::bf16)
    ctx.encoder.launch(&col2im_kernel<__nv_bfloat16>, grid, block, 0, {dcol.range()}, {dx.range()},
                       g, width, dcol.as<const __nv_bfloat16>(), dx.as<__nv_bfloat16>());
  else
    ctx.encoder.launch(&col2im_kernel<__half>, grid, block, 0, {dcol.range()}, {dx.range()}, g,
                       width, dcol.as<const __half>(), dx.as<__half>());
}

}  // namespace fusebox::cuda
