// top_k on the GPU, the CPU backend's rule (cpu/reduce.cpp top_k): each row of x (contiguous,
// viewed as [outer, len, inner] around the axis) ordered by a stable sort, NaN above every
// number, ties keeping the lower index first; the first k give the values and indices.
//
//   1. keys: each element mapped to an unsigned integer whose order is the elements' order
//      (floats: the sign-magnitude flip, -0 merged with +0, every NaN the largest key;
//      integers: the sign bit flipped), stored row-major [rows, len] with its position j;
//   2. CUB's radix sort of (key, j) per row, descending for largest: one onesweep sort for a
//      single row, else the segmented sort (a block per row). Not DeviceSegmentedSort: it
//      reads its segment partition back to the host, which a CUDA-graph capture refuses;
//   3. the first k positions of each sorted row pick the values from x and the indices.
// Radix sorts are stable: equal keys stay in position order, which is the tie rule in both
// directions. Sorting whole rows costs O(len) per element whatever k is: fine for the
// top-5-of-1000 and top-1000-of-100k problems exporters produce.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"

namespace fusebox::cuda {

namespace {

// The order-preserving key of one element, and its key type.
template <class T>
struct SortKey {
  using type = uint32_t;  // f32, f16, bf16 (through f32)
  __device__ static uint32_t of(T v) {
    float f = convert<float>(v);
    if (f != f) return 0xffffffffu;  // NaN above +inf
    if (f == 0.f) f = 0.f;           // -0 sorts with +0 (they compare equal)
    const uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
  }
};
template <>
struct SortKey<double> {
  using type = uint64_t;
  __device__ static uint64_t of(double d) {
    if (d != d) return ~uint64_t(0);
    if (d == 0.0) d = 0.0;
    const uint64_t b = uint64_t(__double_as_longlong(d));
    return (b >> 63) ? ~b : b | (uint64_t(1) << 63);
  }
};
template <>
struct SortKey<int32_t> {
  using type = uint32_t;
  __device__ static uint32_t of(int32_t v) { return uint32_t(v) ^ 0x80000000u; }
};
template <>
struct SortKey<int64_t> {
  using type = uint64_t;
  __device__ static uint64_t of(int64_t v) { return uint64_t(v) ^ (uint64_t(1) << 63); }
};

struct Rows {
  int64_t rows, len, inner, k;
  // x's offset of element j of row r (and the outputs', with k for len).
  __device__ int64_t at(int64_t r, int64_t j, int64_t extent) const {
    return (r / inner) * extent * inner + r % inner + j * inner;
  }
};

template <class T, class K>
__global__ void make_keys(const T* x, Rows g, K* keys, int32_t* positions, int32_t* offsets) {
  const int64_t n = g.rows * g.len;
  for (int64_t i = global_thread_index(); i < n; i += grid_stride()) {
    const int64_t r = i / g.len, j = i % g.len;
    keys[i] = SortKey<T>::of(x[g.at(r, j, g.len)]);
    positions[i] = int32_t(j);
  }
  for (int64_t r = global_thread_index(); r <= g.rows; r += grid_stride())
    offsets[r] = int32_t(r * g.len);
}

template <class T>
__global__ void pick_first_k(const T* x, const int32_t* sorted, Rows g, T* values,
                             int64_t* indices) {
  const int64_t n = g.rows * g.k;
  for (int64_t i = global_thread_index(); i < n; i += grid_stride()) {
    const int64_t r = i / g.k, t = i % g.k;
    const int64_t j = sorted[r * g.len + t];
    const int64_t to = g.at(r, t, g.k);
    values[to] = x[g.at(r, j, g.len)];
    indices[to] = j;
  }
}

}  // namespace

void top_k(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<TopKAttrs>(n.attrs);
  const DeviceTensor& x = *in[0];
  const DeviceTensor &values = out[0], &indices = out[1];
  FUSEBOX_CHECK(x.is_contiguous() && values.is_contiguous() && indices.is_contiguous() &&
                    indices.dtype == DType::i64,
                node_label(n), "expects contiguous operands and i64 indices");
  if (values.numel() == 0) return;
  Rows g{1, x.shape[size_t(a.axis)], 1, a.k};
  for (int64_t d = 0; d < a.axis; ++d) g.rows *= x.shape[size_t(d)];
  for (int64_t d = a.axis + 1; d < x.rank(); ++d) g.inner *= x.shape[size_t(d)];
  g.rows *= g.inner;
  const int64_t count = g.rows * g.len;
  FUSEBOX_CHECK(count <= int64_t(INT32_MAX), node_label(n), "sorts ", count,
                " elements, more than CUB's segmented sort takes (2^31 - 1)");
  visit_device_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      throw Error(node_label(n), "is not defined for bool tensors");
    } else {
      using K = typename SortKey<T>::type;
      const BufferRange keys = ctx.encoder.temporary(ctx.allocator, size_t(count) * sizeof(K));
      const BufferRange sorted_keys =
          ctx.encoder.temporary(ctx.allocator, size_t(count) * sizeof(K));
      const BufferRange positions = ctx.encoder.temporary(ctx.allocator, size_t(count) * 4);
      const BufferRange sorted = ctx.encoder.temporary(ctx.allocator, size_t(count) * 4);
      const BufferRange offsets = ctx.encoder.temporary(ctx.allocator, size_t(g.rows + 1) * 4);
      auto* k_in = static_cast<K*>(keys.data());
      auto* k_out = static_cast<K*>(sorted_keys.data());
      auto* p_in = static_cast<int32_t*>(positions.data());
      auto* p_out = static_cast<int32_t*>(sorted.data());
      auto* off = static_cast<int32_t*>(offsets.data());
      ctx.encoder.launch(&make_keys<T, K>, dim3(launch_blocks(count)), dim3(kDefaultThreads), 0,
                         {x.range()}, {keys, positions, offsets}, x.as<const T>(), g, k_in, p_in,
                         off);
      // The sort: CUB sizes its temporary storage on the host (no launch), then runs on the
      // stream it is given (recorded by capture).
      auto sort = [&](void* storage, size_t& bytes, cudaStream_t s) {
        const int n = int(count), rows = int(g.rows), bits = int(sizeof(K) * 8);
        if (g.rows == 1)
          return a.largest ? cub::DeviceRadixSort::SortPairsDescending(storage, bytes, k_in, k_out,
                                                                       p_in, p_out, n, 0, bits, s)
                           : cub::DeviceRadixSort::SortPairs(storage, bytes, k_in, k_out, p_in,
                                                             p_out, n, 0, bits, s);
        return a.largest ? cub::DeviceSegmentedRadixSort::SortPairsDescending(
                               storage, bytes, k_in, k_out, p_in, p_out, n, rows, off, off + 1, 0,
                               bits, s)
                         : cub::DeviceSegmentedRadixSort::SortPairs(storage, bytes, k_in, k_out,
                                                                    p_in, p_out, n, rows, off,
                                                                    off + 1, 0, bits, s);
      };
      size_t storage_bytes = 0;
      FUSEBOX_CUDA_CHECK(sort(nullptr, storage_bytes, nullptr));
      const BufferRange storage =
          ctx.encoder.scratch(ctx.allocator, std::max<size_t>(storage_bytes, 1));
      ctx.encoder.capture_library_call({keys, positions, offsets}, {sorted_keys, sorted, storage},
                                       [&](cudaStream_t s) {
                                         size_t bytes = storage_bytes;
                                         FUSEBOX_CUDA_CHECK(sort(storage.data(), bytes, s));
                                       });
      ctx.encoder.launch(&pick_first_k<T>, dim3(launch_blocks(g.rows * g.k)), dim3(kDefaultThreads),
                         0, {x.range(), sorted}, {values.range(), indices.range()}, x.as<const T>(),
                         static_cast<const int32_t*>(p_out), g, values.as<T>(),
                         indices.as<int64_t>());
    }
  });
}

}  // namespace fusebox::cuda
