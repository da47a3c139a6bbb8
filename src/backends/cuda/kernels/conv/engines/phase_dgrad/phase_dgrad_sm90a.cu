// The phase dgrad's kernel (plan.h says what and why). A persistent CTA of two warpgroups
// keeps one 64-channel block of dx: it loads that block's filter (9 taps x K filters) into
// shared memory once, then takes tiles of 128 lattice points; warpgroup g owns the tile's
// points 64 g .. 64 g + 63 and four 64 x 64 accumulators, one a stride phase (a, b).
//
// A tile is K / 64 K steps of four stages, one a shift (di, dj) of dy, in this order:
//   stage   A (smem, 128 x 64)     filter taps -> accumulator of phase
//   S00     dy[i][j]               w[1][1] -> (0,0), w[1][2] -> (0,1), w[2][1] -> (1,0),
//                                  w[2][2] -> (1,1)
//   S01     dy[i][j + 1]           w[1][0] -> (0,1), w[2][0] -> (1,1)
//   S10     dy[i + 1][j]           w[0][1] -> (1,0), w[0][2] -> (1,1)
//   S11     dy[i + 1][j + 1]       w[0][0] -> (1,1)
// (dy's positions outside it are zeros: cp.async's zero fill). Per stage, top to bottom:
//   1. Wait for the stage's loads (this thread's), make them visible to wgmma, barrier (every
//      thread is past the stage two back: its buffer is free).
//   2. Each warpgroup issues 4 k16 wgmmas per tap (A K-major: dy's pixels as they are; B
//      MN-major: the KRSC filter's rows of C channels as they are).
//   3. Every thread issues its share of the loads kLookahead stages ahead (cp.async) into the
//      buffer of the stage two back, then waits for its warpgroup's previous stage.
// After a tile's last stage the accumulators go to dx, a phase at a time through the
// warpgroup's staging tile (f32 -> T), each phase (a, b) of lattice point (n, i, j) to pixel
// (n, 2i + a, 2j + b) when inside dx, as 16-byte stores; the next tile's first stages are in
// flight meanwhile.
//
// Shared memory: the filter block, 9 * K/64 tiles of 64 x 64 (8 KiB each, MN-major), then
// kBuffers A buffers of 16 KiB, then a staging tile of 8 KiB a warpgroup; every tile
// 1024-byte aligned. K = 128: 224 KiB.
#include "backends/cuda/device/wgmma.cuh"
#include "backends/cuda/kernels/conv/engines/phase_dgrad/phase_dgrad.h"
#include "backends/cuda/runtime/check.h"

namespace fusebox::cuda::phase_dgrad {

namespace {

constexpr int kThreads = 256;                         // two warpgroups
constexpr int kBuffers = 4;                           // of A
constexpr int kLookahead = kBuffers - 2;              // stages in flight while one computes
constexpr int kRowBytes = kChannelBlock * 2;          // 64 16-bit elements
constexpr int kABytes = kLatticeBlock * kRowBytes;    // 16 KiB
constexpr int kTapBytes = kChannelBlock * kRowBytes;  // 8 KiB: 64 filters x 64 channels

constexpr int kStagingBytes = 64 * kRowBytes;  // a warpgroup's 64 points of one phase
// The filter block (9 taps x K / 64 steps), the A buffers, a staging tile a warpgroup.
constexpr size_t shared_bytes(int k_steps) {
  return size_t(9 * k_steps) * kTapBytes + size_t(kBuffers) * kABytes + 2 * kStagingBytes;
}

// Barrier `id` (1, 2: 0 is __syncthreads') among the 128 threads of one warpgroup.
__device__ __forceinline__ void warpgroup_barrier(int id) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}

struct Params {
  const void* dy;
  const void* w;
  void* dx;
  int height, width;         // dx: H, W
  int out_h, out_w;          // dy: P, Q
  int channels, filters;     // C, K
  int lattice_h, lattice_w;  // ceil(H / 2), ceil(W / 2)
  int points;                // N * lattice_h * lattice_w
  int c_blocks, k_steps;     // C / 64, K / 64
  int tiles;
};

// The taps (r, s) stage `shift` multiplies, and the phase accumulator each adds into.
__host__ __device__ constexpr int tap_count(int shift) {
  return shift == 0 ? 4 : shift == 3 ? 1 : 2;
}
__host__ __device__ constexpr int tap_r(int shift, int t) {
  return shift == 0 ? 1 + t / 2 : shift == 1 ? 1 + t : shift == 2 ? 0 : 0;
}
__host__ __device__ constexpr int tap_s(int shift, int t) {
  return shift == 0 ? 1 + t % 2 : shift == 1 ? 0 : shift == 2 ? 1 + t : 0;
}
// Phase index 2a + b of tap (r, s): a = 0 for r = 1 (even dx rows), else 1.
__host__ __device__ constexpr int tap_phase(int shift, int t) {
  return 2 * (tap_r(shift, t) != 1) + (tap_s(shift, t) != 1);
}

// A lattice point of a tile as the loads and the epilogue need it.
struct Point {
  int pixel;  // dy pixel (n, i, j) as (n * P + i) * Q + j
  int n, i, j;
  bool valid;
  __device__ static Point at(const Params& p, int point) {
    Point q;
    q.valid = point < p.points;
    const int m = q.valid ? point : 0;
    q.j = m % p.lattice_w;
    const int ni = m / p.lattice_w;
    q.i = ni % p.lattice_h;
    q.n = ni / p.lattice_h;
    q.pixel = (q.n * p.out_h + q.i) * p.out_w + q.j;
    return q;
  }
};

template <class T>
__global__ void __launch_bounds__(kThreads, 1)
    phase_dgrad_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(1024) unsigned char smem_phase[];  // no static shared memory
  const int tid = int(threadIdx.x);
  // CTA b keeps channel block b % c_blocks and takes that block's tiles b / c_blocks + i *
  // stride (gridDim.x is a multiple of c_blocks).
  const int c_block = int(blockIdx.x) % p.c_blocks;
  const int first_tile = int(blockIdx.x) / p.c_blocks, stride = int(gridDim.x) / p.c_blocks;
  const int my_tiles = first_tile < p.tiles ? (p.tiles - first_tile + stride - 1) / stride : 0;
  const int stages_per_tile = 4 * p.k_steps;
  const int total = my_tiles * stages_per_tile;
  const T* const dy = static_cast<const T*>(p.dy);
  unsigned char* const filter = smem_phase;
  unsigned char* const a_buffers = smem_phase + 9 * p.k_steps * kTapBytes;
  unsigned char* const staging =
      a_buffers + kBuffers * kABytes + (int(threadIdx.x) / 128) * kStagingBytes;

  // Loads: 16-byte chunk tid % 8 of rows tid / 8 + 32 q. The filter block once: tap t of K
  // step ks is the 64 x 64 tile (ks * 9 + t), rows = filters, channels contiguous.
  const int chunk = tid % 8, row0 = tid / 8;
  {
    const T* const w = static_cast<const T*>(p.w) + c_block * kChannelBlock + chunk * 8;
    for (int tile = 0; tile < 9 * p.k_steps; ++tile) {
      const int ks = tile / 9, tap = tile % 9;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int k = ks * kChannelBlock + row0 + 32 * q;
        cp_async_16(filter + tile * kTapBytes + sw128_offset(row0 + 32 * q, chunk),
                    w + (int64_t(k) * 9 + tap) * p.channels, true);
      }
    }
    cp_async_commit();
  }
  // A stages: the points of the tile being loaded are cached.
  int loaded_tile = -1;
  Point load_points[4];
  auto issue = [&](int u) {
    if (u < total) {
      const int rest = u % stages_per_tile, k_step = rest / 4, shift = rest % 4;
      const int tile = first_tile + (u / stages_per_tile) * stride;
      if (tile != loaded_tile) {
        loaded_tile = tile;
#pragma unroll
        for (int q = 0; q < 4; ++q)
          load_points[q] = Point::at(p, tile * kLatticeBlock + row0 + 32 * q);
      }
      unsigned char* const buffer = a_buffers + (u % kBuffers) * kABytes;
      const int di = shift / 2, dj = shift % 2;
      const T* const base = dy + k_step * kChannelBlock + chunk * 8;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const Point& pt = load_points[q];
        const bool ok = pt.valid && pt.i + di < p.out_h && pt.j + dj < p.out_w;
        cp_async_16(buffer + sw128_offset(row0 + 32 * q, chunk),
                    ok ? base + int64_t(pt.pixel + di * p.out_w + dj) * p.filters : dy, ok);
      }
    }
    cp_async_commit();
  };

#pragma unroll
  for (int u = 0; u < kLookahead; ++u) issue(u);

  const int group = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  float acc[4][32];
#pragma unroll
  for (int ph = 0; ph < 4; ++ph)
#pragma unroll
    for (int e = 0; e < 32; ++e) acc[ph][e] = 0.0f;
  // Descriptors of A buffer 0 (this warpgroup's 64 rows) and filter tile 0; a buffer, a tile,
  // a k-step are offsets added to the address field (16-byte units; addresses stay below
  // 256 KiB, so it never carries).
  const uint64_t a_desc0 = wgmma_descriptor_sw128(a_buffers + group * (kABytes / 2));
  const uint64_t b_desc0 = wgmma_descriptor_mn_sw128(filter, kTapBytes);

  int u = 0;
  for (int i = 0; i < my_tiles; ++i) {
    for (int k_step = 0; k_step < p.k_steps; ++k_step) {
#pragma unroll
      for (int shift = 0; shift < 4; ++shift, ++u) {
        cp_async_wait<kLookahead - 1>();  // this stage's loads (this thread's) have landed
        fence_proxy_async();              // ... visible to wgmma
        __syncthreads();                  // ... everyone's; stage u - 2's wgmmas have retired
        const uint64_t a_desc = a_desc0 + uint64_t((u % kBuffers) * (kABytes / 16));
        const uint64_t b_desc = b_desc0 + uint64_t(k_step * 9 * (kTapBytes / 16));
        wgmma_fence();
#pragma unroll
        for (int t = 0; t < tap_count(shift); ++t) {
          const int tap = 3 * tap_r(shift, t) + tap_s(shift, t);
#pragma unroll
          for (int q = 0; q < 4; ++q)
            wgmma_m64k16_b_mn<T, 64>(acc[tap_phase(shift, t)], a_desc + q * 2,
                                     b_desc + tap * (kTapBytes / 16) + q * 128);
        }
        wgmma_commit();
        issue(u + kLookahead);
        wgmma_wait<1>();
      }
    }
    wgmma_wait<0>();

    // The tile to dx, a phase at a time through this warpgroup's staging tile: acc[ph][4 jj
    // + 2 h + e] (point 16 warp + g + 8 h of the warpgroup's 64, channel 8 jj + 2 t + e) is
    // written as pairs into 128-byte rows (16-byte chunks swizzled as the A tiles: no bank
    // conflicts), then each row goes out as 16-byte stores, eight lanes a row. (Pairs
    // stored straight to dx took half the kernel's time: 83 us against 42 without them.)
    const int tile = first_tile + i * stride;
    const int g = lane / 4, t4 = lane % 4, wg_thread = tid % 128;
    struct alignas(2 * sizeof(T)) Pair {
      T a, b;
    };
    Point out_points[4];  // rows wg_thread / 8 + 16 q of the warpgroup's 64
#pragma unroll
    for (int q = 0; q < 4; ++q)
      out_points[q] = Point::at(p, tile * kLatticeBlock + 64 * group + wg_thread / 8 + 16 * q);
    T* const dx = static_cast<T*>(p.dx) + c_block * kChannelBlock + (wg_thread % 8) * 8;
#pragma unroll
    for (int ph = 0; ph < 4; ++ph) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int jj = 0; jj < 8; ++jj)
          *reinterpret_cast<Pair*>(staging + sw128_offset(16 * warp + g + 8 * h, jj) + 4 * t4) =
              Pair{T(acc[ph][4 * jj + 2 * h]), T(acc[ph][4 * jj + 2 * h + 1])};
      warpgroup_barrier(1 + group);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const Point& pt = out_points[q];
        const int y = 2 * pt.i + ph / 2, x = 2 * pt.j + ph % 2;
        if (pt.valid && y < p.height && x < p.width)
          *reinterpret_cast<uint4*>(dx +
                                    (int64_t(pt.n * p.height + y) * p.width + x) * p.channels) =
              *reinterpret_cast<const uint4*>(staging +
                                              sw128_offset(wg_thread / 8 + 16 * q, wg_thread % 8));
      }
      warpgroup_barrier(1 + group);  // the staging tile is free again
    }
#pragma unroll
    for (int ph = 0; ph < 4; ++ph)
#pragma unroll
      for (int e = 0; e < 32; ++e) acc[ph][e] = 0.0f;
  }
  cp_async_wait<0>();
}

template <class T>
void launch(Context& ctx, const Plan& plan, const Params& params, const BufferList& reads,
            const BufferRange& written) {
  auto* kernel = &phase_dgrad_kernel<T>;
  const size_t smem = shared_bytes(params.k_steps);
  FUSEBOX_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  ctx.encoder.launch(kernel, dim3(unsigned(plan.ctas)), dim3(kThreads), smem, reads, {written},
                     params);
}

}  // namespace

void record(Context& ctx, const Plan& plan, const ConvGeometry& g, const void* dy, const void* w,
            void* dx, const BufferList& reads, const BufferRange& written) {
  Params params{};
  params.dy = dy;
  params.w = w;
  params.dx = dx;
  params.height = int(g.in[1]);
  params.width = int(g.in[2]);
  params.out_h = int(g.out[1]);
  params.out_w = int(g.out[2]);
  params.channels = int(g.in_channels);
  params.filters = int(g.out_channels);
  params.lattice_h = int(plan.lattice_h);
  params.lattice_w = int(plan.lattice_w);
  params.points = int(g.batch * plan.lattice_h * plan.lattice_w);
  params.c_blocks = plan.c_blocks;
  params.k_steps = int(g.out_channels / kChannelBlock);
  params.tiles = int(plan.tiles);
  if (plan.ctas % plan.c_blocks != 0 || params.k_steps > kMaxFilterSteps)
    throw Error("phase dgrad",
                "a plan whose CTAs do not split evenly over the channel blocks, "
                "or whose filter block does not fit in shared memory");
  if (plan.dtype == DType::bf16)
    launch<__nv_bfloat16>(ctx, plan, params, reads, written);
  else if (plan.dtype == DType::f16)
    launch<__half>(ctx, plan, params, reads, written);
  else
    throw Error("phase dgrad", cat("no kernel for ", dtype_name(plan.dtype)));
}

}  // namespace fusebox::cuda::phase_dgrad
