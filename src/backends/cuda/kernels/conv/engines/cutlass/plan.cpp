// Planning of the CUTLASS Hopper convolutions (plan.h): refusals, epilogue mapping, tiles and
// weight-gradient chunks.
#include "backends/cuda/kernels/conv/engines/cutlass/plan.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "fusebox/core/error.h"

namespace fusebox::cuda::cutlass_conv {

const char* tile_name(Tile t) {
  switch (t) {
    case Tile::t128x128:
      return "cutlass128x128";
    case Tile::t128x64:
      return "cutlass128x64";
    case Tile::t64x128:
      return "cutlass64x128";
  }
  return "?";
}
std::optional<Tile> parse_tile(const std::string& name) {
  for (Tile t : {Tile::t128x128, Tile::t128x64, Tile::t64x128})
    if (name == tile_name(t)) return t;
  return std::nullopt;
}
bool tile_available(ConvOp op, Tile t) {
  if (op == ConvOp::wgrad) return t != Tile::t128x64;
  return t != Tile::t64x128;
}

namespace {

constexpr int64_t kGemmWgradRows = 32768;

int64_t cdiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The clamp bounds that compute an activation, or nullopt when it is not a clamp.
std::optional<std::pair<float, float>> clamp_of(const ActivationFn& a) {
  const float lowest = std::numeric_limits<float>::lowest(),
              max = std::numeric_limits<float>::max();
  switch (a.kind) {
    case ActivationFn::none:
      return std::pair{lowest, max};
    case ActivationFn::relu:
      return std::pair{0.0f, max};
    case ActivationFn::clip:
      return std::pair{float(a.min), float(a.max)};
    default:
      return std::nullopt;
  }
}

// The GEMM extents M, N of the op (plan.h's table); K is not needed here.
std::pair<int64_t, int64_t> gemm_mn(ConvOp op, const ConvGeometry& g) {
  switch (op) {
    case ConvOp::fprop:
      return {g.batch * g.out_size(), g.out_channels};
    case ConvOp::dgrad:
      return {g.batch * g.in_size(), g.in_channels};
    case ConvOp::wgrad:
      return {g.out_channels, g.in_channels * g.filter_size()};
  }
  return {0, 0};
}

// A 3-D im2col descriptor's limits on a unit-stride problem (dgrad) or any (fprop, wgrad):
// pads in [0, 16], corners in [-16, 15], filter offsets (R - 1) * dilation below 31 (16 bits
// shared by three dims).
std::optional<std::string> im2col_refusal(ConvOp op, const ConvGeometry& g) {
  for (int d = 0; d < 3; ++d) {
    const int64_t reach = (g.filter[d] - 1) * g.dilation[d];
    if (g.pad_lo[d] < 0 || g.pad_hi[d] < 0 || g.pad_lo[d] > 16 || g.pad_hi[d] > 16)
      return cat("padding ", g.pad_lo[d], "/", g.pad_hi[d], " outside TMA im2col's [0, 16]");
    if (reach >= 31) return cat("filter reach (R-1)*dilation = ", reach, " past TMA im2col's 30");
    int64_t lower = -g.pad_lo[d], upper = g.pad_hi[d] - reach;
    if (op == ConvOp::dgrad) {
      lower = g.pad_lo[d] - reach;
      upper = g.pad_lo[d] - reach + g.in[d] - g.out[d];
    }
    if (lower < -16 || lower > 15 || upper < -16 || upper > 15)
      return cat("im2col corners ", lower, "/", upper, " outside TMA's [-16, 15]");
  }
  return std::nullopt;
}

int64_t gcd(int64_t a, int64_t b) {
  while (b != 0) a = std::exchange(b, a % b);
  return a;
}

// One dim's phases (see plan.h): for phase ph, its extent and its taps.
struct DimPhase {
  int64_t phase = 0, extent = 0, first = 0, step = 1, taps = 0, pad_lo = 0, pad_hi = 0,
          dilation = 1;
};

std::vector<DimPhase> dim_phases(const ConvGeometry& g, int d) {
  const int64_t s = g.stride[d], dil = g.dilation[d];
  std::vector<DimPhase> out;
  for (int64_t ph = 0; ph < s; ++ph) {
    DimPhase p;
    p.phase = ph;
    p.extent = ph < g.in[d] ? cdiv(g.in[d] - ph, s) : 0;
    p.step = s / gcd(s, dil);
    p.dilation = dil / gcd(s, dil);
    p.first = -1;
    for (int64_t r = 0; r < g.filter[d] && p.first < 0; ++r)
      if (floor_div(ph + g.pad_lo[d] - r * dil, s) * s == ph + g.pad_lo[d] - r * dil) p.first = r;
    if (p.first >= 0) {
      p.taps = cdiv(g.filter[d] - p.first, p.step);
      p.pad_lo = floor_div(ph + g.pad_lo[d] - p.first * dil, s);
      // The unit-stride problem must read exactly dy's extent O.
      p.pad_hi = g.out[d] - p.extent - p.pad_lo + p.dilation * (p.taps - 1);
    } else {
      p.first = 0;
    }
    out.push_back(p);
  }
  return out;
}

}  // namespace

std::optional<std::string> dgrad_phases(const ConvGeometry& g, std::vector<DgradPhase>* out) {
  out->clear();
  const std::vector<DimPhase> dims[3] = {dim_phases(g, 0), dim_phases(g, 1), dim_phases(g, 2)};
  for (const DimPhase& a : dims[0])
    for (const DimPhase& b : dims[1])
      for (const DimPhase& c : dims[2]) {
        DgradPhase p;
        const DimPhase* per_dim[3] = {&a, &b, &c};
        for (int d = 0; d < 3; ++d) {
          const DimPhase& q = *per_dim[d];
          p.phase[d] = q.phase, p.extent[d] = q.extent, p.first_tap[d] = q.first;
          p.step[d] = q.step, p.taps[d] = q.taps, p.pad_lo[d] = q.pad_lo, p.pad_hi[d] = q.pad_hi;
          p.dilation[d] = q.dilation;
        }
        if (!p.empty())
          for (int d = 0; d < 3; ++d)
            if (p.pad_lo[d] < 0 || p.pad_hi[d] < 0)
              return cat("a stride phase with negative padding ", p.pad_lo[d], "/", p.pad_hi[d],
                         " (dim ", d, ")");
        out->push_back(p);
      }
  return std::nullopt;
}

ConvGeometry phase_geometry(const ConvGeometry& g, const DgradPhase& p) {
  ConvGeometry q = g;
  for (int d = 0; d < 3; ++d) {
    q.in[d] = p.extent[d];
    q.filter[d] = p.taps[d];
    q.stride[d] = 1;
    q.dilation[d] = p.dilation[d];
    q.pad_lo[d] = p.pad_lo[d];
    q.pad_hi[d] = p.pad_hi[d];
  }
  return q;
}

std::optional<std::string> map_epilogue(bool bias, const ActivationFn& activation, bool residual,
                                        const ActivationFn& residual_activation, Epilogue* out) {
  Epilogue e;
  e.bias = bias;
  e.residual = residual;
  // One clamp at the end: with a residual, the activation before the add must be none.
  if (residual && activation.kind != ActivationFn::none)
    return std::string(
        "an activation before the residual add (CUTLASS's epilogue has one, after it)");
  const ActivationFn& last = residual ? residual_activation : activation;
  const auto bounds = clamp_of(last);
  if (!bounds) return std::string("an activation other than relu or clip");
  e.lower = bounds->first;
  e.upper = bounds->second;
  *out = e;
  return std::nullopt;
}

std::optional<std::string> cannot_implement(ConvOp op, const ConvGeometry& g, DType dtype,
                                            const Facts& facts) {
  if (facts.compute_capability != 90)
    return cat("the CUTLASS kernels are sm_90a code; the device is compute capability ",
               facts.compute_capability / 10, ".", facts.compute_capability % 10);
  if (dtype != DType::bf16 && dtype != DType::f16)
    return cat("dtype ", dtype_name(dtype), " (the CUTLASS kernels take bf16 and f16)");
  if (g.groups != 1) return cat(g.groups, " groups (the CUTLASS collective takes one)");
  if (g.in_channels % 8 != 0 || g.out_channels % 8 != 0)
    return cat("channels C=", g.in_channels, " K=", g.out_channels,
               " not multiples of 8 (TMA moves 16-byte rows)");
  if (!facts.aligned) return std::string("an operand address not a multiple of 16 bytes");
  if (op == ConvOp::dgrad && g.stride[0] * g.stride[1] * g.stride[2] > 1) {
    std::vector<DgradPhase> phases;
    if (auto why = dgrad_phases(g, &phases)) return why;
    for (const DgradPhase& p : phases)
      if (!p.empty())
        if (auto why = im2col_refusal(op, phase_geometry(g, p))) return cat("stride phase: ", *why);
  } else if (auto why = im2col_refusal(op, g)) {
    return why;
  }
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  const int64_t x = g.batch * g.in_size() * g.in_channels;
  const int64_t y = g.batch * g.out_size() * g.out_channels;
  const int64_t w = g.out_channels * g.filter_size() * g.in_channels;
  if (x > kInt32Max || y > kInt32Max || w > kInt32Max)
    return std::string("a tensor past 2^31 elements");
  return std::nullopt;
}

bool is_pointwise(const ConvGeometry& g) {
  for (int d = 0; d < 3; ++d)
    if (g.filter[d] != 1 || g.stride[d] != 1 || g.pad_lo[d] != 0 || g.pad_hi[d] != 0) return false;
  return true;
}

std::optional<Tile> direct_wgrad_tile(const ConvGeometry& g, int sm_count,
                                      std::optional<Tile> forced) {
  if (!is_pointwise(g)) return std::nullopt;
  const auto [m, n] = gemm_mn(ConvOp::wgrad, g);
  for (Tile t : {Tile::t128x128, Tile::t64x128})
    if ((!forced || *forced == t) && 4 * cdiv(m, tile_m(t)) * cdiv(n, tile_n(t)) >= 3 * sm_count)
      return t;
  return std::nullopt;
}

std::string Plan::describe() const {
  std::string s =
      cat(tile_name(tile), "x64 sm90 ", dtype_name(dtype), gemm ? " gemm" : " tma-im2col");
  if (op == ConvOp::wgrad && partial_bytes == 0) s += ", dw written directly";
  if (op == ConvOp::wgrad && partial_bytes > 0)
    s += cat(", ", chunks, chunks == 1 ? " chunk" : " chunks");
  if (!phases.empty()) s += cat(", ", phases.size(), " phases");
  return s;
}

Plan make_plan(ConvOp op, const ConvGeometry& g, DType dtype, const Epilogue& epilogue,
               int sm_count, std::optional<Tile> tile) {
  Plan p;
  p.op = op;
  p.dtype = dtype;
  p.epilogue = epilogue;
  const auto [m, n] = gemm_mn(op, g);
  const int64_t sms = std::max(sm_count, 1);
  // A pointwise wgrad on the GEMM only when it has many pixels (layers 1-2 of ResNet-50 and
  // an im2col'd stem: 0.36-0.54x -> 0.9-1.05x cuDNN); with few (layers 3-4, 3136-12544
  // pixels) the conv kernel's whole-image chunks were faster on the H100 (0.56-0.91x against
  // the GEMM's 0.42-0.61x, bench/results/2026-11-25_h100_session13/, chunked through f32
  // slices) -- unless its output tiles alone fill the GPU: then one unsplit GEMM writes dw
  // (direct_wgrad_tile; layer 4's 0.45-0.55x on the image chunks).
  const std::optional<Tile> direct =
      op == ConvOp::wgrad ? direct_wgrad_tile(g, int(sms), tile) : std::nullopt;
  p.gemm = is_pointwise(g) &&
           (op != ConvOp::wgrad || direct || g.batch * g.out_size() >= kGemmWgradRows);
  if (direct) {
    p.tile = *direct;
  } else if (tile && tile_available(op, *tile)) {
    p.tile = *tile;
  } else if (p.gemm && op != ConvOp::wgrad) {
    // Persistent: waves matter little; the narrow tile when N is narrow.
    p.tile = n <= 64 ? Tile::t128x64 : Tile::t128x128;
  } else if (op == ConvOp::wgrad && p.gemm) {
    // The pixel chunks below fill the GPU, so the wide tile (fewer f32 slices per output
    // element); the narrow one only for 64 filters. With a quarter wave of chunks 128x128
    // beat 64x128 by 1.1-1.4x on every ResNet-50 GEMM wgrad with more than 64 filters, 64
    // channels included (H200, bench/results/2026-11-29_h200_session25_dense/).
    p.tile = m <= 64 ? Tile::t64x128 : Tile::t128x128;
  } else if (op == ConvOp::wgrad) {
    p.tile = m <= 64 || n <= 64 ? Tile::t64x128 : Tile::t128x128;
  } else {
    // Measured on the H100 (bench/results/2026-11-25_h100_session12/): 128x128 wins
    // whenever N fills it, by up to 1.5x; 128x64 only where N <= 64 would leave half of
    // the wide tile idle.
    p.tile = n <= 64 ? Tile::t128x64 : Tile::t128x128;
  }
  if (op == ConvOp::dgrad && g.stride[0] * g.stride[1] * g.stride[2] > 1) {
    dgrad_phases(g, &p.phases);  // cannot_implement has checked them
    for (const DgradPhase& ph : p.phases) p.zero_fill |= ph.empty();
  }
  if (direct) {
    p.chunks = 1;
    p.chunk_rows = g.batch * g.out_size();
  } else if (op == ConvOp::wgrad && p.gemm) {
    // About a quarter of the SMs' worth of output tiles over the chunks, each chunk at least
    // 8 K steps, and the f32 slices' bytes no more than the operands' (a weight gradient of
    // few rows and many channels: layer 4's 2048x512 at 7x7 would write more sums than it
    // reads). Fewer, longer chunks won everywhere measured: every chunk's tile writes a 32-64
    // KB f32 slice that is read back and summed, and two tiles per SM (the old rule) made that
    // traffic the cost (ResNet-50's 1x1 wgrads 1.3-1.8x faster with a quarter, H200,
    // bench/results/2026-11-29_h200_session24_phase_dgrad/).
    const int64_t rows = g.batch * g.out_size();
    const int64_t ctas = cdiv(m, tile_m(p.tile)) * cdiv(n, tile_n(p.tile));
    const int64_t operand_bytes = rows * (m + n) * int64_t(dtype_size(dtype));
    int64_t chunks = cdiv(std::max<int64_t>(sms / 4, 1), ctas);
    chunks = std::min({chunks, std::max<int64_t>(1, operand_bytes / (m * n * 4)),
                       std::max<int64_t>(1, rows / 512)});
    p.chunk_rows = std::max<int64_t>(1, cdiv(cdiv(rows, chunks), 64) * 64);
    p.chunks = std::max<int64_t>(1, cdiv(rows, p.chunk_rows));
    p.partial_bytes = size_t(p.chunks) * size_t(m) * size_t(n) * sizeof(float);
  } else if (op == ConvOp::wgrad) {
    // Image chunks: a quarter wave of CTAs, as the GEMM path above, each chunk still reducing
    // at least 16 K steps. A wave's worth (the earlier rule) wrote and summed more f32 slices
    // than it gained: layer 3-4's 1x1 wgrads 1.2-1.3x faster with 2-3 chunks than 5-8, the
    // 3x3 ones of layers 2-3 1.1-1.2x with 4 and 1 than 13 and 4 (H200,
    // bench/results/2026-11-29_h200_session25_dense/).
    const int64_t ctas = cdiv(m, tile_m(p.tile)) * cdiv(n, tile_n(p.tile));
    const int64_t depth = g.batch * g.out_size();
    int64_t chunks = cdiv(std::max<int64_t>(sms / 4, 1), ctas);
    chunks = std::min({chunks, g.batch, std::max<int64_t>(1, depth / 1024), int64_t(64)});
    chunks = std::max<int64_t>(chunks, 1);
    p.chunk_images = cdiv(g.batch, chunks);
    p.chunks = cdiv(g.batch, p.chunk_images);
    p.partial_bytes = size_t(p.chunks) * size_t(m) * size_t(n) * sizeof(float);
  }
  return p;
}

}  // namespace fusebox::cuda::cutlass_conv
