// The convolution problem shared by the forward, backward-data and backward-filter
// kernels (CUTLASS style: one struct describes all three), im2col / col2im over it,
// and the compute-type views of whole tensors that the GEMM-based kernels work on.
//
// Rank-agnostic: 1-D and 2-D problems are stored as 3-D ones with leading spatial
// extents of 1 (filter 1, stride 1, dilation 1, pad 0), so one code path serves all.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "fusebox/core/parallel.h"
#include "fusebox/ir/graph.h"
#include "kernel_util.h"

namespace fusebox::cpu {

using Dims3 = std::array<int64_t, 3>;

struct ConvProblem {
  int64_t batch = 0;         // N
  int64_t in_channels = 0;   // C
  int64_t out_channels = 0;  // K
  int64_t groups = 1;        // g
  Dims3 in{1, 1, 1};         // D: x / dx spatial extents
  Dims3 out{1, 1, 1};        // O: y / dy spatial extents
  Dims3 filter{1, 1, 1};     // R: w / dw spatial extents
  Dims3 stride{1, 1, 1};
  Dims3 dilation{1, 1, 1};
  Dims3 pad_lo{0, 0, 0};  // the high pads are implied by O; taps past D read zero

  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
  int64_t filter_size() const { return filter[0] * filter[1] * filter[2]; }
  int64_t in_per_group() const { return in_channels / groups; }    // C/g
  int64_t out_per_group() const { return out_channels / groups; }  // K/g
  // Rows of the im2col matrix: one per (input channel of a group, filter tap).
  int64_t col_rows() const { return in_per_group() * filter_size(); }
  // A 1x1 filter with stride 1 and no padding: the im2col matrix is x itself.
  bool is_pointwise() const;
};

// Builds the problem from x [N, C, D...], w [K, C/g, R...] and y [N, K, O...] shapes
// (for the backward ops: dx, w / dw and dy), checking that they agree with each other
// and with the attributes (O is what a convolution of D gives); `where` names the node
// in errors. Shape inference has checked all this; the kernels check again because
// they index memory by it.
ConvProblem make_conv_problem(const ConvAttrs& attrs, const Shape& x, const Shape& w,
                              const Shape& y, const std::string& where);

// im2col for one image and one group: col[row][o - o_begin] = x[c][input position of
// tap r at output position o] (0 in the padding), row = c * filter_size + r, for
// c < C/g and o in [o_begin, o_end). x points at the group's first channel plane.
template <class T>
void im2col(const ConvProblem& p, const T* x, int64_t o_begin, int64_t o_end, T* col);

// col2im, the adjoint: dx[c][input position of (r, o)] += col[row][o - o_begin].
// Parallel over channels (each owns its dx plane, so there are no races).
template <class T>
void col2im(const ConvProblem& p, const T* col, int64_t o_begin, int64_t o_end, T* dx);

// A tensor's values in the compute type C (compute_t in kernel_util.h): the tensor's
// own buffer when its dtype already is C, else a converted copy.
template <class C>
class ComputeInput {
 public:
  explicit ComputeInput(const Tensor* t);
  const C* data() const { return data_; }

 private:
  std::vector<C> copy_;
  const C* data_ = nullptr;
};

// Somewhere to compute an output in C: the output's own buffer when its dtype is C,
// else a scratch buffer that store() rounds (once, to nearest even) into the output.
template <class C>
class ComputeOutput {
 public:
  explicit ComputeOutput(Tensor& t);
  C* data() { return data_; }
  void store();

 private:
  Tensor& tensor_;
  std::vector<C> scratch_;
  C* data_ = nullptr;
};

// Calls f(C{}) with C the compute type (float or double) of the floating dtype t;
// any other dtype is an Error naming the node.
template <class F>
void visit_float_compute(const Node& n, DType t, F&& f) {
  visit_float(n, t, [&](auto tag) {
    using C = compute_t<decltype(tag)>;
    if constexpr (std::is_same_v<C, float> || std::is_same_v<C, double>) f(C{});
  });
}

}  // namespace fusebox::cpu
