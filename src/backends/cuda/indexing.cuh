// Strided and broadcast index math for the CUDA kernels (include from .cu files only).
//
// A StridedLayout<N> describes a walk over a shape (rank <= kMaxDims after simplification)
// in row-major order, carrying for each of N operands the element offset
// sum(coord[d] * strides[k][d]). A stride of 0 broadcasts, a negative stride walks
// backwards (a slice with a negative step). Kernels map a flat index i of the walk to the
// N offsets with offsets(); the host builds the layout with make_layout(), which drops
// extent-1 dims and merges neighbours that every operand walks as one (so a same-shape
// elementwise op becomes rank 1), exactly as the CPU backend's StridedNest::simplify.
//
// Dims are stored innermost first (dim 0 is the fastest-varying): the device loop peels
// coordinates off the flat index from the inside out.
//
//   StridedLayout<2> L = make_layout<2>(where, y.shape, {y.strides, x.strides});
//   ... in a kernel: int64_t off[2]; L.offsets(i, off);  y[off[0]] = f(x[off[1]]);
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "fusebox/core/error.h"
#include "fusebox/core/shape.h"
#include "fusebox/ir/graph.h"

namespace fusebox::cuda {

// Names what an error is about (a node, or a component such as "copy_strided"); the text
// is built only when an error is thrown: node_label formats a string, a cost not worth
// paying on every launch of a replayed step.
class Where {
 public:
  Where(const Node& node) : node_(&node) {}                // NOLINT: implicit on purpose
  Where(const char* component) : component_(component) {}  // NOLINT: implicit on purpose
  std::string str() const { return node_ ? node_label(*node_) : std::string(component_); }

 private:
  const Node* node_ = nullptr;
  const char* component_ = "cuda";
};

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

// Builds the layout of a walk over `shape` (outermost first, as Shape is) where operand k
// has `strides[k]` (outermost first, same rank as shape). Throws an Error naming `where`
// when more than kMaxDims dims remain after merging.
template <int N>
StridedLayout<N> make_layout(const Where& where, const Shape& shape,
                             const std::array<Shape, N>& strides) {
  // Merge outermost-first, as the CPU nest does, then store reversed.
  Shape s;
  std::array<Shape, N> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !s.empty();
    for (int k = 0; k < N && merge; ++k) merge = st[k].back() == strides[k][d] * shape[d];
    if (merge) {
      s.back() *= shape[d];
      for (int k = 0; k < N; ++k) st[k].back() = strides[k][d];
    } else {
      s.push_back(shape[d]);
      for (int k = 0; k < N; ++k) st[k].push_back(strides[k][d]);
    }
  }
  StridedLayout<N> layout;
  if (s.empty()) {  // every extent is 1: a single element
    layout.rank = 1;
    layout.extent[0] = 1;
    return layout;
  }
  FUSEBOX_CHECK(s.size() <= size_t(kMaxDims), where.str(), "a strided walk over ", shape_str(shape),
                " keeps ", s.size(), " dims after merging; the CUDA kernels handle at most ",
                kMaxDims);
  layout.rank = int(s.size());
  for (int d = 0; d < layout.rank; ++d) {
    const size_t from = s.size() - 1 - size_t(d);
    layout.extent[d] = s[from];
    for (int k = 0; k < N; ++k) layout.stride[k][d] = st[k][from];
  }
  return layout;
}

// The strides of an operand of `shape` with `strides` broadcast (numpy rules) to `to`:
// aligned at the back, 0 along every dim where the operand has extent 1.
inline Shape broadcast_strides(const Shape& shape, const Shape& strides, const Shape& to) {
  Shape out(to.size(), 0);
  const size_t lead = to.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) out[lead + d] = shape[d] == 1 ? 0 : strides[d];
  return out;
}

// True when a grid-stride loop over `numel` elements can run its flat index in uint32_t:
// below 2^31, so that index + grid stride never wraps.
inline bool fits_u32(int64_t numel) {
  return numel <= int64_t(INT32_MAX);
}

}  // namespace fusebox::cuda
