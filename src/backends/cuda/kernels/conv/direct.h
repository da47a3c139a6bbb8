// The project's own convolution kernels (kernels/conv/direct.cu): the fallback when cuDNN has no
// plan for a problem, and the path FUSEBOX_CONV_BACKEND=own forces. kernels/conv/conv.cpp
// dispatches.
//
// The three entries take the ops' inputs and outputs as the kernels.h entries do, all
// CONTIGUOUS (kernels/conv/conv.cpp copies strided views first). conv_add_bias adds a bias per
// channel (dim 1) to a strided output of rank 3 to 5 in place: the bias of a convolution that cuDNN
// ran without it.
#pragma once

#include "backends/cuda/kernels.h"

namespace fusebox::cuda {

// x [N, C, D...], w [K, C/g, R...], bias [K]? -> y [N, K, O...]
void conv_forward_direct(Context& ctx, const Node& n, Inputs in, Outputs out);
// dy [N, K, O...], w [K, C/g, R...], bias [C]? -> dx [N, C, D...]
void conv_backward_data_direct(Context& ctx, const Node& n, Inputs in, Outputs out);
// x [N, C, D...], dy [N, K, O...] -> dw [K, C/g, R...]
void conv_backward_filter_direct(Context& ctx, const Node& n, Inputs in, Outputs out);

// y[n, c, ...] += bias[c]; y may be strided (a channels-last view).
void conv_add_bias(Context& ctx, const Node& n, const DeviceTensor& bias, const DeviceTensor& y);

}  // namespace fusebox::cuda
