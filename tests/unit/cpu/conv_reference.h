// Direct definitions of convolution and its two backward ops for the CPU tests,
// written as plain loops in f64, plus random convolution configurations.
#pragma once

#include <array>
#include <random>
#include <string>
#include <vector>

#include "testing.h"

namespace fusebox::cpu::test {

// A convolution: x [N, C, D...], w [K, C/groups, R...], optional bias [K], run in `dtype`.
struct ConvCase {
  Shape x, w;
  ConvAttrs attrs;  // every vector filled to the spatial rank
  bool bias = false;
  DType dtype = DType::f64;

  int64_t rank() const { return int64_t(w.size()) - 2; }
  Shape y() const;  // [N, K, O...] with O by the output-extent rule
  std::string describe() const;
};

// A random case: rank 1-3, batch 1-2, groups 1 / 2-3 / depthwise, channel counts such
// as 3 and 7, filters 1-3 wide, stride 1-3, dilation 1-2, asymmetric pads 0-2, bias or
// not; dtype is chosen by the caller.
ConvCase random_conv_case(std::mt19937_64& rng, int64_t rank, DType dtype);

// One value per output element, and the sum of the magnitudes of the terms that made
// it (the scale of the rounding error a computation of it may carry).
struct Reference {
  Shape shape;
  std::vector<double> value, magnitude;
};

// The definitions, every term spelt out: y[n,k,o] = bias[k] + sum over c, r of
// x[n, g*C/g + c, o*stride - pad_begin + r*dilation] * w[k, c, r] (in-bounds taps only),
// and its adjoints with respect to x (plus bias[c]) and w.
Reference conv_reference(const ConvCase& c, const Tensor& x, const Tensor& w, const Tensor* bias);
Reference conv_backward_data_reference(const ConvCase& c, const Tensor& dy, const Tensor& w,
                                       const Tensor* bias);
Reference conv_backward_filter_reference(const ConvCase& c, const Tensor& x, const Tensor& dy);

// |got - value| <= rounding(dtype) * |value| + 16 * eps(compute type) * magnitude,
// elementwise, where rounding is the output dtype's unit roundoff (0 for f64 / f32,
// whose arithmetic error the second term covers; f16 adds 2^-25 for its subnormals).
// NaN never passes.
::testing::AssertionResult matches_reference(const Tensor& got, const Reference& ref,
                                             const std::string& what);

// sum over i of a[i] * b[i] in f64, for the adjoint identities.
double dot(const Tensor& a, const Tensor& b);

// The tensors of an ONNX backend node test (Debian's libonnx-testdata):
// <data>/<name>/test_data_set_0/{input,output}_<i>.pb. False when the data is not
// installed (the caller skips).
bool load_onnx_node_test(const std::string& name, std::vector<Tensor>* inputs,
                         std::vector<Tensor>* outputs);

}  // namespace fusebox::cpu::test
