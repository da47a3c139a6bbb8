// Space-to-depth and its fold (space_to_depth.h).
//
// The row kernels (below) run whenever a row fits in shared memory: one block per wide row
// (n, q0, q1). space_to_depth stages the s0 * s1 plain rows it reads with coalesced loads, then
// writes the wide row in 16-byte vectors; depth_to_space stages the wide row in 16-byte
// vectors, then writes the plain rows it holds (each element the sum of the R'2 wide elements
// that hold it, in f32, rounded once) with coalesced stores. Each thread keeps one vector slot
// (one (a2, c) for the fold), so its index digits are found once, not per element.
// The gather kernels (first) serve rows past shared memory: one thread per 8 wide channels or
// per plain position, reading global memory directly -- for small C those 2-byte scattered
// reads are L1-wavefront bound (the stem: 0.65 TB/s).
// Both move bits only on the space-to-depth side (bf16 and f16 as uint16_t); index math in 32
// bits (space_to_depth_lowering checks the extents).
#include "backends/cuda/kernels/conv/engines/space_to_depth/space_to_depth.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <limits>

#include "backends/cuda/device/math.cuh"

namespace fusebox::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void space_to_depth_kernel(PhaseMap m, const uint16_t* plain, uint16_t* wide) {
  const int vectors = m.wide_channels / 8, used = m.used_channels();
  const int count = m.batch * m.wide[0] * m.wide[1] * m.wide[2] * vectors;
  for (int i = int(global_thread_index()); i < count; i += int(grid_stride())) {
    const int position = i / vectors, first = (i - position * vectors) * 8;
    int q[3], rest = position;
    for (int d = 2; d >= 0; --d) q[d] = rest % m.wide[d], rest /= m.wide[d];
    const int n = rest;
    // Each group (u, a) of C channels is one plain position's, found once per group.
    PhaseDigits digits(m, first);
    auto group_offset = [&] {  // the group's channel 0 in plain, or -1 outside
      int offset = n;
      for (int d = 0; d < 3; ++d) {
        const int t = digits.source(m, q, d);
        if (t < 0 || t >= m.source[d]) return -1;
        offset = offset * m.source[d] + t;
      }
      return offset * m.channels;
    };
    int offset = group_offset();
    alignas(16) uint16_t v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[e] = first + e < used && offset >= 0 ? plain[offset + digits.c] : uint16_t(0);
      if (digits.next(m)) offset = group_offset();
    }
    *reinterpret_cast<uint4*>(wide + int64_t(position) * m.wide_channels + first) =
        *reinterpret_cast<const uint4*>(v);
  }
}

template <class T>
__global__ void depth_to_space_kernel(PhaseMap m, const T* wide, T* plain) {
  const int pixels = m.batch * m.source[0] * m.source[1] * m.source[2];
  for (int i = int(global_thread_index()); i < pixels; i += int(grid_stride())) {
    int t[3], rest = i;
    for (int d = 2; d >= 0; --d) t[d] = rest % m.source[d], rest /= m.source[d];
    const int n = rest;
    // Along each dim the phase a and lattice point q with s*q + a - p = t; the last dim's
    // q2 + u2 is that point, so each folded tap u2 gives one candidate q2.
    int a[3], q[3];
    bool inside = true;
    for (int d = 0; d < 3; ++d) {
      const int v = t[d] + m.pad[d];
      q[d] = v / m.stride[d], a[d] = v - q[d] * m.stride[d];
      inside = inside && (d == 2 || q[d] < m.wide[d]);
    }
    const int phase = (a[0] * m.stride[1] + a[1]) * m.stride[2] + a[2];
    const int phases = m.stride[0] * m.stride[1] * m.stride[2];
    for (int c = 0; c < m.channels; ++c) {
      float sum = 0;
#pragma unroll 4
      for (int u = 0; inside && u < m.unfold; ++u) {
        const int q2 = q[2] - u;
        if (q2 < 0 || q2 >= m.wide[2]) continue;
        const int position = ((n * m.wide[0] + q[0]) * m.wide[1] + q[1]) * m.wide[2] + q2;
        const int j = (u * phases + phase) * m.channels + c;
        sum += load_compute(wide, int64_t(position) * m.wide_channels + j);
      }
      store_compute(plain, int64_t(i) * m.channels + c, sum);
    }
  }
}

// The row kernels: one block per wide row (n, q0, q1) -- all its positions and channels --
// whose plain data is s0 * s1 plain rows (or whose plain rows are those). The plain side is
// staged in shared memory with coalesced accesses, the wide side moved in 16-byte vectors, so
// the scattered 2-byte accesses of small C hit shared memory, not L1 (the gather kernels above:
// 0.65 TB/s on the stem, L1-wavefront bound). Where the staged rows pass kMaxRowBytes, the
// gather kernels run.
constexpr int kMaxRowBytes = 48 * 1024;

__device__ __forceinline__ void wide_row_of_block(const PhaseMap& m, int* n, int* q0, int* q1) {
  int row = int(blockIdx.x);
  *q1 = row % m.wide[1], row /= m.wide[1];
  *q0 = row % m.wide[0], *n = row / m.wide[0];
}

__global__ void space_to_depth_rows_kernel(PhaseMap m, const uint16_t* plain, uint16_t* wide) {
  extern __shared__ __align__(16) unsigned char staged_bytes[];
  uint16_t* staged = reinterpret_cast<uint16_t*>(staged_bytes);  // [s0 * s1][T2 * C]
  int n, q0, q1;
  wide_row_of_block(m, &n, &q0, &q1);
  const int row_length = m.source[2] * m.channels;
  for (int a0 = 0; a0 < m.stride[0]; ++a0)
    for (int a1 = 0; a1 < m.stride[1]; ++a1) {
      const int t0 = m.stride[0] * q0 + a0 - m.pad[0], t1 = m.stride[1] * q1 + a1 - m.pad[1];
      const bool inside = t0 >= 0 && t0 < m.source[0] && t1 >= 0 && t1 < m.source[1];
      const uint16_t* from =
          plain + ((int64_t(n) * m.source[0] + t0) * m.source[1] + t1) * row_length;
      uint16_t* to = staged + (a0 * m.stride[1] + a1) * row_length;
      for (int e = int(threadIdx.x); e < row_length; e += int(blockDim.x))
        to[e] = inside ? from[e] : uint16_t(0);
    }
  // The block is (positions per pass) x (vectors of a position): a thread keeps one vector
  // slot, so its 8 channels' digits -- where in the staged rows they read, relative to the
  // position -- are found once: t2 = s2 * q2 + t2_at_0[e], offset base[e] + t2 * C.
  const int vectors = m.wide_channels / 8, used = m.used_channels();
  const int slot = int(threadIdx.x) % vectors, per_pass = int(blockDim.x) / vectors;
  const int first = slot * 8;
  PhaseDigits digits(m, first);
  int base[8], t2_at_0[8];
  const int zero_q[3] = {0, 0, 0};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    base[e] = (digits.a[0] * m.stride[1] + digits.a[1]) * row_length + digits.c;
    // Past the used channels: a t2 no position reaches, so the element stays zero.
    t2_at_0[e] = first + e < used ? digits.source(m, zero_q, 2) : -(1 << 30);
    digits.next(m);
  }
  __syncthreads();
  uint16_t* out = wide + int64_t(blockIdx.x) * m.wide[2] * m.wide_channels + first;
  for (int q2 = int(threadIdx.x) / vectors; q2 < m.wide[2]; q2 += per_pass) {
    alignas(16) uint16_t v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int t2 = m.stride[2] * q2 + t2_at_0[e];
      v[e] = t2 >= 0 && t2 < m.source[2] ? staged[base[e] + t2 * m.channels] : uint16_t(0);
    }
    *reinterpret_cast<uint4*>(out + int64_t(q2) * m.wide_channels) =
        *reinterpret_cast<const uint4*>(v);
  }
}

// The plain rows of one dim that wide row q writes: [begin, end) of the s rows whose lattice
// point is q, and for the last q also the rows past the lattice (no window reads them: zero).
struct PlainRows {
  int begin, end, read_end;  // rows in [read_end, end) are the unread ones
};
__device__ __forceinline__ PlainRows plain_rows(const PhaseMap& m, int d, int q) {
  PlainRows r;
  r.begin = max(m.stride[d] * q - m.pad[d], 0);
  r.read_end = min(m.stride[d] * (q + 1) - m.pad[d], m.source[d]);
  r.end = q == m.wide[d] - 1 ? m.source[d] : r.read_end;
  r.begin = min(r.begin, r.read_end);
  return r;
}

template <class T>
__global__ void depth_to_space_rows_kernel(PhaseMap m, const T* wide, T* plain) {
  extern __shared__ __align__(16) unsigned char staged_bytes[];
  T* staged_wide = reinterpret_cast<T*>(staged_bytes);  // [Q2][C']
  int n, q0, q1;
  wide_row_of_block(m, &n, &q0, &q1);
  const int row_vectors = m.wide[2] * m.wide_channels / 8;
  const uint4* from =
      reinterpret_cast<const uint4*>(wide + int64_t(blockIdx.x) * m.wide[2] * m.wide_channels);
  for (int i = int(threadIdx.x); i < row_vectors; i += int(blockDim.x))
    reinterpret_cast<uint4*>(staged_wide)[i] = from[i];
  __syncthreads();
  // The block is (lattice points per pass) x s2 x C: a thread keeps one (a2, c) and walks the
  // lattice points l of its rows, t2 = s2 * l + a2 - p2, whose folded taps u read wide
  // position l - u (no divisions per element).
  const int c = int(threadIdx.x) % m.channels;
  const int a2 = int(threadIdx.x) / m.channels % m.stride[2];
  const int lane = int(threadIdx.x) / (m.channels * m.stride[2]);
  const int per_pass = int(blockDim.x) / (m.channels * m.stride[2]);
  const PlainRows rows0 = plain_rows(m, 0, q0), rows1 = plain_rows(m, 1, q1);
  const int row_length = m.source[2] * m.channels;
  const int phases = m.stride[0] * m.stride[1] * m.stride[2];
  for (int t0 = rows0.begin; t0 < rows0.end; ++t0)
    for (int t1 = rows1.begin; t1 < rows1.end; ++t1) {
      const bool read = t0 < rows0.read_end && t1 < rows1.read_end;
      const int a0 = t0 + m.pad[0] - m.stride[0] * q0, a1 = t1 + m.pad[1] - m.stride[1] * q1;
      const int phase = (a0 * m.stride[1] + a1) * m.stride[2] + a2;
      T* to = plain + ((int64_t(n) * m.source[0] + t0) * m.source[1] + t1) * row_length + c;
      for (int l = lane;; l += per_pass) {
        const int t2 = m.stride[2] * l + a2 - m.pad[2];
        if (t2 >= m.source[2]) break;
        if (t2 < 0) continue;
        float sum = 0;
        for (int u = 0; read && u < m.unfold; ++u)
          if (l - u >= 0 && l - u < m.wide[2])
            sum += float(
                staged_wide[(l - u) * m.wide_channels + (u * phases + phase) * m.channels + c]);
        to[t2 * m.channels] = T(sum);
      }
    }
}

bool fits_32_bits(int64_t batch, const int64_t extents[3], int64_t channels) {
  return batch * extents[0] * extents[1] * extents[2] * channels <=
         std::numeric_limits<int32_t>::max();
}

void check_16bit(const DeviceTensor& t, const char* what) {
  if (t.dtype != DType::bf16 && t.dtype != DType::f16)
    throw Error("space_to_depth",
                cat(what, " is ", dtype_name(t.dtype), "; space-to-depth takes bf16 and f16"));
}

int64_t plain_elements(const PhaseMap& m) {
  return int64_t(m.batch) * m.source[0] * m.source[1] * m.source[2] * m.channels;
}

// Wide rows (n, q0, q1): the row kernels' blocks.
int64_t rows_of(const PhaseMap& m) {
  return int64_t(m.batch) * m.wide[0] * m.wide[1];
}

int64_t wide_elements(const PhaseMap& m) {
  return int64_t(m.batch) * m.wide[0] * m.wide[1] * m.wide[2] * m.wide_channels;
}

}  // namespace

std::optional<SpaceToDepth> space_to_depth_lowering(const ConvGeometry& g) {
  if (g.groups != 1) return std::nullopt;
  SpaceToDepth s;
  ConvGeometry& p = s.problem;
  p.spatial_rank = g.spatial_rank;
  p.batch = g.batch;
  p.out_channels = g.out_channels;
  int64_t taps[3], phases = 1;
  for (int d = 0; d < 3; ++d) {
    if (g.dilation[d] != 1 || g.pad_lo[d] < 0) return std::nullopt;
    taps[d] = ceil_div(g.filter[d], g.stride[d]);
    phases *= g.stride[d];
    p.out[d] = g.out[d];
    p.filter[d] = d == 2 ? 1 : taps[d];
    p.in[d] = p.out[d] + p.filter[d] - 1;
  }
  const int64_t used = taps[2] * phases * g.in_channels;
  p.in_channels = (used + 7) / 8 * 8;
  if (p.in_channels < 32) return std::nullopt;
  const int64_t filter_wide[3] = {p.filter[0], p.filter[1], 1};
  if (!fits_32_bits(g.batch, g.in, g.in_channels) || !fits_32_bits(g.batch, p.in, p.in_channels) ||
      !fits_32_bits(g.out_channels, filter_wide, p.in_channels))
    return std::nullopt;
  auto map = [&](int64_t batch, const int64_t source[3], const int64_t wide[3], bool padded) {
    PhaseMap m;
    m.batch = int(batch);
    m.channels = int(g.in_channels);
    m.wide_channels = int(p.in_channels);
    m.unfold = int(taps[2]);
    for (int d = 0; d < 3; ++d) {
      m.source[d] = int(source[d]), m.wide[d] = int(wide[d]);
      m.stride[d] = int(g.stride[d]), m.pad[d] = padded ? int(g.pad_lo[d]) : 0;
    }
    return m;
  };
  s.activations = map(g.batch, g.in, p.in, true);
  s.filter = map(g.out_channels, g.filter, filter_wide, false);
  return s;
}

void record_space_to_depth(Context& ctx, const PhaseMap& m, const DeviceTensor& plain,
                           const DeviceTensor& wide) {
  check_16bit(plain, "the plain tensor");
  FUSEBOX_CHECK(plain.dtype == wide.dtype && plain.numel() == plain_elements(m) &&
                    wide.numel() == wide_elements(m),
                "space_to_depth", "plain / wide tensors do not match the map");
  const int64_t row_bytes = int64_t(m.stride[0]) * m.stride[1] * m.source[2] * m.channels * 2;
  const int position_vectors = m.wide_channels / 8;
  if (row_bytes <= kMaxRowBytes && position_vectors <= kThreads) {
    const int threads = position_vectors * (kThreads / position_vectors);
    ctx.encoder.launch(&space_to_depth_rows_kernel, dim3(rows_of(m)), dim3(threads),
                       size_t(row_bytes), {plain.range()}, {wide.range()}, m,
                       static_cast<const uint16_t*>(plain.data()),
                       static_cast<uint16_t*>(wide.data()));
    return;
  }
  const int64_t vectors = wide_elements(m) / 8;
  ctx.encoder.launch(&space_to_depth_kernel, dim3(launch_blocks(vectors, kThreads)), dim3(kThreads),
                     0, {plain.range()}, {wide.range()}, m,
                     static_cast<const uint16_t*>(plain.data()),
                     static_cast<uint16_t*>(wide.data()));
}

void record_depth_to_space(Context& ctx, const PhaseMap& m, const DeviceTensor& wide,
                           const DeviceTensor& plain) {
  check_16bit(plain, "the plain tensor");
  FUSEBOX_CHECK(plain.dtype == wide.dtype && plain.numel() == plain_elements(m) &&
                    wide.numel() == wide_elements(m),
                "depth_to_space", "plain / wide tensors do not match the map");
  const int64_t wide_row_bytes = int64_t(m.wide[2]) * m.wide_channels * 2;
  const int lanes = m.channels * m.stride[2];  // one (a2, c) per thread of a lattice point
  if (wide_row_bytes <= kMaxRowBytes && lanes <= kThreads) {
    const dim3 grid(unsigned(rows_of(m))), block(lanes * (kThreads / lanes));
    if (plain.dtype == DType::bf16)
      ctx.encoder.launch(&depth_to_space_rows_kernel<__nv_bfloat16>, grid, block,
                         size_t(wide_row_bytes), {wide.range()}, {plain.range()}, m,
                         wide.as<const __nv_bfloat16>(), plain.as<__nv_bfloat16>());
    else
      ctx.encoder.launch(&depth_to_space_rows_kernel<__half>, grid, block, size_t(wide_row_bytes),
                         {wide.range()}, {plain.range()}, m, wide.as<const __half>(),
                         plain.as<__half>());
    return;
  }
  const int64_t pixels = plain_elements(m) / m.channels;
  const dim3 grid(launch_blocks(pixels, kThreads)), block(kThreads);
  if (plain.dtype == DType::bf16)
    ctx.encoder.launch(&depth_to_space_kernel<__nv_bfloat16>, grid, block, 0, {wide.range()},
                       {plain.range()}, m, wide.as<const __nv_bfloat16>(),
                       plain.as<__nv_bfloat16>());
  else
    ctx.encoder.launch(&depth_to_space_kernel<__half>, grid, block, 0, {wide.range()},
                       {plain.range()}, m, wide.as<const __half>(), plain.as<__half>());
}

}  // namespace fusebox::cuda
