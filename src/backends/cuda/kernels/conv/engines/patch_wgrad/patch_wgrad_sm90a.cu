// The patch weight gradient's kernel (plan.h says what and why). One CTA: a 64-filter block of
// dy and a run of consecutive output rows (n, oh); two warpgroups, warpgroup 0 owning patch
// columns 0..127, warpgroup 1 columns 128..255 (column = (r * 7 + s) * 4 + c; past 195 zeros:
// one wgmma shape for both keeps the pipeline out of a branch, which ptxas would serialize).
//
// Per output row t of the run, top to bottom:
//   1. Start row t + 1's loads: dy's row by cp.async into its slot (four slots: the other
//      warpgroup's wgmmas of row t - 2 may still read one), x's 7 input rows into registers
//      (plain loads: with 3 channels a pixel is 6 bytes, no 16-byte vector).
//   2. Gather row t's patches from x's rows in shared memory (stored with channels padded to
//      4, from column -pad on, zeros outside the image): patch (ow, r, s) is x row r's 8 bytes
//      at column ow * stride + s, written to column (r * 7 + s) * 4 of pixel ow's row in the
//      128-byte-swizzled MN-major layout. Each warpgroup gathers its own columns (taps 0..31,
//      32..48), so two patch buffers do: its own wgmmas of row t - 2, which read this one,
//      have retired.
//   3. Store row t + 1's x rows into the other x buffer (read by row t - 1's gather, which is
//      behind the last barrier).
//   4. Wait for dy's row t, make the gathered patches visible to wgmma, barrier.
//   5. Warpgroup w issues OW'/16 wgmmas m64 n128 k16 (A = dy's row read transposed, filters x
//      pixels; B = its patch columns), one row's group stays in flight.
// Then each thread writes its accumulators (f32, the channels below C) into the run's slice of
// the partial buffer, dw's layout [K][7][7][C].
#include "backends/cuda/device/wgmma.cuh"
#include "backends/cuda/kernels/conv/engines/patch_wgrad/patch_wgrad.h"
#include "backends/cuda/kernels/conv/split_sum.cuh"
#include "backends/cuda/runtime/check.h"

namespace fusebox::cuda::patch_wgrad {

namespace {

constexpr int kThreads = 256;  // two warpgroups
constexpr int kDySlots = 4;
constexpr int kPixelBytes = 128;  // a row of the MN-major layout: 64 16-bit values
constexpr int kAtoms = 4;         // the patch columns' 64-wide atoms: 196 -> 256 (zeros)
constexpr int kXColumnsPerThread = (kMaxXRowPixels + kThreads - 1) / kThreads;

struct Params {
  const void* x;
  const void* dy;
  float* partial;
  int height, width, channels;  // x [N][H][W][C]
  int out_height, out_width, filters;
  int stride_h, stride_w, pad_h, pad_w;
  int row_pixels, x_row_pixels;  // OW', x's stored row
  int rows, splits;
  int64_t count;  // K * 49 * C: one run's slice of the partial buffer
};

// Shared memory (bytes) for rows of OW' pixels: dy slots, two patch buffers, two x buffers.
struct Layout {
  int dy_slot, patches, x_rows;
  __host__ __device__ explicit Layout(int row_pixels, int x_row_pixels)
      : dy_slot(row_pixels * kPixelBytes),
        patches(kAtoms * row_pixels * kPixelBytes),
        x_rows((kTap * x_row_pixels * 8 + 1023) / 1024 * 1024) {}
  __host__ __device__ int total() const { return kDySlots * dy_slot + 2 * patches + 2 * x_rows; }
};

template <class T>
__global__ void __launch_bounds__(kThreads, 1)
    patch_wgrad_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(1024) unsigned char smem_patch[];  // no static shared memory
  const Layout layout(p.row_pixels, p.x_row_pixels);
  unsigned char* const sdy = smem_patch;
  unsigned char* const spatches = sdy + kDySlots * layout.dy_slot;
  unsigned char* const sx = spatches + 2 * layout.patches;
  // Patches beyond the taps (columns 196..255) and pixels beyond OW stay zero: clear once.
  for (int i = int(threadIdx.x); i < 2 * layout.patches / 16; i += kThreads)
    reinterpret_cast<uint4*>(spatches)[i] = make_uint4(0, 0, 0, 0);

  const int split = int(blockIdx.x), k_block = int(blockIdx.y);
  const int first = int(int64_t(p.rows) * split / p.splits);
  const int steps = int(int64_t(p.rows) * (split + 1) / p.splits) - first;
  const T* const dy = static_cast<const T*>(p.dy) + k_block * kFilterBlock;

  auto load_dy = [&](int row, int slot) {
    const T* src = dy + int64_t(row) * p.out_width * p.filters;
    unsigned char* dst = sdy + slot * layout.dy_slot;
    for (int i = int(threadIdx.x); i < p.row_pixels * 8; i += kThreads) {
      const int pixel = i / 8, chunk = i % 8;
      const bool ok = pixel < p.out_width;
      cp_async_16(dst + sw128_offset(pixel, chunk), ok ? src + pixel * p.filters + chunk * 8 : dy,
                  ok);
    }
  };
  // x's 7 rows for output row `row` as 8-byte vectors (channels padded with zeros): thread
  // tid takes columns tid and tid + 256 (below x_row_pixels) of every row, column j being x's
  // column j - pad_w. The channels are loaded as 16-bit words straight into registers (a local
  // array here put every load behind the last one).
  const unsigned short* const x_bits = static_cast<const unsigned short*>(p.x);
  uint2 staged[kTap][kXColumnsPerThread];
  auto fetch_x = [&](int row) {
    const int n = row / p.out_height, oh = row % p.out_height;
#pragma unroll
    for (int r = 0; r < kTap; ++r) {
      const int ih = oh * p.stride_h - p.pad_h + r;
      const unsigned short* x_row = x_bits + (int64_t(n) * p.height + ih) * p.width * p.channels;
#pragma unroll
      for (int k = 0; k < kXColumnsPerThread; ++k) {
        const int column = int(threadIdx.x) + k * kThreads, iw = column - p.pad_w;
        uint32_t c0 = 0, c1 = 0, c2 = 0, c3 = 0;
        if (column < p.x_row_pixels && ih >= 0 && ih < p.height && iw >= 0 && iw < p.width) {
          const unsigned short* src = x_row + iw * p.channels;
          c0 = __ldg(src);
          if (p.channels > 1) c1 = __ldg(src + 1);
          if (p.channels > 2) c2 = __ldg(src + 2);
          if (p.channels > 3) c3 = __ldg(src + 3);
        }
        staged[r][k] = make_uint2(c0 | (c1 << 16), c2 | (c3 << 16));
      }
    }
  };
  auto store_x = [&](int buffer) {
    uint2* dst = reinterpret_cast<uint2*>(sx + buffer * layout.x_rows);
#pragma unroll
    for (int r = 0; r < kTap; ++r)
#pragma unroll
      for (int k = 0; k < kXColumnsPerThread; ++k) {
        const int column = int(threadIdx.x) + k * kThreads;
        if (column < p.x_row_pixels) dst[r * p.x_row_pixels + column] = staged[r][k];
      }
  };
  // Patches of the row in x buffer `buffer` into patch buffer `buffer`: the thread of pixel ow
  // in warpgroup w copies the taps of w's columns (taps 0..31 | 32..48), unrolled so that a
  // tap's offsets are constants.
  const int warpgroup = int(threadIdx.x) / 128;
  const int ow = int(threadIdx.x) % 128;
  const int atom_bytes = p.row_pixels * kPixelBytes;
  auto gather_taps = [&]<int First, int Last>(int buffer) {
    const uint2* src =
        reinterpret_cast<const uint2*>(sx + buffer * layout.x_rows) + ow * p.stride_w;
    unsigned char* dst = spatches + buffer * layout.patches;
#pragma unroll
    for (int tap = First; tap < Last; ++tap) {
      const int r = tap / kTap, s = tap % kTap, column = tap * kChannels;
      const uint2 v = src[r * p.x_row_pixels + s];
      *reinterpret_cast<uint2*>(dst + (column / 64) * atom_bytes +
                                sw128_offset(ow, (column % 64) / 8) + (column % 8) * 2) = v;
    }
  };
  auto gather = [&](int buffer) {
    if (ow >= p.out_width) return;
    if (warpgroup == 0)
      gather_taps.template operator()<0, 128 / kChannels>(buffer);
    else
      gather_taps.template operator()<128 / kChannels, kTap * kTap>(buffer);
  };

  if (steps > 0) {
    load_dy(first, 0);
    cp_async_commit();
    fetch_x(first);
    store_x(0);
  }
  __syncthreads();

  const int warp = (int(threadIdx.x) / 32) % 4, lane = int(threadIdx.x) % 32;
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  const uint64_t dy_desc0 = wgmma_descriptor_mn_sw128(sdy, layout.dy_slot);
  const uint64_t patch_desc0 = wgmma_descriptor_mn_sw128(
      spatches + warpgroup * 2 * p.row_pixels * kPixelBytes, p.row_pixels * kPixelBytes);
  constexpr int kStepUnits = 16 * kPixelBytes / 16;  // a k-step: 16 pixel rows

  for (int t = 0; t < steps; ++t) {
    const bool more = t + 1 < steps;
    if (more) load_dy(first + t + 1, (t + 1) % kDySlots);
    cp_async_commit();
    if (more) fetch_x(first + t + 1);
    gather(t % 2);
    if (more) store_x((t + 1) % 2);
    cp_async_wait<1>();   // dy's row t (this thread's part)
    fence_proxy_async();  // the patches' stores and dy's copies -> wgmma
    __syncthreads();
    const uint64_t dy_desc = dy_desc0 + (t % kDySlots) * (layout.dy_slot / 16);
    const uint64_t patch_desc = patch_desc0 + (t % 2) * (layout.patches / 16);
    wgmma_fence();
    for (int q = 0; q < p.row_pixels / 16; ++q)
      wgmma_m64k16_mn<T, 128>(acc, dy_desc + q * kStepUnits, patch_desc + q * kStepUnits);
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  cp_async_wait<0>();

  // acc[4j + 2i + e]: filter 16 warp + g + 8i, patch column 128 w + 8j + 2t + e.
  float* out = p.partial + int64_t(split) * p.count;
  const int g = lane / 4, tq = lane % 4;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int column = 128 * warpgroup + 8 * j + 2 * tq + e;
        const int tap = column / kChannels, c = column % kChannels;
        if (tap >= kTap * kTap || c >= p.channels) continue;
        const int filter = k_block * kFilterBlock + 16 * warp + g + 8 * i;
        out[(int64_t(filter) * kTap * kTap + tap) * p.channels + c] = acc[4 * j + 2 * i + e];
      }
}

}  // namespace

void record(Context& ctx, const Plan& plan, const ConvGeometry& g, const WgradOperands& o,
            const BufferList& reads, const BufferRange& written, const BufferRange& partial) {
  Params params{};
  params.x = o.x;
  params.dy = o.dy;
  params.partial = o.partial;
  params.height = int(g.in[1]);
  params.width = int(g.in[2]);
  params.channels = int(g.in_channels);
  params.out_height = int(g.out[1]);
  params.out_width = int(g.out[2]);
  params.filters = int(g.out_channels);
  params.stride_h = int(g.stride[1]);
  params.stride_w = int(g.stride[2]);
  params.pad_h = int(g.pad_lo[1]);
  params.pad_w = int(g.pad_lo[2]);
  params.row_pixels = plan.row_pixels;
  params.x_row_pixels = plan.x_row_pixels;
  params.rows = int(plan.rows);
  params.splits = plan.splits;
  params.count = g.out_channels * kTap * kTap * g.in_channels;
  if (plan.partial_bytes < size_t(plan.splits) * size_t(params.count) * sizeof(float))
    throw Error("patch wgrad", "the partial buffer is smaller than the plan's splits");
  const size_t smem = size_t(Layout(plan.row_pixels, plan.x_row_pixels).total());
  const dim3 grid(unsigned(plan.splits), unsigned(plan.k_blocks));
  auto run = [&](auto tag) {
    using T = decltype(tag);
    auto* kernel = &patch_wgrad_kernel<T>;
    FUSEBOX_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    ctx.encoder.launch(kernel, grid, dim3(kThreads), smem, reads, {partial}, params);
    record_sum_splits<T>(ctx, partial, o.partial, plan.splits, params.count, written,
                         static_cast<T*>(o.dw));
  };
  if (plan.dtype == DType::bf16)
    run(__nv_bfloat16());
  else if (plan.dtype == DType::f16)
    run(__half());
  else
    throw Error("patch wgrad", cat("no kernel for ", dtype_name(plan.dtype)));
}

}  // namespace fusebox::cuda::patch_wgrad
