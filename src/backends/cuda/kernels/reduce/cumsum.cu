// cumsum on the GPU, the CPU backend's rule (cpu/reduce.cpp cumsum): x (contiguous) viewed as
// rows [outer, len, inner] around the axis, each row summed in order (reverse: from the
// end), exclusive leaving the element itself out. Floats sum in f64 and round each output
// once (the CPU's bits), integers modulo 2^64, wrapped into their dtype.
//
// One thread per row, walking it in order: the f64 running sum is the CPU's to the bit, and
// neighbouring threads read neighbouring columns when inner > 1. A long row along the last
// dim (inner == 1) is one thread's serial walk: correct, not fast (the exporters' cumsums
// are position ids over a sequence, a few thousand elements at most).
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"

namespace fusebox::cuda {

namespace {

template <class T>
__global__ void cumsum_rows(const T* x, int64_t rows, int64_t len, int64_t inner, bool exclusive,
                            bool reverse, T* y) {
  using S = std::conditional_t<std::is_integral_v<T>, unsigned long long, double>;
  for (int64_t r = global_thread_index(); r < rows; r += grid_stride()) {
    const int64_t base = (r / inner) * len * inner + r % inner;
    S sum = 0;
    for (int64_t s = 0; s < len; ++s) {
      const int64_t at = base + (reverse ? len - 1 - s : s) * inner;
      S here;
      if constexpr (std::is_integral_v<T>)
        here = S(x[at]);  // sign-extended, modulo 2^64
      else
        here = S(load_compute(x, at));
      if (!exclusive) sum += here;
      if constexpr (std::is_integral_v<T>)
        y[at] = T(static_cast<long long>(sum));
      else
        y[at] = convert<T>(sum);
      if (exclusive) sum += here;
    }
  }
}

}  // namespace

void cumsum(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<CumSumAttrs>(n.attrs);
  const DeviceTensor& x = *in[0];
  const DeviceTensor& y = out[0];
  FUSEBOX_CHECK(x.is_contiguous() && y.is_contiguous(), node_label(n),
                "expects contiguous tensors");
  if (y.numel() == 0) return;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < a.axis; ++d) outer *= x.shape[size_t(d)];
  for (int64_t d = a.axis + 1; d < x.rank(); ++d) inner *= x.shape[size_t(d)];
  const int64_t len = x.shape[size_t(a.axis)], rows = outer * inner;
  visit_device_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      throw Error(node_label(n), "is not defined for bool tensors");
    } else {
      ctx.encoder.launch(&cumsum_rows<T>, dim3(launch_blocks(rows)), dim3(kDefaultThreads), 0,
                         {x.range()}, {y.range()}, x.as<const T>(), rows, len, inner, a.exclusive,
                         a.reverse, y.as<T>());
    }
  });
}

}  // namespace fusebox::cuda
