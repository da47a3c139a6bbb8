// Which nodes the fast CPU kernels take: one table of planners by op, each saying why it
// refuses a node; every other op runs on the reference kernels.
#include "fusebox/backends/cpu_fast.h"

#include "backends/cpu_fast/kernels.h"
#ifdef FUSEBOX_WITH_ONEDNN
#include "backends/cpu_fast/onednn.h"
#endif

namespace fusebox::cpu_fast {

bool built_with_onednn() {
#ifdef FUSEBOX_WITH_ONEDNN
  return true;
#else
  return false;
#endif
}

Planned plan(const Graph& g, const Node& n) {
  if (n.op == OpKind::fused_pointwise) return plan_fused_pointwise(g, n);
  if (n.op == OpKind::batch_norm || n.op == OpKind::batch_norm_backward)
    return plan_batch_norm(g, n);
  if (n.op == OpKind::sgd_update || n.op == OpKind::adamw_update)
    return plan_optimizer_update(g, n);
#ifdef FUSEBOX_WITH_ONEDNN
  try {
    switch (n.op) {
      case OpKind::conv:
        return plan_conv(g, n);
      case OpKind::conv_backward_data:
        return plan_conv_backward_data(g, n);
      case OpKind::conv_backward_filter:
        return plan_conv_backward_filter(g, n);
      case OpKind::gemm:
        return plan_gemm(g, n);
      case OpKind::matmul:
        return plan_matmul(g, n);
      case OpKind::max_pool:
      case OpKind::avg_pool:
      case OpKind::global_avg_pool:
        return plan_pool(g, n);
      case OpKind::softmax:
      case OpKind::log_softmax:
        return plan_softmax(g, n);
      case OpKind::layer_norm:
        return plan_layer_norm(g, n);
      case OpKind::relu:
      case OpKind::gelu:
      case OpKind::sigmoid:
      case OpKind::tanh:
      case OpKind::silu:
        return plan_eltwise(g, n);
      case OpKind::attention:
        return plan_attention(g, n);
      case OpKind::transpose:
        return plan_transpose(g, n);
      case OpKind::slice:
        return plan_slice(g, n);
      case OpKind::add:
      case OpKind::sub:
      case OpKind::mul:
      case OpKind::div:
        return plan_binary(g, n);
      default:
        return {nullptr, cat("no oneDNN kernel for ", op_name(n.op), " yet")};
    }
  } catch (const dnnl::error& e) {
    return {nullptr, cat("oneDNN refused it: ", e.what())};
  }
#else
  (void)g;
  (void)n;
  return {nullptr, "this build has no oneDNN (scripts/setup.sh puts it in .deps-cpu/)"};
#endif
}

}  // namespace fusebox::cpu_fast
