// What the project's convolution kernels (implicit_gemm/, depthwise/, the epilogue pass) share
// on the host: the node's attributes, roles and geometry, its operands in the layout they read,
// and its fused activations in device form.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/common/activation.h"
#include "backends/common/conv_geometry.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/conv/problem.h"

namespace fusebox::cuda {

// The ConvAttrs of a conv, conv_backward_data or conv_backward_filter node.
const ConvAttrs& conv_attrs_of(const Node& n);

// The forward roles (kernels/conv/problem.h) of a convolution op's inputs and output:
// fprop (x, w) -> y; dgrad (dy, w) -> dx; wgrad (x, dy) -> dw.
struct ConvRoles {
  const DeviceTensor* x;
  const DeviceTensor* w;
  const DeviceTensor* y;
};
ConvRoles conv_roles(ConvOp op, Inputs in, const DeviceTensor& out);

// The node's geometry from its tensors in their roles (make_conv_geometry: checked).
ConvGeometry conv_geometry_of(const Node& n, ConvOp op, Inputs in, const DeviceTensor& out);

// A fused activation in the form device code takes.
ActivationFn activation_fn(const FusedActivation& a);

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
