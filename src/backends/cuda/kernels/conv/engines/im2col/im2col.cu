// im2col / col2im (im2col.h).
//
// im2col: one thread per 8 columns of a row (one 16-byte store): the row's output position
// and the first column's (tap, c) by division once, then the next columns by stepping c and
// the tap's digits; zero outside x. Moves bits only, so one kernel serves bf16 and f16 (as
// uint16_t). x is small next to col (the stem: 19 MB against 244 MB), so its scattered reads
// hit L2; the writes are coalesced.
// col2im: one thread per dx element, walking each dim's taps and keeping those whose output
// position is whole and inside O; adjacent threads are adjacent channels of one pixel, so
// their reads of a dcol row are adjacent too.
// Index math in 32 bits (the host checks the extents fit): 64-bit division is several times
// slower, and these kernels are a few divisions per element of a bandwidth-bound copy.
#include "backends/cuda/kernels/conv/engines/im2col/im2col.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <limits>

#include "backends/cuda/device/math.cuh"

namespace fusebox::cuda {

namespace {

constexpr int kThreads = 256;

// ConvGeometry in 32 bits.
struct Geometry32 {
  int batch, channels, width, used;  // used: taps * channels
  int in[3], out[3], filter[3], stride[3], dilation[3], pad[3];
};

Geometry32 geometry32(const ConvGeometry& g, int64_t width) {
  const int64_t limit = std::numeric_limits<int32_t>::max();
  FUSEBOX_CHECK(
      g.batch * g.in_size() * g.in_channels <= limit && g.batch * g.out_size() * width <= limit,
      "im2col", "tensors past 2^31 elements");
  Geometry32 q;
  q.batch = int(g.batch), q.channels = int(g.in_channels), q.width = int(width);
  q.used = int(g.filter_size() * g.in_channels);
  for (int d = 0; d < 3; ++d) {
    q.in[d] = int(g.in[d]), q.out[d] = int(g.out[d]), q.filter[d] = int(g.filter[d]);
    q.stride[d] = int(g.stride[d]), q.dilation[d] = int(g.dilation[d]), q.pad[d] = int(g.pad_lo[d]);
  }
  return q;
}

__global__ void im2col_kernel(Geometry32 g, const uint16_t* x, uint16_t* col) {
  const int vectors = g.width / 8;
  const int count = g.batch * g.out[0] * g.out[1] * g.out[2] * vectors;
  for (int i = int(global_thread_index()); i < count; i += int(grid_stride())) {
    const int row = i / vectors, first = (i - row * vectors) * 8;
    int o[3], t = row;
    for (int d = 2; d >= 0; --d) o[d] = t % g.out[d], t /= g.out[d];
    const int n = t;
    int tap = first / g.channels, c = first - tap * g.channels, r[3];
    for (int d = 2; d >= 0; --d) r[d] = tap % g.filter[d], tap /= g.filter[d];
    alignas(16) uint16_t v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[e] = 0;
      if (first + e < g.used) {
        int pos = n;
        bool inside = true;
        for (int d = 0; d < 3; ++d) {
          const int p = o[d] * g.stride[d] - g.pad[d] + r[d] * g.dilation[d];
          inside = inside && p >= 0 && p < g.in[d];
          pos = pos * g.in[d] + p;
        }
        if (inside) v[e] = x[pos * g.channels + c];
      }
      // The next column: c, then the tap's digits r2, r1, r0.
      if (++c == g.channels) {
        c = 0;
        if (++r[2] == g.filter[2]) {
          r[2] = 0;
          if (++r[1] == g.filter[1]) r[1] = 0, ++r[0];
        }
      }
    }
    *reinterpret_cast<uint4*>(col + int64_t(row) * g.width + first) =
        *reinterpret_cast<const uint4*>(v);
  }
}

template <class T>
__global__ void col2im_kernel(Geometry32 g, const T* dcol, T* dx) {
  const int count = g.batch * g.in[0] * g.in[1] * g.in[2] * g.channels;
  for (int i = int(global_thread_index()); i < count; i += int(grid_stride())) {
    const int c = i % g.channels;
    int d[3], t = i / g.channels;
    for (int k = 2; k >= 0; --k) d[k] = t % g.in[k], t /= g.in[k];
    const int n = t;
    float sum = 0;
    for (int r0 = 0; r0 < g.filter[0]; ++r0) {
      const int q0 = d[0] + g.pad[0] - r0 * g.dilation[0];
      if (q0 < 0 || q0 % g.stride[0] != 0 || q0 / g.stride[0] >= g.out[0]) continue;
      for (int r1 = 0; r1 < g.filter[1]; ++r1) {
        const int q1 = d[1] + g.pad[1] - r1 * g.dilation[1];
        if (q1 < 0 || q1 % g.stride[1] != 0 || q1 / g.stride[1] >= g.out[1]) continue;
        const int row01 = (n * g.out[0] + q0 / g.stride[0]) * g.out[1] + q1 / g.stride[1];
        for (int r2 = 0; r2 < g.filter[2]; ++r2) {
          const int q2 = d[2] + g.pad[2] - r2 * g.dilation[2];
          if (q2 < 0 || q2 % g.stride[2] != 0 || q2 / g.stride[2] >= g.out[2]) continue;
          const int row = row01 * g.out[2] + q2 / g.stride[2];
          const int tap = (r0 * g.filter[1] + r1) * g.filter[2] + r2;
          sum += load_compute(dcol, int64_t(row) * g.width + tap * g.channels + c);
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
                     dim3(kThreads), 0, {x.range()}, {col.range()}, geometry32(g, width),
                     static_cast<const uint16_t*>(x.data()), static_cast<uint16_t*>(col.data()));
}

void record_col2im(Context& ctx, const ConvGeometry& g, const DeviceTensor& dcol,
                   const DeviceTensor& dx) {
  check_16bit(dx, "dx");
  const int64_t width = im2col_width(g), count = g.batch * g.in_size() * g.in_channels;
  FUSEBOX_CHECK(dcol.numel() == g.batch * g.out_size() * width && dx.numel() == count, "col2im",
                "dcol / dx extents do not match the geometry");
  const dim3 grid(launch_blocks(count, kThreads)), block(kThreads);
  const Geometry32 q = geometry32(g, width);
  if (dx.dtype == DType::bf16)
    ctx.encoder.launch(&col2im_kernel<__nv_bfloat16>, grid, block, 0, {dcol.range()}, {dx.range()},
                       q, dcol.as<const __nv_bfloat16>(), dx.as<__nv_bfloat16>());
  else
    ctx.encoder.launch(&col2im_kernel<__half>, grid, block, 0, {dcol.range()}, {dx.range()}, q,
                       dcol.as<const __half>(), dx.as<__half>());
}

}  // namespace fusebox::cuda
