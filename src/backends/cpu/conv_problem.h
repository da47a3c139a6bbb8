// The convolution problem of the CPU kernels: the backends' shared geometry
// (backends/common/conv_geometry.h: one struct for the forward, backward-data and
// backward-filter ops, 1-D and 2-D stored as 3-D), what the GEMM-based kernels derive from
// it, im2col / col2im over it, and the compute-type views of whole tensors they work on.
#pragma once

#include <string>
#include <vector>

#include "backends/common/conv_geometry.h"
#include "fusebox/core/parallel.h"
#include "fusebox/ir/graph.h"
#include "kernel_util.h"

namespace fusebox::cpu {

// Built as ConvProblem{make_conv_geometry(...)}: the checks are the shared ones.
struct ConvProblem : ConvGeometry {
  // Rows of the im2col matrix: one per (input channel of a group, filter tap).
  int64_t col_rows() const { return in_per_group() * filter_size(); }
  // A 1x1 filter with stride 1 and no padding: the im2col matrix is x itself.
  bool is_pointwise() const;
};

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
