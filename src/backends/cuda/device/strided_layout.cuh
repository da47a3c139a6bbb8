// A strided walk over up to kMaxDims dims carrying N operands' element offsets, as the
// kernels read it. Device-only: includes nothing outside device/. The host builds one with
// make_layout (kernels/common/indexing.cuh), which explains the representation.
#pragma once

#include <cstdint>

namespace fusebox::cuda {

constexpr int kMaxDims = 8;

template <int N>
struct StridedLayout {
  int rank = 1;                      // >= 1; dims [rank, kMaxDims) are unused
  int64_t extent[kMaxDims] = {};     // innermost first
  int64_t stride[N][kMaxDims] = {};  // per operand, innermost first, in elements

  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= extent[d];
    return n;
  }
  // The innermost stride of operand k (the only one when rank == 1).
  int64_t inner_stride(int k) const { return stride[k][0]; }

  // Offsets of the operands at flat index i (row-major over the walk). Index is the type
  // the coordinate division runs in: uint32_t when fits_u32(numel()) (much cheaper), else
  // uint64_t.
  template <class Index>
  __device__ __forceinline__ void offsets(Index i, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == rank) break;
      const Index e = Index(extent[d]);
      const Index coord = (d == rank - 1) ? i : i % e;  // the outermost dim needs no modulo
      i = (d == rank - 1) ? 0 : i / e;
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += int64_t(coord) * stride[k][d];
    }
  }
};

// True when a grid-stride loop over `numel` elements can run its flat index in uint32_t:
// below 2^31, so that index + grid stride never wraps.
inline bool fits_u32(int64_t numel) {
  return numel <= int64_t(INT32_MAX);
}

}  // namespace fusebox::cuda
