// pad on the GPU: constant, reflect and edge modes, negative pads crop.
//
// One thread per element of y (a grid-stride loop): peel y's coordinates off the flat
// index, map each through pad_source (the CPU backend's rule: -1 for a constant-padded
// position, else the x index it copies), and store x at the mapped position or the fill
// value. Elements are moved as raw bytes; the fill value is converted to x's dtype on the
// host (Tensor::scalar), as the CPU does.
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"
#include "backends/cuda/kernels/common/indexing.cuh"

namespace fusebox::cuda {

namespace {

struct PadDims {  // innermost dim first
  int rank;
  int64_t y_extent[kMaxDims];
  int64_t x_extent[kMaxDims];
  int64_t x_stride[kMaxDims];
  int64_t before[kMaxDims];
};

// Source index along one dim of length `len` for padded position `o`, `before` elements
// having been added in front; -1 for a constant-padded position.
__device__ __forceinline__ int64_t pad_source(PadMode mode, int64_t o, int64_t before,
                                              int64_t len) {
  int64_t i = o - before;
  if (i >= 0 && i < len) return i;
  if (mode == PadMode::constant) return -1;
  if (mode == PadMode::edge) return i < 0 ? 0 : len - 1;
  if (len == 1) return 0;  // reflect: mirror without repeating the edge, period 2 (len - 1)
  const int64_t period = 2 * (len - 1);
  i %= period;
  if (i < 0) i += period;
  return i < len ? i : period - i;
}

template <class E, class Index>
__global__ void pad_kernel(const E* x, E* y, PadDims dims, Index n, PadMode mode, E value) {
  for (Index i = Index(global_thread_index()); i < n; i += Index(grid_stride())) {
    Index rem = i;
    int64_t src = 0;
    bool inside = true;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == dims.rank) break;
      const Index extent = Index(dims.y_extent[d]);
      const int64_t s = pad_source(mode, int64_t(rem % extent), dims.before[d], dims.x_extent[d]);
      rem /= extent;
      inside = inside && s >= 0;
      src += s * dims.x_stride[d];
    }
    y[i] = inside ? x[src] : value;
  }
}

}  // namespace

void pad(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<PadAttrs>(n.attrs);
  const DeviceTensor& x = *in[0];
  const DeviceTensor& y = out[0];
  const size_t rank = size_t(x.rank());
  FUSEBOX_CHECK(a.pads.size() == 2 * rank, node_label(n), "pads has ", a.pads.size(),
                " entries for rank ", rank);
  FUSEBOX_CHECK(x.is_contiguous() && y.rank() == x.rank(), node_label(n),
                "expects a contiguous input and an output of its rank");
  if (y.numel() == 0) return;
  if (rank == 0) {
    ctx.encoder.memcpy(y.range(), x.range());
    return;
  }
  FUSEBOX_CHECK(rank <= size_t(kMaxDims), node_label(n), "pads a rank-", rank,
                " tensor; the CUDA kernel handles at most ", kMaxDims, " dims");
  PadDims dims{};
  dims.rank = int(rank);
  for (size_t d = 0; d < rank; ++d) {
    FUSEBOX_CHECK(a.mode == PadMode::constant || x.shape[d] > 0, node_label(n),
                  "cannot reflect or extend an empty dim ", d);
    FUSEBOX_CHECK(y.shape[d] == x.shape[d] + a.pads[d] + a.pads[d + rank], node_label(n),
                  "output dim ", d, " is ", y.shape[d], ", not ", x.shape[d], " + ", a.pads[d],
                  " + ", a.pads[d + rank]);
    const size_t inner = rank - 1 - d;
    dims.y_extent[inner] = y.shape[d];
    dims.x_extent[inner] = x.shape[d];
    dims.x_stride[inner] = x.strides[d];
    dims.before[inner] = a.pads[d];
  }
  const Tensor fill = Tensor::scalar(x.dtype, a.value);  // the value in x's dtype
  visit_bytes(dtype_size(x.dtype), [&](auto tag) {
    using E = decltype(tag);
    E value;
    std::memcpy(&value, fill.raw(), sizeof(E));
    const int64_t count = y.numel();
    const BufferList reads{x.range()}, writes{y.range()};
    if (fits_u32(count))
      ctx.encoder.launch(pad_kernel<E, uint32_t>, launch_blocks(count), kDefaultThreads, 0, reads,
                         writes, x.as<E>(), y.as<E>(), dims, uint32_t(count), a.mode, value);
    else
      ctx.encoder.launch(pad_kernel<E, uint64_t>, launch_blocks(count), kDefaultThreads, 0, reads,
                         writes, x.as<E>(), y.as<E>(), dims, uint64_t(count), a.mode, value);
  });
}

}  // namespace fusebox::cuda
