// The halo weight gradient's kernel (plan.h says what and why). One CTA: a 64-filter block of
// dy, a 64-channel block of x, a run of consecutive rows (N*H*segments order); three
// warpgroups, warpgroup r computing the taps (r, 0..2) as one 64 x 192 accumulator.
//
// Per output row o = (n, h) of the run, top to bottom:
//   1. Wait for row o's loads: dy's row o and x's row o + 1 (rows o - 1 and o came earlier).
//      x's rows live in a ring of slots, each the row three times, copy s shifted by s - 1
//      columns (zeros past the image's edges): the B of all three taps (r, s) is one
//      descriptor whose N atoms are the copies.
//   2. Warpgroup r issues W'/16 wgmmas m64 n192 k16 (k-steps of 16 pixels): A is dy's row
//      read transposed (dy^T: filters x pixels), B x's row o + r - 1 (the slot of zeros if
//      h + r - 1 is outside the image). Both are MN-major: channels-last rows as they are.
//      One row's wgmmas stay in flight while the next row is loaded and issued.
//   3. Issue the loads kLookahead rows ahead (cp.async, all threads), while the tensor cores
//      run: per row a thread computes a few addresses, no divisions (RowCursor).
// Then each thread writes its accumulators (f32) into the run's slice of the partial buffer,
// dw's layout [K][3][3][C].
//
// Ring sizes: at row t, the wgmmas of row t - 1 may still read x slots t - 1 .. t + 1 while
// row t reads t .. t + 2, rows up to t + kLookahead + 1 are in flight and row t + kLookahead
// + 2 is being loaded: kLookahead + 4 x slots; the same for dy: kLookahead + 2 dy slots.
#include "backends/cuda/device/wgmma.cuh"
#include "backends/cuda/kernels/conv/engines/halo_wgrad/halo_wgrad.h"
#include "backends/cuda/kernels/conv/split_sum.cuh"
#include "backends/cuda/runtime/check.h"

namespace fusebox::cuda::halo_wgrad {

namespace {

constexpr int kThreads = 384;  // three warpgroups: tap rows 0, 1, 2
constexpr int kLookahead = 2;
constexpr int kXSlots = kLookahead + 4;
constexpr int kDySlots = kLookahead + 2;
constexpr int kPixelBytes = kChannelBlock * 2;  // one pixel's 64 16-bit channels

struct Params {
  const void* x;
  const void* dy;
  float* partial;
  int height, width, channels, filters;  // x [N][H][W][C], dy [N][H][W][K]
  int segment_width;
  int plane;  // N * H: the rows of one segment
  int rows;   // plane * segments
  int splits, c_blocks;
  int64_t count;  // K * 9 * C: one run's slice of the partial buffer
};

// The x ring, one more x slot of zeros (the B of taps above or below the image: a wgmma
// skipped in a branch would serialize the others), the dy ring.
template <int KSteps>
constexpr size_t shared_bytes() {
  return size_t((kXSlots + 1) * 3 + kDySlots) * KSteps * 16 * kPixelBytes;
}

// A row of the reduction (N*H*segments order) as the loads need it, advanced one row at a
// time (no division a row): valid (inside 0 .. rows), its image row n*H + h, h, the first
// column of its segment.
struct RowCursor {
  int row, image_row, h, column0;
  bool valid;
  __device__ static RowCursor at(const Params& p, int row) {
    const int r = max(row, 0);
    return {row, r % p.plane, (r % p.plane) % p.height, (r / p.plane) * p.segment_width,
            row >= 0 && row < p.rows};
  }
  __device__ void advance(const Params& p) {
    ++row;
    valid = row >= 0 && row < p.rows;
    if (row <= 0) return;  // from -1 to row 0: already there
    if (++h == p.height) h = 0;
    if (++image_row == p.plane) image_row = 0, column0 += p.segment_width;
  }
};

template <class T, int KSteps>
__global__ void __launch_bounds__(kThreads, 1) halo_wgrad_kernel(const __grid_constant__ Params p) {
  constexpr int kRowPixels = KSteps * 16;
  constexpr int kRowBytes = kRowPixels * kPixelBytes;
  extern __shared__ __align__(1024) unsigned char smem_halo[];  // no static shared memory
  unsigned char* const sx = smem_halo;
  unsigned char* const zeros = smem_halo + kXSlots * 3 * kRowBytes;
  unsigned char* const sdy = zeros + 3 * kRowBytes;
  for (int i = int(threadIdx.x); i < 3 * kRowBytes / 16; i += kThreads)
    reinterpret_cast<uint4*>(zeros)[i] = make_uint4(0, 0, 0, 0);

  const int split = int(blockIdx.x);
  const int k_block = int(blockIdx.y) / p.c_blocks, c_block = int(blockIdx.y) % p.c_blocks;
  const int first = int(int64_t(p.rows) * split / p.splits);
  const int steps = int(int64_t(p.rows) * (split + 1) / p.splits) - first;
  const T* const x = static_cast<const T*>(p.x) + c_block * kChannelBlock;
  const T* const dy = static_cast<const T*>(p.dy) + k_block * kChannelBlock;

  // This thread's 16-byte chunks of a row: items i = tid, tid + kThreads below W' * 8, each
  // pixel i / 8, chunk i % 8, fetched for dy and for x's three copies (same swizzled offset).
  constexpr int kItems = (kRowPixels * 8 + kThreads - 1) / kThreads;
  // x's row `xr` into ring position `xp` and dy's row `dr` into dy position `dp`.
  auto load = [&](const RowCursor& xr, int xp, const RowCursor& dr, int dp, bool with_dy) {
    const T* const x_src = x + int64_t(xr.image_row) * p.width * p.channels;
    const T* const dy_src = dy + int64_t(dr.image_row) * p.width * p.filters;
    unsigned char* const x_slot = sx + (xp % kXSlots) * 3 * kRowBytes;
    unsigned char* const dy_slot = sdy + (dp % kDySlots) * kRowBytes;
#pragma unroll
    for (int item = 0; item < kItems; ++item) {
      const int i = int(threadIdx.x) + item * kThreads;
      if (i >= kRowPixels * 8) break;
      const int pixel = i / 8, chunk = i % 8, offset = sw128_offset(pixel, chunk);
#pragma unroll
      for (int copy = 0; copy < 3; ++copy) {
        const int column = xr.column0 + pixel + copy - 1;
        const bool ok = xr.valid && unsigned(column) < unsigned(p.width);
        cp_async_16_l1(x_slot + copy * kRowBytes + offset,
                       ok ? x_src + column * p.channels + chunk * 8 : x, ok);
      }
      if (with_dy) {
        const int column = dr.column0 + pixel;
        const bool ok = dr.valid && pixel < p.segment_width && column < p.width;
        cp_async_16(dy_slot + offset, ok ? dy_src + column * p.filters + chunk * 8 : dy, ok);
      }
    }
  };

  // x ring position j holds row first - 1 + j; output row first + t reads positions t .. t + 2.
  RowCursor x_row = RowCursor::at(p, first - 1), dy_row = RowCursor::at(p, first);
  load(x_row, 0, dy_row, 0, false);
  x_row.advance(p);
  load(x_row, 1, dy_row, 0, false);
  x_row.advance(p);
  cp_async_commit();
#pragma unroll
  for (int t = 0; t < kLookahead; ++t) {
    if (t < steps) load(x_row, t + 2, dy_row, t, true);
    x_row.advance(p);
    dy_row.advance(p);
    cp_async_commit();
  }

  const int tap_row = int(threadIdx.x) / 128, warp = (int(threadIdx.x) / 32) % 4;
  const int lane = int(threadIdx.x) % 32;
  float acc[96];
#pragma unroll
  for (int i = 0; i < 96; ++i) acc[i] = 0.0f;
  // Descriptors of position 0's rows; a slot, a k-step are offsets added to the address field
  // (16-byte units; addresses stay below 256 KiB, so it never carries).
  const uint64_t x_desc0 = wgmma_descriptor_mn_sw128(sx, kRowBytes);
  const uint64_t zero_desc = wgmma_descriptor_mn_sw128(zeros, kRowBytes);
  const uint64_t dy_desc0 = wgmma_descriptor_mn_sw128(sdy, kRowBytes);
  constexpr int kStepUnits = 16 * kPixelBytes / 16;
  int h = RowCursor::at(p, first).h;  // the output row's

  for (int t = 0; t < steps; ++t) {
    cp_async_wait<kLookahead - 1>();  // row t's loads (this thread's) have landed
    fence_proxy_async();              // ... visible to wgmma (the zeros' stores too)
    __syncthreads();                  // ... everyone's; row t - 2's wgmmas have retired
    // The tensor cores first: then the loads are issued while they run.
    const int x_h = h + tap_row - 1;
    const uint64_t x_desc = x_h >= 0 && x_h < p.height
                                ? x_desc0 + ((t + tap_row) % kXSlots) * (3 * kRowBytes / 16)
                                : zero_desc;
    const uint64_t dy_desc = dy_desc0 + (t % kDySlots) * (kRowBytes / 16);
    wgmma_fence();
#pragma unroll
    for (int q = 0; q < KSteps; ++q)
      wgmma_m64k16_mn<T, 192>(acc, dy_desc + q * kStepUnits, x_desc + q * kStepUnits);
    wgmma_commit();
    if (t + kLookahead < steps) load(x_row, t + kLookahead + 2, dy_row, t + kLookahead, true);
    x_row.advance(p);
    dy_row.advance(p);
    cp_async_commit();
    if (++h == p.height) h = 0;
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  cp_async_wait<0>();

  // acc[4j + 2i + e]: filter 16 warp + g + 8i, column n = 8j + 2t + e of (s, channel).
  float* out = p.partial + int64_t(split) * p.count;
  const int g = lane / 4, tq = lane % 4;
#pragma unroll
  for (int j = 0; j < 24; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int filter = k_block * kChannelBlock + 16 * warp + g + 8 * i;
      const int n = 8 * j + 2 * tq, s = n / kChannelBlock;
      const int channel = c_block * kChannelBlock + n % kChannelBlock;
      const int64_t at = ((int64_t(filter) * 3 + tap_row) * 3 + s) * p.channels + channel;
      *reinterpret_cast<float2*>(out + at) =
          make_float2(acc[4 * j + 2 * i], acc[4 * j + 2 * i + 1]);
    }
}

template <class T, int KSteps>
void launch(Context& ctx, const Plan& plan, const Params& params, const BufferList& reads,
            const BufferRange& partial) {
  auto* kernel = &halo_wgrad_kernel<T, KSteps>;
  constexpr size_t smem = shared_bytes<KSteps>();
  FUSEBOX_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  ctx.encoder.launch(kernel, dim3(unsigned(plan.splits), unsigned(plan.k_blocks * plan.c_blocks)),
                     dim3(kThreads), smem, reads, {partial}, params);
}

template <class T>
void launch_steps(Context& ctx, const Plan& plan, const Params& params, const BufferList& reads,
                  const BufferRange& partial) {
  switch (plan.row_pixels / 16) {
    case 1:
      return launch<T, 1>(ctx, plan, params, reads, partial);
    case 2:
      return launch<T, 2>(ctx, plan, params, reads, partial);
    case 3:
      return launch<T, 3>(ctx, plan, params, reads, partial);
    case 4:
      return launch<T, 4>(ctx, plan, params, reads, partial);
  }
  throw Error("halo wgrad", cat("no kernel for rows of ", plan.row_pixels, " pixels"));
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
  params.filters = int(g.out_channels);
  params.segment_width = plan.segment_width;
  params.plane = int(g.batch * g.in[1]);
  params.rows = int(plan.rows);
  params.splits = plan.splits;
  params.c_blocks = plan.c_blocks;
  params.count = g.out_channels * 9 * g.in_channels;
  if (plan.partial_bytes < size_t(plan.splits) * size_t(params.count) * sizeof(float))
    throw Error("halo wgrad", "the partial buffer is smaller than the plan's splits");
  if (plan.dtype == DType::bf16) {
    launch_steps<__nv_bfloat16>(ctx, plan, params, reads, partial);
    record_sum_splits<__nv_bfloat16>(ctx, partial, o.partial, plan.splits, params.count, written,
                                     static_cast<__nv_bfloat16*>(o.dw));
  } else if (plan.dtype == DType::f16) {
    launch_steps<__half>(ctx, plan, params, reads, partial);
    record_sum_splits<__half>(ctx, partial, o.partial, plan.splits, params.count, written,
                              static_cast<__half*>(o.dw));
  } else {
    throw Error("halo wgrad", cat("no kernel for ", dtype_name(plan.dtype)));
  }
}

}  // namespace fusebox::cuda::halo_wgrad
