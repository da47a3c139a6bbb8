#include "backends/cuda/kernels/conv/engine.h"

namespace fusebox::cuda {

bool ConvCall::has_epilogue() const {
  const ConvEpilogueOperands& e = epilogue;
  return e.bias != nullptr || e.residual != nullptr || bool(e.activation) ||
         bool(e.residual_activation);
}

ConvEpilogueOperands node_epilogue(const Node& n, Inputs in) {
  ConvEpilogueOperands e;
  if (n.op == OpKind::conv_backward_filter) return e;
  if (in.size() > 2) e.bias = in[2];
  if (n.op != OpKind::conv) return e;  // a dgrad's epilogue is its bias
  const auto& a = std::get<ConvAttrs>(n.attrs);
  e.activation = a.activation;
  e.residual = in.size() > 3 ? in[3] : nullptr;
  e.residual_activation = a.residual_activation;
  return e;
}

ConvEpilogueOperands remaining_epilogue(const Node& n, Inputs in, ConvFusion fused) {
  const ConvEpilogueOperands all = node_epilogue(n, in);
  ConvEpilogueOperands e;
  if (fused == ConvFusion::none) e.bias = all.bias;
  if (fused != ConvFusion::epilogue) {
    e.activation = all.activation;
    e.residual = all.residual;
    e.residual_activation = all.residual_activation;
  }
  return e;
}

void record_epilogue(Context& ctx, const Node& n, ConvEpilogueOperands e, const DeviceTensor& y) {
  std::optional<DeviceTensor> bias;
  if (e.bias && !e.bias->is_contiguous()) {  // the kernel reads it flat
    bias = temporary_tensor(ctx, e.bias->dtype, e.bias->shape);
    copy_strided(ctx, *e.bias, *bias);
    e.bias = &*bias;
  }
  conv_epilogue(ctx, n, e, y);
}

std::string epilogue_text(const ConvEpilogueOperands& e) {
  std::string s;
  auto part = [&](const std::string& p) { s += (s.empty() ? "" : "+") + p; };
  if (e.bias) part("bias");
  if (e.activation) part(activation_name(e.activation.kind));
  if (e.residual) part("residual");
  if (e.residual_activation) part(activation_name(e.residual_activation.kind));
  return s;
}

std::optional<std::string> ConvEngine::variant_refusal(const std::string& variant) const {
  if (variant.empty()) return std::nullopt;
  const std::string known = variants();
  if (known.empty()) return cat(name(), " takes no variant (got '", variant, "')");
  return cat(name(), " has no variant '", variant, "' (its variants: ", known, ")");
}

ConvEnginePlan ConvEngine::plan(const ConvCall& call) const {
  return {call.variant, call.has_epilogue() ? ConvFusion::epilogue : ConvFusion::none};
}

std::string ConvEngine::describe(const ConvEnginePlan& plan) const {
  std::string s = name();
  if (!plan.variant.empty()) s += ":" + plan.variant;
  if (plan.fused != ConvFusion::none) s += cat(", ", conv_fusion_name(plan.fused), " fused");
  return s;
}

}  // namespace fusebox::cuda
