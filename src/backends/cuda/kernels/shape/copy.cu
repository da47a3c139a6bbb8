// Data movement on the GPU: copy_strided (the one strided copy), and the ops that are a
// copy between views: reshape/flatten/squeeze/unsqueeze (copy_reshape), transpose, concat
// and slice. They only move elements, so they work on raw element bytes (visit_bytes)
// whatever the dtype.
//
// copy_strided(src, dst) copies between two views of one shape with any strides (dst is
// usually contiguous; concat writes slabs of its output). It walks dst's memory order;
// after merging dims it picks:
//   memcpy      both walk their bytes in order: a memcpy node
//   tiled       the two views' innermost dims differ (a transpose): 32x32 tiles staged
//               through shared memory, so that both the reads and the writes are coalesced
//   words       the innermost dim is contiguous in both (a permutation that keeps the last
//               dim: attention's head split and merge): the N-d walk moving 16-, 8- or
//               4-byte words, where the extent, strides and addresses allow
//   elementwise anything else: launch_map1's flat or N-d strided walk
#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "backends/cuda/kernels/common/elementwise.cuh"
#include "backends/cuda/runtime/error_flags.h"

namespace fusebox::cuda {

namespace {

template <class E>
struct Move {
  __device__ __forceinline__ E operator()(E v) const { return v; }
};

// ---- tiled transpose -------------------------------------------------------------------
// The walk has a dim q where dst is contiguous (dst stride 1) and a different dim p where
// src is contiguous; every other dim is a batch dim (walked by `batch`). Each block moves a
// 32 (p) x 32 (q) tile of one batch element: the block's 32x8 threads read the tile with
// threadIdx.x along p (coalesced in src), stage it in shared memory, then write it with
// threadIdx.x along q (coalesced in dst). The +1 column of padding keeps the transposed
// shared-memory reads free of bank conflicts (for 4-byte elements).
constexpr int kTile = 32;
constexpr int kTileRows = 8;

struct TileWalk {
  int64_t extent_p, extent_q;
  int64_t src_stride_q;  // src's stride along q (its stride along p is 1)
  int64_t dst_stride_p;  // dst's stride along p (its stride along q is 1)
  int64_t batches;
};

template <class E>
__global__ void transpose_tiles(const E* src, E* dst, TileWalk walk, StridedLayout<2> batch) {
  __shared__ E tile[kTile][kTile + 1];
  const int64_t p0 = int64_t(blockIdx.y) * kTile, q0 = int64_t(blockIdx.x) * kTile;
  for (int64_t z = blockIdx.z; z < walk.batches; z += gridDim.z) {
    int64_t off[2];  // dst, src
    batch.offsets(uint64_t(z), off);
    const int64_t p_read = p0 + threadIdx.x;
#pragma unroll
    for (int k = 0; k < kTile; k += kTileRows) {
      const int64_t q = q0 + threadIdx.y + k;
      if (p_read < walk.extent_p && q < walk.extent_q)
        tile[threadIdx.y + k][threadIdx.x] = src[off[1] + p_read + q * walk.src_stride_q];
    }
    __syncthreads();
    const int64_t q_write = q0 + threadIdx.x;
#pragma unroll
    for (int k = 0; k < kTile; k += kTileRows) {
      const int64_t p = p0 + threadIdx.y + k;
      if (p < walk.extent_p && q_write < walk.extent_q)
        dst[off[0] + q_write + p * walk.dst_stride_p] = tile[threadIdx.x][threadIdx.y + k];
    }
    __syncthreads();  // the next batch element overwrites the tile
  }
}

// Launches transpose_tiles when the merged walk has that shape (and tiles pay: both tiled
// dims at least 8 long); returns false otherwise.
template <class E>
bool try_tiled(Context& ctx, const Where& where, const StridedLayout<2>& layout, const E* src,
               E* dst, const BufferList& reads, const BufferList& writes) {
  if (layout.rank < 2 || layout.stride[0][0] != 1 || layout.stride[1][0] == 1) return false;
  int p = -1;
  for (int d = 1; d < layout.rank; ++d)
    if (layout.stride[1][d] == 1) p = d;
  if (p < 0 || layout.extent[0] < 8 || layout.extent[p] < 8) return false;

  TileWalk walk{layout.extent[p], layout.extent[0], layout.stride[1][0], layout.stride[0][p], 1};
  Shape batch_shape, dst_strides, src_strides;  // outermost first
  for (int d = layout.rank - 1; d >= 1; --d) {
    if (d == p) continue;
    batch_shape.push_back(layout.extent[d]);
    dst_strides.push_back(layout.stride[0][d]);
    src_strides.push_back(layout.stride[1][d]);
    walk.batches *= layout.extent[d];
  }
  const StridedLayout<2> batch = make_layout<2>(where, batch_shape, {dst_strides, src_strides});
  const dim3 grid(unsigned((walk.extent_q + kTile - 1) / kTile),
                  unsigned((walk.extent_p + kTile - 1) / kTile),
                  unsigned(std::min<int64_t>(walk.batches, 65535)));
  if (grid.y > 65535) return false;  // p longer than 2M elements: the elementwise path
  ctx.encoder.launch(transpose_tiles<E>, grid, dim3(kTile, kTileRows), 0, reads, writes, src, dst,
                     walk, batch);
  return true;
}

// ---- words ---------------------------------------------------------------------------
// A 2-byte element per thread through the N-d walk moved under 400 GB/s on the H100 (the
// walk's index arithmetic per element); whole words cut the threads and the arithmetic
// by the word's width.
template <class Word>
bool try_words(Context& ctx, const StridedLayout<2>& layout, size_t element_bytes, void* dst,
               const void* src, const BufferList& reads, const BufferList& writes) {
  const int64_t ratio = int64_t(sizeof(Word) / element_bytes);
  if (ratio <= 1 || layout.stride[0][0] != 1 || layout.stride[1][0] != 1 ||
      layout.extent[0] % ratio != 0 || !is_aligned(dst, sizeof(Word)) ||
      !is_aligned(src, sizeof(Word)))
    return false;
  for (int d = 1; d < layout.rank; ++d)
    if (layout.stride[0][d] % ratio != 0 || layout.stride[1][d] % ratio != 0) return false;
  StridedLayout<2> words = layout;
  words.extent[0] /= ratio;
  for (int d = 1; d < layout.rank; ++d)
    for (int k = 0; k < 2; ++k) words.stride[k][d] /= ratio;
  const int64_t n = words.numel();
  const auto* from = static_cast<const Word*>(src);
  auto* to = static_cast<Word*>(dst);
  if (fits_u32(n))
    ctx.encoder.launch(map1_strided<Word, Word, Move<Word>, uint32_t>, launch_blocks(n),
                       kDefaultThreads, 0, reads, writes, from, to, words, uint32_t(n),
                       Move<Word>{});
  else
    ctx.encoder.launch(map1_strided<Word, Word, Move<Word>, uint64_t>, launch_blocks(n),
                       kDefaultThreads, 0, reads, writes, from, to, words, uint64_t(n),
                       Move<Word>{});
  return true;
}

void copy_views(Context& ctx, const Where& where, const DeviceTensor& src,
                const DeviceTensor& dst) {
  FUSEBOX_CHECK(src.shape == dst.shape && src.dtype == dst.dtype, where.str(), "cannot copy ",
                dtype_name(src.dtype), shape_str(src.shape), " into ", dtype_name(dst.dtype),
                shape_str(dst.shape));
  FUSEBOX_CHECK(src.strides.size() == src.shape.size() && dst.strides.size() == dst.shape.size(),
                where.str(), "a view's strides do not match its rank");
  if (dst.numel() == 0) return;
  // A copy may visit its elements in any order: walk them in dst's memory order (dims by
  // dst's stride, largest first), so that neighbouring threads write neighbouring elements
  // whatever dst's order. In the logical order the innermost dim of a channels-last slab
  // (a concat's input, written into its channels of a channels-last output) is W, strided
  // by the output's channels: every 2-byte write its own sector (UNet's 1 GiB concat ran
  // at 65 GB/s so, 2026-11-29).
  const size_t rank = dst.shape.size();
  std::vector<size_t> order(rank);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::abs(dst.strides[a]) > std::abs(dst.strides[b]);
  });
  Shape shape(rank), dst_strides(rank), src_strides(rank);
  for (size_t i = 0; i < rank; ++i) {
    shape[i] = dst.shape[order[i]];
    dst_strides[i] = dst.strides[order[i]];
    src_strides[i] = src.strides[order[i]];
  }
  const StridedLayout<2> layout = make_layout<2>(where, shape, {dst_strides, src_strides});
  if (layout.rank == 1 && layout.inner_stride(0) == 1 && layout.inner_stride(1) == 1) {
    ctx.encoder.memcpy(dst.range(), src.range());
    return;
  }
  visit_bytes(dtype_size(src.dtype), [&](auto tag) {
    using E = decltype(tag);
    const BufferList reads{src.range()}, writes{dst.range()};
    if (try_tiled(ctx, where, layout, src.as<E>(), dst.as<E>(), reads, writes)) return;
    const size_t bytes = sizeof(E);
    if (try_words<uint4>(ctx, layout, bytes, dst.as<E>(), src.as<E>(), reads, writes) ||
        try_words<uint2>(ctx, layout, bytes, dst.as<E>(), src.as<E>(), reads, writes) ||
        try_words<uint32_t>(ctx, layout, bytes, dst.as<E>(), src.as<E>(), reads, writes))
      return;
    launch_map1<E, E>(ctx, where, src, dst, Move<E>{});
  });
}

}  // namespace

void copy_strided(Context& ctx, const DeviceTensor& src, const DeviceTensor& dst) {
  copy_views(ctx, "copy_strided", src, dst);
}

namespace {

// dst = src (bytes, as 16-byte words where both allow, else single bytes) unless *halt.
template <class W>
__global__ void copy_unless_halted_kernel(const W* src, W* dst, int64_t count,
                                          const int32_t* halt) {
  if (halted(halt)) return;
  for (int64_t i = global_thread_index(); i < count; i += grid_stride()) dst[i] = src[i];
}

}  // namespace

void copy_unless_halted(Context& ctx, const DeviceTensor& src, const DeviceTensor& dst,
                        const BufferRange& halt) {
  FUSEBOX_CHECK(src.dtype == dst.dtype && src.shape == dst.shape && src.strides == dst.strides &&
                    (src.is_contiguous() || src.is_channels_last()),
                "copy_unless_halted", "expects two dense tensors of one type and order");
  const size_t bytes = src.nbytes();
  if (bytes == 0) return;
  const auto* halt_word = static_cast<const int32_t*>(halt.data());
  const BufferList reads{src.range(), halt}, writes{dst.range()};
  const bool wide = bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src.data()) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(dst.data()) % 16 == 0;
  if (wide) {
    const int64_t count = int64_t(bytes / 16);
    ctx.encoder.launch(&copy_unless_halted_kernel<uint4>, dim3(launch_blocks(count)),
                       dim3(kDefaultThreads), 0, reads, writes, src.as<const uint4>(),
                       dst.as<uint4>(), count, halt_word);
  } else {
    const int64_t count = int64_t(bytes);
    ctx.encoder.launch(&copy_unless_halted_kernel<uint8_t>, dim3(launch_blocks(count)),
                       dim3(kDefaultThreads), 0, reads, writes, src.as<const uint8_t>(),
                       dst.as<uint8_t>(), count, halt_word);
  }
}

// reshape, flatten, squeeze, unsqueeze: the same row-major bytes under another shape;
// nothing to do where the output is planned as a view of the input. A strided input (a view)
// is copied once, into y's bytes read under x's shape (y is contiguous: the same order).
void copy_reshape(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const DeviceTensor& x = *in[0];
  const DeviceTensor& y = out[0];
  FUSEBOX_CHECK(x.nbytes() == y.nbytes(), node_label(n), "cannot view ", shape_str(x.shape), " as ",
                shape_str(y.shape));
  FUSEBOX_CHECK(y.is_contiguous(), node_label(n), "expects a contiguous output");
  if (y.nbytes() == 0) return;
  if (!x.is_contiguous()) {
    copy_views(ctx, n, x, y.view(y.offset, x.shape, contiguous_strides(x.shape)));
    return;
  }
  if (x.data() == y.data()) return;  // a view (the executable's plan)
  ctx.encoder.memcpy(y.range(), x.range());
}

// y = x viewed with permuted strides: y's dim i walks x's dim perm[i]; nothing to do where
// the executable planned y as that very view (x's bytes in y's order: passes/layout.h).
void transpose(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& perm = std::get<TransposeAttrs>(n.attrs).perm;
  const DeviceTensor& x = *in[0];
  FUSEBOX_CHECK(int64_t(perm.size()) == x.rank(), node_label(n), "perm has ", perm.size(),
                " entries for rank ", x.rank());
  Shape shape(perm.size()), strides(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    shape[i] = x.shape[size_t(perm[i])];
    strides[i] = x.strides[size_t(perm[i])];
  }
  const DeviceTensor& y = out[0];
  bool view = x.data() == y.data();
  for (size_t i = 0; i < shape.size() && view; ++i)
    view = shape[i] == 1 || strides[i] == y.strides[i];
  if (view) return;
  copy_views(ctx, n, x.view(x.offset, std::move(shape), std::move(strides)), y);
}

// Each input is copied into its slab of y: y's strides, offset along `axis`. The slabs are
// disjoint, so the copies carry no hazard between them and may run concurrently.
void concat(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const int64_t axis = std::get<ConcatAttrs>(n.attrs).axis;
  const DeviceTensor& y = out[0];
  int64_t at = 0;
  for (const DeviceTensor* x : in) {
    FUSEBOX_CHECK(x->rank() == y.rank(), node_label(n), "input ", shape_str(x->shape),
                  " has another rank than the output ", shape_str(y.shape));
    if (x->numel() > 0)
      copy_views(ctx, n, *x, y.view(y.offset + at * y.strides[size_t(axis)], x->shape, y.strides));
    at += x->shape[size_t(axis)];
  }
  FUSEBOX_CHECK(at == y.shape[size_t(axis)], node_label(n), "inputs cover ", at, " of ",
                y.shape[size_t(axis)], " along axis ", axis);
}

// Attributes are normalised: per listed axis an absolute start in range and a step (maybe
// negative); y's shape holds each dim's count. Element c of y is x at start + c * step
// along every sliced dim: a view with offset and scaled strides.
void slice(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<SliceAttrs>(n.attrs);
  const DeviceTensor& x = *in[0];
  const DeviceTensor& y = out[0];
  if (y.numel() == 0) return;  // a start may then equal its extent: no offset to take
  Shape strides = x.strides;
  int64_t offset = x.offset;
  for (size_t i = 0; i < a.axes.size(); ++i) {
    const size_t d = size_t(a.axes[i]);
    offset += a.starts[i] * x.strides[d];
    strides[d] *= a.steps[i];
  }
  copy_views(ctx, n, x.view(offset, y.shape, std::move(strides)), y);
}

}  // namespace fusebox::cuda
