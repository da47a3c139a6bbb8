#include "backends/cuda/kernels/conv/engines/depthwise/plan.h"

#include <algorithm>

namespace fusebox::cuda::depthwise {

int vector_width(DType dtype) {
  return 16 / int(dtype_size(dtype));
}

std::optional<std::string> cannot_implement(ConvOp op, const ConvGeometry& g, DType dtype) {
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16)
    return cat("dtype ", dtype_name(dtype));
  if (g.groups != g.in_channels || g.out_channels != g.in_channels)
    return std::string("not depthwise (groups == C == K)");
  const int v = vector_width(dtype);
  if (g.in_channels % v != 0) return cat("C = ", g.in_channels, " not a multiple of ", v);
  if (op == ConvOp::wgrad && g.filter[2] > kMaxFilterWidth)
    return cat("filter width ", g.filter[2], " > ", kMaxFilterWidth);
  const int64_t largest = std::max(g.batch * g.in_size(), g.batch * g.out_size()) * g.in_channels;
  if (largest >= (int64_t(1) << 31)) return std::string("a tensor of 2^31 elements or more");
  return std::nullopt;
}

std::pair<int, int> rows_kernel_shape(const ConvGeometry& g, ConvOp op) {
  const int64_t kw = g.filter[2], s = g.stride[2];
  for (int d = 0; d < 3; ++d)  // their coordinate divisors must not be 0
    if (g.in[d] < 1 || g.out[d] < 1) return {0, 0};
  if ((kw != 3 && kw != 5 && kw != 7) || g.dilation[2] != 1 || (s != 1 && s != 2)) return {0, 0};
  if (op == ConvOp::dgrad && (g.stride[0] != 1 || g.stride[1] != 1 || s != 1)) return {0, 0};
  return {int(kw), int(s)};
}

bool ring_shape(const ConvGeometry& g, ConvOp op, std::pair<int, int> rows, int vec_width) {
  // An empty batch (a wgrad of zeros) stays on the rows kernel: no block to launch here.
  if (rows.first == 0 || (g.in_channels / vec_width) % 4 != 0 || g.batch < 1) return false;
  if (g.filter[0] != 1 || g.stride[0] != 1 || g.pad_lo[0] != 0 || g.in[0] != g.out[0]) return false;
  if (op == ConvOp::wgrad) return g.filter[1] <= 8;
  const int64_t dst_w = op == ConvOp::dgrad ? g.in[2] : g.out[2];
  return g.stride[1] == 1 && g.stride[2] == 1 && dst_w >= 7;
}

}  // namespace fusebox::cuda::depthwise
