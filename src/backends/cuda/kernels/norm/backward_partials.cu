// layer_norm / rms_norm backward: the final sum of every path's partial rows of column
// sums (kernels/norm/backward_impl.cuh: finish_partials).
//
// out[w][j] = sum over p < parts of partial[w][p * cols + j], w = blockIdx.y (dscale and
// dbias in one launch). Algorithm, per block of (32, S) threads over 32 * V columns:
//   1. thread (x, y) owns V consecutive columns (V = 4: one 16-byte load per partial row)
//      and adds rows p = y, y + S, y + 2S, ... in that order, kLoadsInFlight loads issued
//      before the first is added (the loads, not the adds, are what this kernel waits on:
//      the earlier one-value, four-in-flight form ran at 1.4 TB/s from L2);
//   2. the S slice sums meet in shared memory and are added in slice order.
// So the result depends on parts and S only, never on timing: the same every run.
// S is chosen on the host so that one wave of threads covers the work (kernels/norm/rows.cuh's
// persistent grids leave 100-400 partial rows of up to 16,384 columns).
//
// discard (f32 partials, cols % 32 == 0, 128-byte aligned rows): every 128-byte line of
// partials is dropped from L2 once read (discard.global.L2), so that its dirty data is
// never written back to DRAM: they are temporaries that nothing reads again.
#include <algorithm>

#include "backends/cuda/kernels/norm/backward_impl.cuh"
#include "backends/cuda/kernels/norm/common.h"

namespace fusebox::cuda::norm {

namespace {

constexpr int kMaxSlices = 32;
constexpr int kLoadsInFlight = 8;

template <class A, class O>
struct PartialSums {
  const A* partial[2];
  O* out[2];
  int64_t parts;
  int64_t cols;
  bool discard;
};

// V values of type A as one load (16 bytes for f32 x 4).
template <class A, int V>
struct alignas(sizeof(A) * V) Values {
  A v[V];
};
template <class A, int V>
__device__ __forceinline__ Values<A, V> load_values(const A* p) {
  if constexpr (std::is_same_v<A, float> && V == 4) {
    const float4 f = __ldcg(reinterpret_cast<const float4*>(p));
    return {{f.x, f.y, f.z, f.w}};
  } else {
    static_assert(V == 1, "vectors of f32 x 4 only");
    return {{__ldcg(p)}};
  }
}

template <class A, class O, int V>
__global__ void sum_partial_rows(PartialSums<A, O> s) {
  constexpr int kCols = 32 * V;  // columns per block
  __shared__ A slice_sums[kMaxSlices][kCols + 1];
  const A* partial = s.partial[blockIdx.y];
  if (partial == nullptr) return;  // uniform over the block
  const int slices = int(blockDim.y);
  const int64_t cols = s.cols, parts = s.parts;
  const int64_t c0 = int64_t(blockIdx.x) * kCols;
  const int64_t j = c0 + int64_t(threadIdx.x) * V;  // this thread's first column
  A sum[V] = {};
  if (j < cols) {  // cols % V == 0 (the host checks): all V columns or none
    const A* column = partial + j;
    int64_t p = threadIdx.y;
    for (; p + (kLoadsInFlight - 1) * slices < parts; p += kLoadsInFlight * slices) {
      Values<A, V> v[kLoadsInFlight];
#pragma unroll
      for (int l = 0; l < kLoadsInFlight; ++l)
        v[l] = load_values<A, V>(column + (p + int64_t(l) * slices) * cols);
#pragma unroll
      for (int l = 0; l < kLoadsInFlight; ++l)
#pragma unroll
        for (int c = 0; c < V; ++c) sum[c] += v[l].v[c];
    }
    for (; p < parts; p += slices) {
      const Values<A, V> v = load_values<A, V>(column + p * cols);
#pragma unroll
      for (int c = 0; c < V; ++c) sum[c] += v.v[c];
    }
  }
#pragma unroll
  for (int c = 0; c < V; ++c) slice_sums[threadIdx.y][threadIdx.x * V + c] = sum[c];
  if constexpr (sizeof(A) == 4) {
    if (s.discard) {
      // The warp's rows (p = y, y + S, ...) times the block's lines per row: lane l drops
      // lines l, l + 32, ..., each after every lane has read it (its values are summed).
      __syncwarp();
      const int64_t width = cols - c0 < kCols ? cols - c0 : int64_t(kCols);
      const int64_t lines = width * int64_t(sizeof(A)) / 128;
      const int64_t rows = parts > threadIdx.y ? (parts - threadIdx.y + slices - 1) / slices : 0;
      for (int64_t q = threadIdx.x; q < rows * lines; q += 32) {
        const int64_t p = threadIdx.y + (q / lines) * slices;
        const A* line = partial + p * cols + c0 + (q % lines) * (128 / int64_t(sizeof(A)));
        asm volatile("discard.global.L2 [%0], 128;" ::"l"(line) : "memory");
      }
    }
  }
  __syncthreads();
  // Thread t < kCols adds column c0 + t over the slices, in slice order.
  const int t = int(threadIdx.y) * 32 + int(threadIdx.x);
  if (t < kCols && c0 + t < cols) {
    A total = 0;
    for (int y = 0; y < slices; ++y) total += slice_sums[y][t];
    s.out[blockIdx.y][c0 + t] = convert<O>(total);
  }
}

}  // namespace

// One launch when dscale and dbias have the same dtype (else one each). The variant's
// discard_partials drops the f32 partials from L2 once read.
template <class A>
void finish_partials(Context& ctx, const PartialRows& p, int64_t cols, DeviceTensor* dscale,
                     DeviceTensor* dbias) {
  const int64_t parts = p.parts;
  const DeviceProperties& props = ctx.device.properties();
  auto sum = [&](DeviceTensor* out0, const BufferRange* part0, DeviceTensor* out1,
                 const BufferRange* part1) {
    auto rows_of = [](const BufferRange* part) { return static_cast<const A*>(part->data()); };
    // Whole 128-byte lines per 32 columns of every partial row.
    bool discard = norm_variant().discard_partials && std::is_same_v<A, float> && cols % 32 == 0;
    // 16-byte loads where every row starts 16-byte aligned.
    bool vectors = std::is_same_v<A, float> && cols % 4 == 0;
    for (const BufferRange* part : {part0, part1}) {
      if (!part) continue;
      discard = discard && is_aligned(rows_of(part), 128);
      vectors = vectors && is_aligned(rows_of(part), 16);
    }
    BufferList partials, outs;
    for (const BufferRange* part : {part0, part1})
      if (part) partials.push_back(*part);
    for (DeviceTensor* out : {out0, out1})
      if (out) outs.push_back(out->range());
    // Discarding makes the partials' contents undefined: a write as far as ordering goes.
    if (discard) outs.insert(outs.end(), partials.begin(), partials.end());
    const int V = vectors ? 4 : 1;
    const unsigned column_blocks = unsigned((cols + 32 * V - 1) / (32 * V));
    const unsigned outputs = out1 ? 2u : 1u;
    // The fewest slices (4 to 32) that give one thread per resident thread slot of the
    // device, and no more than the rows need.
    const int64_t wanted = int64_t(props.sm_count) * props.max_threads_per_sm;
    int slices = 4;
    while (slices < kMaxSlices && int64_t(column_blocks) * outputs * slices * 32 < wanted &&
           slices < parts)
      slices *= 2;
    visit_device_dtype((out0 ? out0 : out1)->dtype, [&](auto tag) {
      using O = decltype(tag);
      if constexpr (is_float_v<O>) {
        PartialSums<A, O> s{{part0 ? rows_of(part0) : nullptr, part1 ? rows_of(part1) : nullptr},
                            {out0 ? out0->as<O>() : nullptr, out1 ? out1->as<O>() : nullptr},
                            parts,
                            cols,
                            discard};
        const dim3 grid(column_blocks, outputs), block(32, unsigned(slices));
        if constexpr (std::is_same_v<A, float>) {
          if (vectors) {
            ctx.encoder.launch(&sum_partial_rows<A, O, 4>, grid, block, 0, partials, outs, s);
            return;
          }
        }
        ctx.encoder.launch(&sum_partial_rows<A, O, 1>, grid, block, 0, partials, outs, s);
      }
    });
  };
  // A wanted gradient has its partial rows (make_partial_rows).
  const BufferRange* scale = p.scale ? &*p.scale : nullptr;
  const BufferRange* bias = p.bias ? &*p.bias : nullptr;
  FUSEBOX_CHECK((!dscale || scale) && (!dbias || bias), "norm backward",
                "a wanted parameter gradient has no partial rows");
  if (dscale && dbias && dscale->dtype == dbias->dtype) {
    sum(dscale, scale, dbias, bias);
    return;
  }
  if (dscale) sum(dscale, scale, nullptr, nullptr);
  if (dbias) sum(dbias, bias, nullptr, nullptr);
}

template void finish_partials<float>(Context&, const PartialRows&, int64_t, DeviceTensor*,
                                     DeviceTensor*);
template void finish_partials<double>(Context&, const PartialRows&, int64_t, DeviceTensor*,
                                      DeviceTensor*);

}  // namespace fusebox::cuda::norm
