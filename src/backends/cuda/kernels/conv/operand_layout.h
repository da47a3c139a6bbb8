// What the project's NHWC convolution kernels (implicit_gemm/, depthwise/) share on the host:
// the node's convolution attributes, and its operands in the layout they read.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cuda/kernels.h"

namespace fusebox::cuda {

// The ConvAttrs of a conv, conv_backward_data or conv_backward_filter node.
const ConvAttrs& conv_attrs_of(const Node& n);

// `t` itself when it is dense channels-last (NDHWC activations, KRSC filters), else a
// channels-last copy appended to `keep` (reserved by the caller, so references stay valid).
const DeviceTensor& channels_last_operand(Context& ctx, const DeviceTensor& t,
                                          std::vector<DeviceTensor>& keep);

// The same for contiguous (a bias).
const DeviceTensor& contiguous_operand(Context& ctx, const DeviceTensor& t,
                                       std::vector<DeviceTensor>& keep);

// Whether t's first element is 16-byte aligned (true for nullptr).
bool aligned16(const DeviceTensor* t);

}  // namespace fusebox::cuda
