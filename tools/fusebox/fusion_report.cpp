// The fusion part of `fusebox run|bench --report` on the GPU: each planned group
// (passes/fusion.h), its ops and what it became on this GPU: the convolution record of its
// node (cuDNN graph and engine, how much of the epilogue cuDNN fused, the epilogue kernel
// for the rest and why), a generated kernel, or the project's kernel; then the summary line.
#include <sstream>

#include "common.h"
#include "fusebox/backends/cpu_fast.h"
#include "fusebox/backends/cuda.h"
#include "fusebox/runtime/report.h"

namespace fusebox::cli {

LoweringDescriber cpu_lowering(const Graph& g, CpuKernels kernels) {
  return [&g, kernels](const Node& n) -> std::string {
    if (kernels == CpuKernels::reference) return "the reference kernel (--device cpu-ref)";
    const cpu_fast::Planned planned = cpu_fast::plan(g, n);
    if (planned.kernel) return planned.kernel->describe();
    return cat("the reference kernel (", planned.why_not, ")");
  };
}

std::string fusion_outcome(const Graph& g, const FusionLog& log,
                           const std::vector<ConvDecision>& decisions) {
  std::ostringstream os;
  size_t index = 0;
  for (const Node& n : g.nodes()) {
    const FusionGroup* group = log.find(n.name);
    if (group == nullptr) continue;
    os << "group " << ++index << " [" << n.name << "]: ";
    for (size_t i = 0; i < group->ops.size(); ++i) os << (i ? " + " : "") << group->ops[i];
    os << "\n  planned: " << cuda::describe_lowering(n) << "\n  ran: ";
    const ConvDecision* d = nullptr;
    for (const ConvDecision& c : decisions)
      if (c.node == node_label(n) && c.op == "conv_fprop") d = &c;
    if (n.op == OpKind::fused_pointwise) {
      os << "generated kernel (NVRTC, one pass)\n";
      continue;
    }
    if (n.op == OpKind::attention) {
      os << "fused attention (cuDNN SDPA where cuDNN takes it, else the row kernel; stderr "
            "names which, once per problem)\n";
      continue;
    }
    if (n.op == OpKind::gemm) {
      os << "as planned\n";
      continue;
    }
    if (n.op != OpKind::conv) {
      os << "own kernel (one pass)\n";
      continue;
    }
    if (d == nullptr) {
      os << "not recorded (not run on the GPU in this process)\n";
      continue;
    }
    os << d->path;
    if (!d->plan.empty()) os << ", plan " << d->plan;
    if (d->tuned_ms >= 0) os << ", " << fixed(d->tuned_ms, 4) << " ms (autotuned)";
    if (!d->reason.empty()) os << "\n  why not more fused: " << d->reason;
    os << "\n";
  }
  os << fusion_summary(g, log);
  return os.str();
}

}  // namespace fusebox::cli
