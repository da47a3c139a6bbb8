// The three convolutions as index maps over one GEMM (mainloop.cuh): C[M, N] = A[M, K] B[K, N]
// per group (and per stride phase for dgrad), tensors dense channels-last (params.h).
//
//   |        | M                    | N              | K                      | A        | B | |
//   fprop  | N*O0*O1*O2  (n, o)   | K/g  (k)       | R*C/g  (r, c)          | x  K-maj | w  K-maj |
//   | dgrad  | N*J0*J1*J2  (n, j)   | C/g  (c)       | taps*K/g (tap, k)      | dy K-maj | w  N-maj
//   | | wgrad  | K/g  (k)             | R*C/g  (r, c)  | N*O0*O1*O2  (n, o)     | dy M-maj | x
//   N-maj |
//
// (the innermost coordinate last: it is the contiguous one in memory). "K-major": the
// operand's contiguous dimension is the GEMM's K, so a tile is stored [rows][K]; "M/N-major":
// it is the M (N) dimension, the tile stored [K][rows]. The main loop reads either with
// ldmatrix (transposing the second), so no operand is ever copied into another layout.
//
// Tap r of output position o reads input position o * stride - pad + r * dilation. dgrad
// splits dx into stride phases d = phase + stride * j: only the taps with
// (phase + pad - r * dilation) divisible by the stride reach a phase, each at o = j + q with q
// that quotient (the Tap table, plan.cpp), so no multiply is spent on a tap that misses.
//
// Each operand is described by two coordinates: Fixed, the one that stays the same for the
// whole K loop (a row of a K-major tile, a column of an M/N-major tile), computed once per
// thread, and Moving, the K coordinate, computed per tile. offset() combines them into an
// element offset, or -1 where the element is zero (padding, out of range). The channel runs of
// a vector (8 bf16 / 4 f32) never straddle a tap: plan.cpp asks C/g and K/g to be multiples of
// the vector width for the vector path. The maps are host-callable too: a CPU test runs the
// three GEMMs through them against the reference convolutions.
#pragma once

#include "backends/cuda/kernels/conv/engines/implicit_gemm/params.h"

namespace fusebox::cuda::igemm {

// What one CTA computes: its group, phase and split, and the extents of its GEMM.
struct Cta {
  int group = 0, split = 0;
  int m = 0, n = 0;
  int k_begin = 0, k_end = 0;
  const Phase* phase = nullptr;
};

FUSEBOX_HOST_DEVICE inline bool inside(int i, int extent) {
  return unsigned(i) < unsigned(extent);
}

// Element offset of an activation pixel (n, i0, i1, i2) channel c in a tensor [N, E0, E1, E2, C].
FUSEBOX_HOST_DEVICE inline int64_t pixel_offset(int64_t base, const int32_t (&extent)[3], int i0,
                                                int i1, int i2, int channels, int c) {
  return base + (int64_t(i0 * extent[1] + i1) * extent[2] + i2) * channels + c;
}

// ---- fprop: y[n, o, g*K/g + k] = sum over (r, c) of x[n, o*s - p + r*d, g*C/g + c] w[k', r, c] --

struct FpropX {  // A: [M = (n, o)] x [K = (r, c)]
  static constexpr bool kKMajor = true;
  struct Fixed {
    int64_t base;
    int i[3];
    bool valid;
  };
  struct Moving {
    int c, d[3];
    bool valid;
  };
  FUSEBOX_HOST_DEVICE static Fixed fixed(const Params& p, const Cta& cta, int m) {
    Fixed f;
    f.valid = m < cta.m;
    int o[3], rest = f.valid ? m : 0;
    rest = p.div_out2.divmod(rest, o[2]);
    rest = p.div_out1.divmod(rest, o[1]);
    const int n = rest / p.out[0];
    o[0] = rest - n * p.out[0];
    f.base = int64_t(n) * p.in[0] * p.in[1] * p.in[2] * p.in_channels +
             int64_t(cta.group) * p.in_per_group;
    for (int d = 0; d < 3; ++d) f.i[d] = o[d] * p.stride[d] - p.pad[d];
    return f;
  }
  FUSEBOX_HOST_DEVICE static Moving moving(const Params& p, const Cta& cta, int k) {
    Moving v;
    v.valid = k < cta.k_end;
    int tap = p.div_in_per_group.divmod(v.valid ? k : 0, v.c), r[3];
    tap = p.div_filter2.divmod(tap, r[2]);
    r[0] = p.div_filter1.divmod(tap, r[1]);
    for (int d = 0; d < 3; ++d) v.d[d] = r[d] * p.dilation[d];
    return v;
  }
  FUSEBOX_HOST_DEVICE static int64_t offset(const Params& p, const Fixed& f, const Moving& v) {
    const int i0 = f.i[0] + v.d[0], i1 = f.i[1] + v.d[1], i2 = f.i[2] + v.d[2];
    if (!(f.valid && v.valid && inside(i0, p.in[0]) && inside(i1, p.in[1]) && inside(i2, p.in[2])))
      return -1;
    return pixel_offset(f.base, p.in, i0, i1, i2, p.in_channels, v.c);
  }
};

struct FpropW {  // B: [N = k] x [K = (r, c)], the filter row of output channel g*K/g + k
  static constexpr bool kKMajor = true;
  struct Fixed {
    int64_t base;
    bool valid;
  };
  struct Moving {
    int k;
    bool valid;
  };
  FUSEBOX_HOST_DEVICE static Fixed fixed(const Params& p, const Cta& cta, int n) {
    return {(int64_t(cta.group) * p.out_per_group + n) * p.k, n < cta.n};
  }
  FUSEBOX_HOST_DEVICE static Moving moving(const Params&, const Cta& cta, int k) {
    return {k, k < cta.k_end};
  }
  FUSEBOX_HOST_DEVICE static int64_t offset(const Params&, const Fixed& f, const Moving& v) {
    return f.valid && v.valid ? f.base + v.k : -1;
  }
};

struct Fprop {
  using A = FpropX;
  using B = FpropW;
  static constexpr bool kBias = true;
  template <int BK>
  FUSEBOX_HOST_DEVICE static Cta cta(const Params& p, int /*split*/, int z) {
    Cta c;
    c.group = z;
    c.m = p.m;
    c.n = p.n;
    c.k_end = p.k;
    return c;
  }
  // y[m, g*K/g + n]: the pixel index m is y's row.
  FUSEBOX_HOST_DEVICE static int64_t row_offset(const Params& p, const Cta& cta, int m) {
    return m < cta.m ? int64_t(m) * p.out_channels + int64_t(cta.group) * p.out_per_group : -1;
  }
  FUSEBOX_HOST_DEVICE static int bias_base(const Params& p, const Cta& cta) {
    return cta.group * p.out_per_group;
  }
  FUSEBOX_HOST_DEVICE static const void* a_source(const Params& p) { return p.x; }
  FUSEBOX_HOST_DEVICE static const void* b_source(const Params& p) { return p.w; }
};

// ---- dgrad: dx[n, d, g*C/g + c] = sum over taps and k of dy[n, (d + p - r*dil)/s, k'] w[k', r, c]

struct DgradDy {  // A: [M = (n, j)] x [K = (tap, k)]
  static constexpr bool kKMajor = true;
  struct Fixed {
    int64_t base;
    int j[3];
    bool valid;
  };
  struct Moving {
    int k, q[3];
    bool valid;
  };
  FUSEBOX_HOST_DEVICE static Fixed fixed(const Params& p, const Cta& cta, int m) {
    Fixed f;
    f.valid = m < cta.m;
    int rest = f.valid ? m : 0;
    rest = cta.phase->div_extent2.divmod(rest, f.j[2]);
    rest = cta.phase->div_extent1.divmod(rest, f.j[1]);
    const int n = rest / cta.phase->extent[0];
    f.j[0] = rest - n * cta.phase->extent[0];
    f.base = int64_t(n) * p.out[0] * p.out[1] * p.out[2] * p.out_channels +
             int64_t(cta.group) * p.out_per_group;
    return f;
  }
  FUSEBOX_HOST_DEVICE static Moving moving(const Params& p, const Cta& cta, int k) {
    Moving v;
    v.valid = k < cta.k_end;
    const int t = p.div_out_per_group.divmod(v.valid ? k : 0, v.k);
    const Tap& tap = p.tap[cta.phase->first_tap + t];
    for (int d = 0; d < 3; ++d) v.q[d] = tap.q[d];
    return v;
  }
  FUSEBOX_HOST_DEVICE static int64_t offset(const Params& p, const Fixed& f, const Moving& v) {
    const int o0 = f.j[0] + v.q[0], o1 = f.j[1] + v.q[1], o2 = f.j[2] + v.q[2];
    if (!(f.valid && v.valid && inside(o0, p.out[0]) && inside(o1, p.out[1]) &&
          inside(o2, p.out[2])))
      return -1;
    return pixel_offset(f.base, p.out, o0, o1, o2, p.out_channels, v.k);
  }
};

struct DgradW {  // B: [K = (tap, k)] x [N = c]
  static constexpr bool kKMajor = false;
  struct Fixed {
    int c;
    bool valid;
  };
  struct Moving {
    int64_t base;
    bool valid;
  };
  FUSEBOX_HOST_DEVICE static Fixed fixed(const Params&, const Cta& cta, int n) {
    return {n, n < cta.n};
  }
  FUSEBOX_HOST_DEVICE static Moving moving(const Params& p, const Cta& cta, int k) {
    Moving v;
    v.valid = k < cta.k_end;
    int kk;
    const int t = p.div_out_per_group.divmod(v.valid ? k : 0, kk);
    const int r = p.tap[cta.phase->first_tap + t].r;
    v.base = ((int64_t(cta.group) * p.out_per_group + kk) * p.taps + r) * p.in_per_group;
    return v;
  }
  FUSEBOX_HOST_DEVICE static int64_t offset(const Params&, const Fixed& f, const Moving& v) {
    return f.valid && v.valid ? v.base + f.c : -1;
  }
};

// B from the filter transposed per group to [C/g][taps][K/g] (implicit_gemm.cpp makes the
// copy): K-major, so the Hopper kernel (mainloop_sm90.cuh) reads it as it reads fprop's.
struct DgradWT {  // B: [N = c] x [K = (tap, k)]
  static constexpr bool kKMajor = true;
  struct Fixed {
    int64_t base;
    bool valid;
  };
  struct Moving {
    int offset;
    bool valid;
  };
  FUSEBOX_HOST_DEVICE static Fixed fixed(const Params& p, const Cta& cta, int n) {
    return {(int64_t(cta.group) * p.in_per_group + n) * p.taps * p.out_per_group, n < cta.n};
  }
  FUSEBOX_HOST_DEVICE static Moving moving(const Params& p, const Cta& cta, int k) {
    Moving v;
    v.valid = k < cta.k_end;
    int kk;
    const int t = p.div_out_per_group.divmod(v.valid ? k : 0, kk);
    v.offset = p.tap[cta.phase->first_tap + t].r * p.out_per_group + kk;
    return v;
  }
  FUSEBOX_HOST_DEVICE static int64_t offset(const Params&, const Fixed& f, const Moving& v) {
    return f.valid && v.valid ? f.base + v.offset : -1;
  }
};

template <class FilterOperand>
struct DgradWith {
  using A = DgradDy;
  using B = FilterOperand;
  static constexpr bool kBias = true;
  template <int BK>
  FUSEBOX_HOST_DEVICE static Cta cta(const Params& p, int /*split*/, int z) {
    Cta c;
    c.group = z / p.phases;
    c.phase = &p.phase[z % p.phases];
    c.m = c.phase->m;
    c.n = p.n;
    c.k_end = c.phase->k;
    return c;
  }
  // dx[n, phase + stride * j, g*C/g + c].
  FUSEBOX_HOST_DEVICE static int64_t row_offset(const Params& p, const Cta& cta, int m) {
    if (m >= cta.m) return -1;
    int j[3], rest = m;
    rest = cta.phase->div_extent2.divmod(rest, j[2]);
    rest = cta.phase->div_extent1.divmod(rest, j[1]);
    const int n = rest / cta.phase->extent[0];
    j[0] = rest - n * cta.phase->extent[0];
    int i[3];
    for (int d = 0; d < 3; ++d) i[d] = cta.phase->phase[d] + p.stride[d] * j[d];
    return pixel_offset(int64_t(n) * p.in[0] * p.in[1] * p.in[2] * p.in_channels, p.in, i[0], i[1],
                        i[2], p.in_channels, cta.group * p.in_per_group);
  }
  FUSEBOX_HOST_DEVICE static int bias_base(const Params& p, const Cta& cta) {
    return cta.group * p.in_per_group;
  }
  FUSEBOX_HOST_DEVICE static const void* a_source(const Params& p) { return p.y; }
  FUSEBOX_HOST_DEVICE static const void* b_source(const Params& p) { return p.w; }
};

using Dgrad = DgradWith<DgradW>;
using DgradTransposed = DgradWith<DgradWT>;

// ---- wgrad: dw[g*K/g + k, r, c] = sum over (n, o) of dy[n, o, k'] x[n, o*s - p + r*d, c'] ----

struct WgradDy {  // A: [K = (n, o)] x [M = k]; the pixel index is dy's row
  static constexpr bool kKMajor = false;
  struct Fixed {
    int k;
    bool valid;
  };
  struct Moving {
    int64_t base;
    bool valid;
  };
  FUSEBOX_HOST_DEVICE static Fixed fixed(const Params&, const Cta& cta, int m) {
    return {m, m < cta.m};
  }
  FUSEBOX_HOST_DEVICE static Moving moving(const Params& p, const Cta& cta, int k) {
    return {int64_t(k) * p.out_channels + int64_t(cta.group) * p.out_per_group, k < cta.k_end};
  }
  FUSEBOX_HOST_DEVICE static int64_t offset(const Params&, const Fixed& f, const Moving& v) {
    return f.valid && v.valid ? v.base + f.k : -1;
  }
};

struct WgradX {  // B: [K = (n, o)] x [N = (r, c)]
  static constexpr bool kKMajor = false;
  struct Fixed {
    int c, d[3];
    bool valid;
  };
  struct Moving {
    int64_t base;
    int i[3];
    bool valid;
  };
  FUSEBOX_HOST_DEVICE static Fixed fixed(const Params& p, const Cta& cta, int n) {
    Fixed f;
    f.valid = n < cta.n;
    int tap = p.div_in_per_group.divmod(f.valid ? n : 0, f.c), r[3];
    tap = p.div_filter2.divmod(tap, r[2]);
    r[0] = p.div_filter1.divmod(tap, r[1]);
    for (int d = 0; d < 3; ++d) f.d[d] = r[d] * p.dilation[d];
    return f;
  }
  FUSEBOX_HOST_DEVICE static Moving moving(const Params& p, const Cta& cta, int k) {
    Moving v;
    v.valid = k < cta.k_end;
    int o[3], rest = v.valid ? k : 0;
    rest = p.div_out2.divmod(rest, o[2]);
    rest = p.div_out1.divmod(rest, o[1]);
    const int n = rest / p.out[0];
    o[0] = rest - n * p.out[0];
    v.base = int64_t(n) * p.in[0] * p.in[1] * p.in[2] * p.in_channels +
             int64_t(cta.group) * p.in_per_group;
    for (int d = 0; d < 3; ++d) v.i[d] = o[d] * p.stride[d] - p.pad[d];
    return v;
  }
  FUSEBOX_HOST_DEVICE static int64_t offset(const Params& p, const Fixed& f, const Moving& v) {
    const int i0 = v.i[0] + f.d[0], i1 = v.i[1] + f.d[1], i2 = v.i[2] + f.d[2];
    if (!(f.valid && v.valid && inside(i0, p.in[0]) && inside(i1, p.in[1]) && inside(i2, p.in[2])))
      return -1;
    return pixel_offset(v.base, p.in, i0, i1, i2, p.in_channels, f.c);
  }
};

struct Wgrad {
  using A = WgradDy;
  using B = WgradX;
  static constexpr bool kBias = false;
  // Split s sums K tiles [s * k_tiles_per_split, (s + 1) * k_tiles_per_split).
  template <int BK>
  FUSEBOX_HOST_DEVICE static Cta cta(const Params& p, int split, int z) {
    Cta c;
    c.group = z;
    c.split = split;
    c.m = p.m;
    c.n = p.n;
    c.k_begin = c.split * p.k_tiles_per_split * BK;
    const int end = c.k_begin + p.k_tiles_per_split * BK;
    c.k_end = p.k < end ? p.k : end;
    return c;
  }
  // dw[g*K/g + m, n] (KRSC: n = (r, c) is the row's flat index).
  FUSEBOX_HOST_DEVICE static int64_t row_offset(const Params& p, const Cta& cta, int m) {
    return m < cta.m ? (int64_t(cta.group) * p.out_per_group + m) * p.n : -1;
  }
  FUSEBOX_HOST_DEVICE static int bias_base(const Params&, const Cta&) { return 0; }
  FUSEBOX_HOST_DEVICE static const void* a_source(const Params& p) { return p.y; }
  FUSEBOX_HOST_DEVICE static const void* b_source(const Params& p) { return p.x; }
};

}  // namespace fusebox::cuda::igemm
