// Comparisons, logic ops and where on the GPU, the CPU backend's semantics
// (backends/cpu/logic.cpp): numpy broadcasting, operands of any strides, y contiguous.
//   comparisons  in the compute type (f16 / bf16 widened to f32 exactly; integers exactly),
//                a NaN compares false; -> bool
//   logic        not / and / or / xor of bools -> bool
//   where        condition ? a : b, moving a's elements as words (any dtype)
// Comparisons and logic are launch_map1 / launch_map2 maps (kernels/common/elementwise.cuh);
// where has three operands, so its own strided walk over the four.
#include "backends/cuda/kernels/common/elementwise.cuh"

namespace fusebox::cuda {

namespace {

template <class T, OpKind K>
struct Compare {
  __device__ __forceinline__ bool operator()(T a, T b) const {
    using C = compute_t<T>;
    const C u = convert<C>(a), v = convert<C>(b);
    if constexpr (K == OpKind::equal) return u == v;
    if constexpr (K == OpKind::less) return u < v;
    if constexpr (K == OpKind::greater) return u > v;
    if constexpr (K == OpKind::less_equal) return u <= v;
    if constexpr (K == OpKind::greater_equal) return u >= v;
  }
};

template <OpKind K>
struct Logic {
  __device__ __forceinline__ bool operator()(bool a, bool b) const {
    if constexpr (K == OpKind::logical_and) return a && b;
    if constexpr (K == OpKind::logical_or) return a || b;
    if constexpr (K == OpKind::logical_xor) return a != b;
  }
};

struct Not {
  __device__ __forceinline__ bool operator()(bool a) const { return !a; }
};

template <class W, class Index>
__global__ void where_strided(const bool* cond, const W* a, const W* b, W* y,
                              StridedLayout<4> layout, Index n) {
  for (Index i = Index(global_thread_index()); i < n; i += Index(grid_stride())) {
    int64_t off[4];
    layout.offsets(i, off);
    y[off[0]] = cond[off[1]] ? a[off[2]] : b[off[3]];
  }
}

}  // namespace

void logic(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const DeviceTensor& y = out[0];
  FUSEBOX_CHECK(y.dtype == DType::boolean && y.is_contiguous(), node_label(n),
                "expects a contiguous bool output");
  if (n.op == OpKind::logical_not) return launch_map1<bool, bool>(ctx, n, *in[0], y, Not{});
  const DeviceTensor& a = *in[0];
  const DeviceTensor& b = *in[1];
  auto compare = [&]<OpKind K>() {
    visit_device_dtype(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      launch_map2<T, T, bool>(ctx, n, a, b, y, Compare<T, K>{});
    });
  };
  switch (n.op) {
    case OpKind::equal:
      return compare.template operator()<OpKind::equal>();
    case OpKind::less:
      return compare.template operator()<OpKind::less>();
    case OpKind::greater:
      return compare.template operator()<OpKind::greater>();
    case OpKind::less_equal:
      return compare.template operator()<OpKind::less_equal>();
    case OpKind::greater_equal:
      return compare.template operator()<OpKind::greater_equal>();
    case OpKind::logical_and:
      return launch_map2<bool, bool, bool>(ctx, n, a, b, y, Logic<OpKind::logical_and>{});
    case OpKind::logical_or:
      return launch_map2<bool, bool, bool>(ctx, n, a, b, y, Logic<OpKind::logical_or>{});
    case OpKind::logical_xor:
      return launch_map2<bool, bool, bool>(ctx, n, a, b, y, Logic<OpKind::logical_xor>{});
    default:
      throw Error(node_label(n), "is not a comparison or logic op");
  }
}

void where(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const DeviceTensor& cond = *in[0];
  const DeviceTensor& a = *in[1];
  const DeviceTensor& b = *in[2];
  const DeviceTensor& y = out[0];
  FUSEBOX_CHECK(
      y.is_contiguous() && cond.dtype == DType::boolean && a.dtype == y.dtype && b.dtype == y.dtype,
      node_label(n), "expects a bool condition and a, b, y of one dtype");
  const int64_t count = y.numel();
  if (count == 0) return;
  const StridedLayout<4> layout =
      make_layout<4>(n, y.shape,
                     {y.strides, broadcast_strides(cond.shape, cond.strides, y.shape),
                      broadcast_strides(a.shape, a.strides, y.shape),
                      broadcast_strides(b.shape, b.strides, y.shape)});
  auto launch = [&](auto wtag) {
    using W = decltype(wtag);
    const BufferList reads{cond.range(), a.range(), b.range()}, writes{y.range()};
    const dim3 grid(launch_blocks(count)), block(kDefaultThreads);
    if (count <= std::numeric_limits<int32_t>::max())
      ctx.encoder.launch(&where_strided<W, int32_t>, grid, block, 0, reads, writes,
                         cond.as<const bool>(), a.as<const W>(), b.as<const W>(), y.as<W>(), layout,
                         int32_t(count));
    else
      ctx.encoder.launch(&where_strided<W, int64_t>, grid, block, 0, reads, writes,
                         cond.as<const bool>(), a.as<const W>(), b.as<const W>(), y.as<W>(), layout,
                         count);
  };
  visit_bytes(dtype_size(y.dtype), launch);
}

}  // namespace fusebox::cuda
