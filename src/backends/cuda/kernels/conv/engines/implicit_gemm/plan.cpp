// Planning of the implicit-GEMM convolutions (plan.h): refusals, stride phases, tiles and
// splits, kernel parameters.
#include "backends/cuda/kernels/conv/engines/implicit_gemm/plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "fusebox/core/error.h"

namespace fusebox::cuda::igemm {

const char* tile_name(TileShape t) {
  switch (t) {
    case TileShape::t128x128:
      return "128x128";
    case TileShape::t128x64:
      return "128x64";
    case TileShape::t64x128:
      return "64x128";
    case TileShape::wg128x128:
      return "wg128x128";
    case TileShape::wg128x64:
      return "wg128x64";
    default:
      return "64x64";
  }
}
bool is_wgmma(TileShape t) {
  return t == TileShape::wg128x128 || t == TileShape::wg128x64;
}
int tile_k(TileShape t) {
  return is_wgmma(t) ? 64 : kTileK;
}
std::optional<TileShape> parse_tile(const std::string& name) {
  for (TileShape t : {TileShape::t128x128, TileShape::t128x64, TileShape::t64x128,
                      TileShape::t64x64, TileShape::wg128x128, TileShape::wg128x64})
    if (name == tile_name(t)) return t;
  return std::nullopt;
}
int tile_m(TileShape t) {
  return t == TileShape::t64x128 || t == TileShape::t64x64 ? 64 : 128;
}
int tile_n(TileShape t) {
  return t == TileShape::t128x128 || t == TileShape::t64x128 || t == TileShape::wg128x128 ? 128
                                                                                          : 64;
}

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

int64_t cdiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The dgrad stride phases along one dim: for phase ph, the taps r with (ph + pad - r * dil)
// divisible by the stride, each with q = (ph + pad - r * dil) / stride (exact, any sign).
struct DimPhase {
  int64_t extent = 0;                             // J: positions ph, ph + s, ... below D
  std::vector<std::pair<int64_t, int64_t>> taps;  // (r, q)
};

std::vector<DimPhase> dim_phases(const ConvGeometry& g, int d) {
  std::vector<DimPhase> out(size_t(g.stride[d]));
  for (int64_t ph = 0; ph < g.stride[d]; ++ph) {
    DimPhase& p = out[size_t(ph)];
    p.extent = ph < g.in[d] ? cdiv(g.in[d] - ph, g.stride[d]) : 0;
    for (int64_t r = 0; r < g.filter[d]; ++r) {
      const int64_t t = ph + g.pad_lo[d] - r * g.dilation[d];
      if (floor_div(t, g.stride[d]) * g.stride[d] == t) p.taps.push_back({r, t / g.stride[d]});
    }
  }
  return out;
}

int64_t phase_count(const ConvGeometry& g) {
  return g.stride[0] * g.stride[1] * g.stride[2];
}

// Elements a vector moves: 16 bytes.
int vector_width(DType t) {
  return 16 / int(dtype_size(t));
}

}  // namespace

std::optional<std::string> cannot_implement(ConvOp op, const ConvGeometry& g, DType dtype) {
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16)
    return cat("dtype ", dtype_name(dtype), " (the implicit GEMM takes f32, f16 and bf16)");
  const int64_t x = g.batch * g.in_channels * g.in_size();
  const int64_t y = g.batch * g.out_channels * g.out_size();
  const int64_t w = g.out_channels * g.in_per_group() * g.filter_size();
  const int64_t largest = std::max({x, y, w, g.batch * g.out_size() * g.groups,
                                    g.filter_size() * g.in_per_group(), g.batch * g.in_size()});
  if (largest > kInt32Max)
    return cat("a tensor or GEMM extent of ", largest,
               " elements (the implicit GEMM indexes "
               "in 32 bits)");
  const int64_t z = g.groups * (op == ConvOp::dgrad ? phase_count(g) : 1);
  if (z > 65535) return cat(z, " groups x stride phases (a grid of at most 65535)");
  if (op == ConvOp::dgrad) {
    if (phase_count(g) > kMaxPhases)
      return cat(phase_count(g), " stride phases (dgrad takes at most ", kMaxPhases, ")");
    if (g.filter_size() > kMaxTaps)
      return cat(g.filter_size(), " filter taps (dgrad takes at most ", kMaxTaps, ")");
  }
  return std::nullopt;
}

bool tile_available(ConvOp op, DType dtype, Math math, bool vector, bool wgmma, TileShape t) {
  if (is_wgmma(t))
    return wgmma && op != ConvOp::wgrad && dtype != DType::f32 && math == Math::tensor_core &&
           vector;
  if (math == Math::exact || !vector) return t == TileShape::t64x64;
  if (dtype == DType::f32) return t != TileShape::t128x128;  // 128 KiB of stages: 1 CTA/SM
  return true;
}

std::string Plan::describe() const {
  const bool tf32 = dtype == DType::f32 && math == Math::tensor_core;
  std::string s = cat("igemm ", dtype_name(dtype), " ",
                      math == Math::exact ? "exact"
                      : tf32              ? "tf32"
                                          : "tensor-core",
                      " ", tile_name(tile), "x", tile_k(tile), vector ? " vec" : " scalar");
  if (params.phases > 1) s += cat(", ", params.phases, " phases");
  if (params.splits > 1) s += cat(", ", params.splits, " splits");
  return s;
}

namespace {

// m, n, k: the GEMM of one group (dgrad: of its largest phase); m_total: all of one group's rows
// (dgrad: every phase's).
TileShape choose_tile(ConvOp op, int64_t m, int64_t m_total, int64_t n, int64_t k,
                      int64_t ctas_per_tile_grid, DType dtype, Math math, bool vector, bool wgmma,
                      int sm_count) {
  auto available = [&](TileShape t) { return tile_available(op, dtype, math, vector, wgmma, t); };
  // Rules fitted to the H100 runs of bench_conv --own-tiles over ResNet-50's shapes
  // (bench/results/2026-11-25_h100_issue14/), where they pick the fastest tile or one within
  // 3% of it: the wgmma tiles beat every mma.sync tile; 128x128 wins once K is long enough for
  // its better reuse to pay for one CTA per SM (no overlap of one CTA's prologue and epilogue
  // with another's main loop); wgrad (mma.sync) runs best on 128x64 when M = K/g fills it.
  if (available(TileShape::wg128x64)) {
    const bool long_k =
        (k >= 1152 && m_total <= 50176) || (k >= 1024 && n >= 512 && m_total <= 12544);
    return n > 64 && long_k ? TileShape::wg128x128 : TileShape::wg128x64;
  }
  if (op == ConvOp::wgrad && m >= 128 && available(TileShape::t128x64)) return TileShape::t128x64;
  // Otherwise the tile with the smallest estimated time: full waves of CTAs, each costing its
  // area times an efficiency factor (smaller tiles reread more per multiply-add), CTAs per SM
  // by their registers and shared memory.
  struct Candidate {
    TileShape t;
    double cost;  // per output element of a full tile, relative
    int per_sm;
  };
  const Candidate all[] = {{TileShape::t128x128, 1.0, 2},
                           {TileShape::t128x64, 1.2, 3},
                           {TileShape::t64x128, 1.2, 3},
                           {TileShape::t64x64, 1.5, 4}};
  TileShape best = TileShape::t64x64;
  double best_score = std::numeric_limits<double>::infinity();
  for (const Candidate& c : all) {
    if (!available(c.t)) continue;
    const int64_t ctas = cdiv(m, tile_m(c.t)) * cdiv(n, tile_n(c.t)) * ctas_per_tile_grid;
    const double waves = std::ceil(double(ctas) / double(std::max(1, sm_count) * c.per_sm));
    const double score = waves * tile_m(c.t) * tile_n(c.t) * c.cost / c.per_sm;
    if (score < best_score) best = c.t, best_score = score;
  }
  return best;
}

}  // namespace

Plan make_plan(ConvOp op, const ConvGeometry& g, DType dtype, const PlanOptions& options,
               int sm_count) {
  if (auto why = cannot_implement(op, g, dtype)) throw Error("implicit GEMM", *why);
  Plan plan;
  plan.op = op;
  plan.dtype = dtype;
  plan.math = dtype == DType::f32 && !options.allow_tf32 ? Math::exact : Math::tensor_core;
  const int vw = vector_width(dtype);
  plan.vector = options.aligned && g.in_per_group() % vw == 0 && g.out_per_group() % vw == 0;

  Params& p = plan.params;
  p.batch = int32_t(g.batch);
  p.in_channels = int32_t(g.in_channels);
  p.out_channels = int32_t(g.out_channels);
  p.groups = int32_t(g.groups);
  p.in_per_group = int32_t(g.in_per_group());
  p.out_per_group = int32_t(g.out_per_group());
  for (int d = 0; d < 3; ++d) {
    p.in[d] = int32_t(g.in[d]);
    p.out[d] = int32_t(g.out[d]);
    p.filter[d] = int32_t(g.filter[d]);
    p.stride[d] = int32_t(g.stride[d]);
    p.pad[d] = int32_t(g.pad_lo[d]);
    p.dilation[d] = int32_t(g.dilation[d]);
  }
  p.taps = int32_t(g.filter_size());
  p.div_in_per_group = FastDivmod(p.in_per_group);
  p.div_out_per_group = FastDivmod(p.out_per_group);
  p.div_filter1 = FastDivmod(p.filter[1]);
  p.div_filter2 = FastDivmod(p.filter[2]);
  p.div_out1 = FastDivmod(std::max(1, p.out[1]));
  p.div_out2 = FastDivmod(std::max(1, p.out[2]));

  int64_t z = g.groups;  // grid.z
  switch (op) {
    case ConvOp::fprop:
      p.m = int32_t(g.batch * g.out_size());
      p.n = p.out_per_group;
      p.k = int32_t(g.filter_size() * g.in_per_group());
      break;
    case ConvOp::wgrad:
      p.m = p.out_per_group;
      p.n = int32_t(g.filter_size() * g.in_per_group());
      p.k = int32_t(g.batch * g.out_size());
      break;
    case ConvOp::dgrad: {
      // Phases: the cartesian product of each dim's; a phase's taps the product of its dims'.
      std::vector<DimPhase> dims[3] = {dim_phases(g, 0), dim_phases(g, 1), dim_phases(g, 2)};
      p.n = p.in_per_group;
      p.phases = 0;
      int32_t taps = 0;
      for (const DimPhase& a : dims[0])
        for (const DimPhase& b : dims[1])
          for (const DimPhase& c : dims[2]) {
            Phase& ph = p.phase[p.phases];
            const DimPhase* parts[3] = {&a, &b, &c};
            for (int d = 0; d < 3; ++d) {
              ph.phase[d] = int32_t(parts[d] - dims[d].data());
              ph.extent[d] = int32_t(parts[d]->extent);
            }
            ph.div_extent1 = FastDivmod(std::max(1, ph.extent[1]));
            ph.div_extent2 = FastDivmod(std::max(1, ph.extent[2]));
            ph.m = int32_t(g.batch * ph.extent[0] * ph.extent[1] * ph.extent[2]);
            ph.first_tap = taps;
            for (const auto& [r0, q0] : a.taps)
              for (const auto& [r1, q1] : b.taps)
                for (const auto& [r2, q2] : c.taps) {
                  Tap& t = p.tap[taps++];
                  t.r = int32_t((r0 * g.filter[1] + r1) * g.filter[2] + r2);
                  t.q[0] = int32_t(q0), t.q[1] = int32_t(q1), t.q[2] = int32_t(q2);
                }
            ph.taps = taps - ph.first_tap;
            ph.k = ph.taps * p.out_per_group;
            p.m = std::max(p.m, ph.m);
            p.k = std::max(p.k, ph.k);
            ++p.phases;
          }
      z = g.groups * p.phases;
      break;
    }
  }

  const bool forced = options.tile && tile_available(op, dtype, plan.math, plan.vector,
                                                     options.wgmma, *options.tile);
  plan.tile = forced ? *options.tile
                     : choose_tile(op, p.m, op == ConvOp::dgrad ? g.batch * g.in_size() : p.m, p.n,
                                   p.k, z, dtype, plan.math, plan.vector, options.wgmma, sm_count);
  p.tiles_m = int32_t(cdiv(std::max(1, p.m), tile_m(plan.tile)));
  p.tiles_n = int32_t(cdiv(std::max(1, p.n), tile_n(plan.tile)));

  if (op == ConvOp::wgrad) {
    // Split K (the N*O positions) until the CTAs fill about two waves, each split at least
    // 8 K tiles; the splits' f32 partial sums are added in order by a second kernel
    // (deterministic).
    const int64_t k_tiles = cdiv(std::max(1, p.k), kTileK);
    const int64_t tiles = int64_t(p.tiles_m) * p.tiles_n * g.groups;
    int64_t splits = options.splits > 0
                         ? options.splits
                         : std::min(cdiv(2 * int64_t(std::max(1, sm_count)) * 2, tiles),
                                    std::max<int64_t>(1, k_tiles / 8));
    splits = std::clamp<int64_t>(splits, 1, std::min<int64_t>(k_tiles, 65535));
    p.k_tiles_per_split = int32_t(cdiv(k_tiles, splits));
    p.splits = int32_t(cdiv(k_tiles, p.k_tiles_per_split));
    p.partial_stride = int64_t(g.out_channels) * p.n;
    if (p.splits > 1)
      plan.partial_bytes = size_t(p.splits) * size_t(g.out_channels) * size_t(p.n) * sizeof(float);
  } else {
    p.k_tiles_per_split = int32_t(cdiv(std::max(1, p.k), kTileK));
  }
  plan.grid[0] = uint32_t(int64_t(p.tiles_m) * p.tiles_n);
  plan.grid[1] = uint32_t(p.splits);
  plan.grid[2] = uint32_t(z);
  return plan;
}

}  // namespace fusebox::cuda::igemm
