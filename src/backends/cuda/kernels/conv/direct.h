// The direct convolution kernels (kernels/conv/direct.cu): the test oracle, and the direct
// engine's (engines/direct/engine.cpp), the last resort for what no other engine takes (f64, ...).
//
// The three entries take the ops' inputs and outputs as the kernels.h entries do, all
// CONTIGUOUS (kernels/conv/conv.cpp copies strided views first). conv_epilogue
// (kernels/conv/epilogue.cu) applies, in place on a strided output of rank 2 to 5, the part of a
// conv's epilogue (bias, activations, residual) that the convolution did not.
#pragma once

#include "backends/cuda/kernels.h"

namespace fusebox::cuda {

// x [N, C, D...], w [K, C/g, R...], bias [K]? -> y [N, K, O...]
void conv_forward_direct(Context& ctx, const Node& n, Inputs in, Outputs out);
// dy [N, K, O...], w [K, C/g, R...], bias [C]? -> dx [N, C, D...]
void conv_backward_data_direct(Context& ctx, const Node& n, Inputs in, Outputs out);
// x [N, C, D...], dy [N, K, O...] -> dw [K, C/g, R...]
void conv_backward_filter_direct(Context& ctx, const Node& n, Inputs in, Outputs out);

// What is left of a conv's epilogue, each part optional (null / none).
struct ConvEpilogueOperands {
  const DeviceTensor* bias = nullptr;      // [C], contiguous
  FusedActivation activation;              // after the bias
  const DeviceTensor* residual = nullptr;  // y's dtype and shape, any strides
  FusedActivation residual_activation;     // after the residual add
};

// y = residual_activation(activation(y + bias[c]) + residual) in place; y may be strided (a
// channels-last view).
void conv_epilogue(Context& ctx, const Node& n, const ConvEpilogueOperands& e,
                   const DeviceTensor& y);

}  // namespace fusebox::cuda
