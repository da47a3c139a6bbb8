#include <algorithm>

#include "fusebox/backends/cpu.h"
#include "fusebox/ir/op_groups.h"

#include "kernels.h"

namespace fusebox::cpu {

void run_node(const Graph& g, const Node& n, std::span<const Tensor* const> inputs,
              std::span<Tensor> outputs, dist::Communicator* world) {
  (void)g;
  // Outputs without elements (a batch of 0) leave nothing to compute; the kernels' work
  // splitting (blocks per image, rows per chunk) assumes at least one element. A node with
  // an empty input but elements to write (a reduction over an empty axis, a product over an
  // empty inner dim) runs: its kernel writes the identity.
  if (std::all_of(outputs.begin(), outputs.end(), [](const Tensor& t) { return t.numel() == 0; }))
    return;
  switch (n.op) {
    case OpKind::conv:
      return conv_forward(n, inputs, outputs);
    case OpKind::conv_backward_data:
      return conv_backward_data(n, inputs, outputs);
    case OpKind::conv_backward_filter:
      return conv_backward_filter(n, inputs, outputs);
    case OpKind::batch_norm:
      return batch_norm(world, n, inputs, outputs);
    case OpKind::batch_norm_apply:
      return batch_norm_apply(n, inputs, outputs);
    case OpKind::layer_norm:
      return layer_norm(n, inputs, outputs);
    case OpKind::rms_norm:
      return rms_norm(n, inputs, outputs);
      FUSEBOX_UNARY_POINTWISE_OPS(FUSEBOX_OP_CASE)
    case OpKind::identity:
      return unary(n, inputs, outputs);
      FUSEBOX_BINARY_POINTWISE_OPS(FUSEBOX_OP_CASE)
      return binary(n, inputs, outputs);
      FUSEBOX_LOGIC_OPS(FUSEBOX_OP_CASE)
      return logic(n, inputs, outputs);
    case OpKind::where:
      return where(n, inputs, outputs);
    case OpKind::matmul:
      return matmul(n, inputs, outputs);
    case OpKind::gemm:
      return gemm(n, inputs, outputs);
      FUSEBOX_REDUCE_OPS(FUSEBOX_OP_CASE)
      return reduce(n, inputs, outputs);
    case OpKind::arg_max:
    case OpKind::arg_min:
      return arg_reduce(n, inputs, outputs);
    case OpKind::cumsum:
      return cumsum(n, inputs, outputs);
    case OpKind::top_k:
      return top_k(n, inputs, outputs);
    case OpKind::softmax:
    case OpKind::log_softmax:
      return softmax(n, inputs, outputs);
    case OpKind::max_pool:
      return max_pool(n, inputs, outputs);
    case OpKind::avg_pool:
      return avg_pool(n, inputs, outputs);
    case OpKind::global_avg_pool:
      return global_avg_pool(n, inputs, outputs);
    case OpKind::reshape:
    case OpKind::flatten:
    case OpKind::squeeze:
    case OpKind::unsqueeze:
      return copy_reshape(n, inputs, outputs);
    case OpKind::transpose:
      return transpose(n, inputs, outputs);
    case OpKind::concat:
      return concat(n, inputs, outputs);
    case OpKind::slice:
      return slice(n, inputs, outputs);
    case OpKind::pad:
      return pad(n, inputs, outputs);
    case OpKind::cast:
      return cast(n, inputs, outputs);
    case OpKind::constant:
      return constant(n, inputs, outputs);
    case OpKind::cross_entropy:
      return cross_entropy(n, inputs, outputs);
    case OpKind::expand:
      return expand(n, inputs, outputs);
    case OpKind::gather:
      return gather(n, inputs, outputs);
    case OpKind::gather_backward:
      return gather_backward(n, inputs, outputs);
    case OpKind::gather_elements:
      return gather_elements(n, inputs, outputs);
    case OpKind::gather_elements_backward:
      return gather_elements_backward(n, inputs, outputs);
    case OpKind::resize:
      return resize(n, inputs, outputs);
    case OpKind::resize_backward:
      return resize_backward(n, inputs, outputs);
    case OpKind::unary_backward:
      return unary_backward(n, inputs, outputs);
    case OpKind::binary_backward:
      return binary_backward(n, inputs, outputs);
    case OpKind::batch_norm_backward:
      return batch_norm_backward(world, n, inputs, outputs);
    case OpKind::layer_norm_backward:
      return layer_norm_backward(n, inputs, outputs);
    case OpKind::rms_norm_backward:
      return rms_norm_backward(n, inputs, outputs);
    case OpKind::softmax_backward:
    case OpKind::log_softmax_backward:
      return softmax_backward(n, inputs, outputs);
    case OpKind::cross_entropy_backward:
      return cross_entropy_backward(n, inputs, outputs);
    case OpKind::reduce_max_backward:
      return reduce_max_backward(n, inputs, outputs);
    case OpKind::max_pool_backward:
      return max_pool_backward(n, inputs, outputs);
    case OpKind::avg_pool_backward:
      return avg_pool_backward(n, inputs, outputs);
    case OpKind::slice_backward:
      return slice_backward(n, inputs, outputs);
    case OpKind::pad_backward:
      return pad_backward(n, inputs, outputs);
    case OpKind::sgd_update:
      return sgd_update(n, inputs, outputs);
    case OpKind::adamw_update:
      return adamw_update(n, inputs, outputs);
    case OpKind::nonfinite_any:
      return nonfinite_any(n, inputs, outputs);
    case OpKind::loss_scale_update:
      return loss_scale_update(n, inputs, outputs);
    case OpKind::fused_pointwise:
      return fused_pointwise(n, inputs, outputs);
    case OpKind::attention:
      return attention(n, inputs, outputs);
    case OpKind::attention_backward:
      return attention_backward(n, inputs, outputs);
    case OpKind::all_reduce:
      return all_reduce(world, n, inputs, outputs);
  }
  throw Error(node_label(n), "no CPU kernel for this op");
}

}  // namespace fusebox::cpu
