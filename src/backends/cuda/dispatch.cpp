#include "backends/cuda/kernels.h"
#include "fusebox/ir/op_groups.h"

namespace fusebox::cuda {

namespace {

// Which inputs an op accepts strided (views); all others are made contiguous first.
bool accepts_strided_inputs(OpKind op) {
  switch (op) {
    FUSEBOX_UNARY_POINTWISE_OPS(FUSEBOX_OP_CASE)
    FUSEBOX_BINARY_POINTWISE_OPS(FUSEBOX_OP_CASE)
    case OpKind::identity: case OpKind::expand: case OpKind::unary_backward:
      return true;
    default:
      return false;
  }
}

void run_contiguous(Context& ctx, const Node& n, Inputs in, Outputs out) {
  switch (n.op) {
    case OpKind::conv: return conv_forward(ctx, n, in, out);
    case OpKind::conv_backward_data: return conv_backward_data(ctx, n, in, out);
    case OpKind::conv_backward_filter: return conv_backward_filter(ctx, n, in, out);
    case OpKind::batch_norm: return batch_norm(ctx, n, in, out);
    case OpKind::layer_norm: return layer_norm(ctx, n, in, out);
    case OpKind::rms_norm: return rms_norm(ctx, n, in, out);
    FUSEBOX_UNARY_POINTWISE_OPS(FUSEBOX_OP_CASE)
    case OpKind::identity:
      return unary(ctx, n, in, out);
    FUSEBOX_BINARY_POINTWISE_OPS(FUSEBOX_OP_CASE)
      return binary(ctx, n, in, out);
    case OpKind::matmul: return matmul(ctx, n, in, out);
    case OpKind::gemm: return gemm(ctx, n, in, out);
    FUSEBOX_REDUCE_OPS(FUSEBOX_OP_CASE)
      return reduce(ctx, n, in, out);
    case OpKind::softmax: case OpKind::log_softmax: return softmax(ctx, n, in, out);
    case OpKind::max_pool: return max_pool(ctx, n, in, out);
    case OpKind::avg_pool: return avg_pool(ctx, n, in, out);
    case OpKind::global_avg_pool: return global_avg_pool(ctx, n, in, out);
    case OpKind::reshape: case OpKind::flatten: case OpKind::squeeze: case OpKind::unsqueeze:
      return copy_reshape(ctx, n, in, out);
    case OpKind::transpose: return transpose(ctx, n, in, out);
    case OpKind::concat: return concat(ctx, n, in, out);
    case OpKind::slice: return slice(ctx, n, in, out);
    case OpKind::pad: return pad(ctx, n, in, out);
    case OpKind::cast: return cast(ctx, n, in, out);
    case OpKind::constant: return constant(ctx, n, in, out);
    case OpKind::cross_entropy: return cross_entropy(ctx, n, in, out);
    case OpKind::expand: return expand(ctx, n, in, out);
    case OpKind::unary_backward: return unary_backward(ctx, n, in, out);
    case OpKind::binary_backward: return binary_backward(ctx, n, in, out);
    case OpKind::batch_norm_backward: return batch_norm_backward(ctx, n, in, out);
    case OpKind::layer_norm_backward: return layer_norm_backward(ctx, n, in, out);
    case OpKind::rms_norm_backward: return rms_norm_backward(ctx, n, in, out);
    case OpKind::softmax_backward: case OpKind::log_softmax_backward:
      return softmax_backward(ctx, n, in, out);
    case OpKind::cross_entropy_backward: return cross_entropy_backward(ctx, n, in, out);
    case OpKind::reduce_max_backward: return reduce_max_backward(ctx, n, in, out);
    case OpKind::max_pool_backward: return max_pool_backward(ctx, n, in, out);
    case OpKind::avg_pool_backward: return avg_pool_backward(ctx, n, in, out);
    case OpKind::slice_backward: return slice_backward(ctx, n, in, out);
    case OpKind::pad_backward: return pad_backward(ctx, n, in, out);
    case OpKind::sgd_update: return sgd_update(ctx, n, in, out);
    case OpKind::adamw_update: return adamw_update(ctx, n, in, out);
  }
  throw Error(node_label(n), "no CUDA kernel for this op");
}

}  // namespace

void run_node(Context& ctx, const Node& n, Inputs in, Outputs out) {
  if (accepts_strided_inputs(n.op)) return run_contiguous(ctx, n, in, out);
  // Materialise strided views once, here, so that kernels can assume contiguity.
  std::vector<DeviceTensor> copies;
  copies.reserve(in.size());
  std::vector<const DeviceTensor*> ptrs(in.begin(), in.end());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == nullptr || in[i]->is_contiguous()) continue;
    copies.push_back(DeviceTensor::empty(ctx.allocator, in[i]->dtype, in[i]->shape));
    copy_strided(ctx, *in[i], copies.back());
    ctx.encoder.add_temporary(copies.back().buffer);
    ptrs[i] = &copies.back();
  }
  run_contiguous(ctx, n, ptrs, out);
}

}  // namespace fusebox::cuda
