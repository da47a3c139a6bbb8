// Which nodes the fast CPU kernels take: one table of planners by op, each saying why it
// refuses a node; a lone elementwise op none takes runs as a program of one instruction on the
// block interpreter; every other op runs on the reference kernels.
#include "fusebox/backends/cpu_fast.h"

#include <numeric>

#include "backends/cpu_fast/kernels.h"
#include "fusebox/ir/pointwise_program.h"
#include "fusebox/passes/fuse_pointwise.h"
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

namespace {

// The table: the own kernels, then oneDNN's by op.
Planned plan_by_op(const Graph& g, const Node& n) {
  if (n.op == OpKind::fused_pointwise) return plan_fused_pointwise(g, n);
  if (n.op == OpKind::batch_norm || n.op == OpKind::batch_norm_backward)
    return plan_batch_norm(g, n);
  if (n.op == OpKind::sgd_update || n.op == OpKind::adamw_update)
    return plan_optimizer_update(g, n);
  if (n.op == OpKind::max_pool_backward) return plan_max_pool_backward(g, n);
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

// An elementwise op that fuse_pointwise_chains would make a member of a program (an
// activation's gradient, exp, a cast, ...) as the program of that one instruction: the block
// interpreter's vector loops instead of the reference's element loop (GPT-2's two standalone
// gelu gradients were a third of its CPU training step). `why` stays where it cannot be.
Planned plan_lone_pointwise(const Graph& g, const Node& n, std::string why) {
  if (n.op == OpKind::fused_pointwise || !is_pointwise_member(g, n)) return {nullptr, why};
  std::vector<int32_t> operands(n.inputs.size());
  std::iota(operands.begin(), operands.end(), 0);
  Node program = n;
  program.op = OpKind::fused_pointwise;
  program.attrs = PointwiseProgram{int32_t(n.inputs.size()), {pointwise_instr(n, operands)}};
  Planned planned = plan_fused_pointwise(g, program);
  return planned.kernel ? std::move(planned) : Planned{nullptr, std::move(why)};
}

}  // namespace

Planned plan(const Graph& g, const Node& n) {
  Planned planned = plan_by_op(g, n);
  if (planned.kernel) return planned;
  return plan_lone_pointwise(g, n, std::move(planned.why_not));
}

}  // namespace fusebox::cpu_fast
