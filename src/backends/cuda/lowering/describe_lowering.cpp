// cuda::describe_lowering (fusebox/backends/cuda.h): the intended lowering of a node, as
// dispatch.cpp routes it.
#include "fusebox/backends/cuda.h"

#include <vector>

namespace fusebox::cuda {
namespace {

bool has_input(const Node& n, size_t i) {
  return i < n.inputs.size() && n.inputs[i] != kNoValue;
}

std::string join_ops(const std::vector<std::string>& ops) {
  std::string s;
  for (const std::string& op : ops) s += (s.empty() ? "" : "+") + op;
  return s;
}

}  // namespace

std::string describe_lowering(const Node& n) {
  std::vector<std::string> parts;
  switch (n.op) {
    case OpKind::conv: {
      const auto& a = std::get<ConvAttrs>(n.attrs);
      if (a.channel_stats)
        return "CUTLASS statistics GEMM conv_fprop + channel statistics (else the engines, then "
               "the norm's statistics pass)";
      parts.push_back("conv_fprop");
      if (has_input(n, 2)) parts.push_back("bias");
      if (a.activation) parts.push_back(activation_name(a.activation.kind));
      if (has_input(n, 3)) parts.push_back("residual");
      if (a.residual_activation) parts.push_back(activation_name(a.residual_activation.kind));
      return parts.size() > 1 ? "cuDNN graph " + join_ops(parts) : "cuDNN conv_fprop";
    }
    case OpKind::batch_norm: {
      parts.push_back("batch_norm");
      if (has_input(n, 5)) parts.push_back("residual");
      if (std::get<BatchNormAttrs>(n.attrs).relu) parts.push_back("relu");
      if (has_input(n, 6)) return "own kernel " + join_ops(parts) + " (statistics given)";
      return "own kernel " + join_ops(parts);
    }
    case OpKind::batch_norm_apply:
      return std::get<BatchNormAttrs>(n.attrs).relu
                 ? "own kernel batch_norm (apply from saved statistics) + relu"
                 : "own kernel batch_norm (apply from saved statistics)";
    case OpKind::gemm: {
      const auto& a = std::get<GemmAttrs>(n.attrs);
      parts.push_back("gemm");
      const bool bias = has_input(n, 2) && a.beta != 0.0;
      if (bias) parts.push_back("bias");
      if (a.activation) parts.push_back(activation_name(a.activation.kind));
      // matmul.cpp: a [N] bias with beta 1 and relu / gelu_tanh are cuBLASLt epilogues
      // (where it has an algorithm and the bias is 16-byte aligned); other activations a pass.
      const bool activation_in_epilogue =
          a.activation.kind == Activation::relu || a.activation.kind == Activation::gelu_tanh;
      return "cuBLASLt " + join_ops(parts) + (bias || activation_in_epilogue ? " (epilogue)" : "") +
             (a.y_dtype ? cat(", ", dtype_name(*a.y_dtype), " store") : "") +
             (a.activation && !activation_in_epilogue ? " + activation kernel" : "");
    }
    case OpKind::fused_pointwise:
      return cat("generated kernel (", std::get<PointwiseProgram>(n.attrs).instrs.size(), " ops, ",
                 n.inputs.size(), " inputs)");
    case OpKind::attention:
      // kernels/attention/attention.cu: the short-sequence kernel first where it applies.
      return "the short-sequence attention kernel (bf16/f16, Tq, Tk, d, dv <= 64), else cuDNN "
             "fused attention (SDPA), else the project's attention kernel";
    default:
      return "own kernel";
  }
}

}  // namespace fusebox::cuda
