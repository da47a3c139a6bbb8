// arg_max / arg_min on the GPU, the CPU backend's rule (cpu/reduce.cpp arg_reduce): x
// (contiguous) viewed as rows [outer, len, inner] around the axis; each row's first
// (select_last_index: last) position of its largest / smallest element, a NaN counting as
// both. One thread per row, walking it in order: the index rule needs no reduction tree, and
// neighbouring threads read neighbouring columns when inner > 1. Rows along the last dim
// (inner == 1: logits [B, V]) are read one thread per row: correct, not fast.
#include <limits>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"

namespace fusebox::cuda {

namespace {

template <class C>
__device__ __forceinline__ bool is_nan(C c) {
  if constexpr (std::is_floating_point_v<C>)
    return c != c;
  else
    return false;
}

template <class T>
__global__ void arg_reduce_rows(const T* x, int64_t rows, int64_t len, int64_t inner, bool is_max,
                                bool select_last, int64_t* y) {
  using C = compute_t<T>;
  for (int64_t r = global_thread_index(); r < rows; r += grid_stride()) {
    const T* row = x + (r / inner) * len * inner + r % inner;
    int64_t best = 0;
    C b = load_compute(row, 0);
    for (int64_t j = 1; j < len; ++j) {
      const C c = load_compute(row, j * inner);
      bool take;
      if (is_nan(b))
        take = select_last && is_nan(c);
      else if (is_nan(c))
        take = true;
      else if (c == b)
        take = select_last;
      else
        take = is_max ? c > b : c < b;
      if (take) best = j, b = c;
    }
    y[r] = best;
  }
}

}  // namespace

void arg_reduce(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<ArgReduceAttrs>(n.attrs);
  const DeviceTensor& x = *in[0];
  const DeviceTensor& y = out[0];
  FUSEBOX_CHECK(x.is_contiguous() && y.dtype == DType::i64, node_label(n),
                "expects a contiguous input and an i64 output");
  if (y.numel() == 0) return;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < a.axis; ++d) outer *= x.shape[size_t(d)];
  for (int64_t d = a.axis + 1; d < x.rank(); ++d) inner *= x.shape[size_t(d)];
  const int64_t len = x.shape[size_t(a.axis)];
  const int64_t rows = outer * inner;
  visit_device_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      throw Error(node_label(n), "is not defined for bool tensors");
    } else {
      ctx.encoder.launch(&arg_reduce_rows<T>, dim3(launch_blocks(rows)), dim3(kDefaultThreads), 0,
                         {x.range()}, {y.range()}, x.as<const T>(), rows, len, inner,
                         n.op == OpKind::arg_max, a.select_last_index, y.as<int64_t>());
    }
  });
}

}  // namespace fusebox::cuda
