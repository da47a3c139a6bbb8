// Space-to-depth and its fold (space_to_depth.h).
//
// space_to_depth: one thread per 8 wide channels of a position (one 16-byte store), each group
// of C channels read from one plain position; moves bits only, so one kernel serves bf16
// and f16 (as uint16_t). The plain tensor is a fraction of the wide one (the stem: 19 MB
// against 79 MB), so its scattered 2-byte reads hit L2; the writes are coalesced.
// depth_to_space: one thread per plain position, each of its channels the sum of the wide
// elements that hold it (R'2 at most, one for the filter).
// Index math in 32 bits with the divisions hoisted out of the per-channel loops: these are a
// few integer divisions per element of a bandwidth-bound copy, which otherwise dominate it.
#include "backends/cuda/kernels/conv/space_to_depth.h"

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
    // Wide channel j = (group, c), group = (u, a0, a1, a2) in phase_source's order: each
    // group's C channels are one plain position's, found once per group. The first channel's
    // digits by division, the next ones by stepping.
    int c = first % m.channels, a[3], u = first / m.channels;
    for (int d = 2; d >= 0; --d) a[d] = u % m.stride[d], u /= m.stride[d];
    auto group_offset = [&] {  // the group's channel 0 in plain, or -1 outside
      int offset = n;
      for (int d = 0; d < 3; ++d) {
        const int t = m.stride[d] * (q[d] + (d == 2 ? u : 0)) + a[d] - m.pad[d];
        if (t < 0 || t >= m.source[d]) return -1;
        offset = offset * m.source[d] + t;
      }
      return offset * m.channels;
    };
    int offset = group_offset();
    alignas(16) uint16_t v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[e] = first + e < used && offset >= 0 ? plain[offset + c] : uint16_t(0);
      if (++c == m.channels) {
        c = 0;
        if (++a[2] == m.stride[2]) {
          a[2] = 0;
          if (++a[1] == m.stride[1]) {
            a[1] = 0;
            if (++a[0] == m.stride[0]) a[0] = 0, ++u;
          }
        }
        offset = group_offset();
      }
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
