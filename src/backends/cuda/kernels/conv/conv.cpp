// conv_forward, conv_backward_data, conv_backward_filter: the problem (problem.h), the engine
// that runs it (engines.h: forced, autotuned or the default policy; engines.cpp states the
// rules), then what the engine left of the node's epilogue (bias, activation, residual:
// ir/ops.h ConvAttrs) as one pass over y (epilogue.cu). Every call adds a row to the
// process's decision record (report.h): the engine, how much of the epilogue it fused, its
// plan and why it was chosen.
//
// Layout. Inputs and the output may be strided (channels-last views): each engine takes them
// as they are or copies them into the layout its kernels read.
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/conv/engines.h"
#include "backends/cuda/kernels/conv/operand_layout.h"
#include "backends/cuda/kernels/conv/problem.h"
#include "backends/cuda/kernels/conv/report.h"

namespace fusebox::cuda {

namespace {

// The report's path: the engine, how it was chosen, what it fused, what ran after it:
// "cudnn (fused bias+relu)", "cudnn (fused bias) + epilogue kernel (relu)",
// "implicit_gemm (epilogue in kernel: bias+relu)", "cutlass (autotuned)",
// "direct + epilogue kernel (relu)".
std::string path_of(const ConvOutcome& o, const std::string& fused, const std::string& rest) {
  const bool cudnn = std::string(o.engine->name()) == "cudnn";
  std::string notes = o.how;
  auto note = [&](const std::string& n) { notes += (notes.empty() ? "" : ", ") + n; };
  if (!fused.empty()) note(cudnn ? cat("fused ", fused) : cat("epilogue in kernel: ", fused));
  std::string path = o.engine->name();
  if (!notes.empty()) path += cat(" (", notes, ")");
  if (!rest.empty()) path += cat(" + epilogue kernel (", rest, ")");
  return path;
}

void run_conv(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const ConvSettings settings = conv_settings();
  const std::vector<const DeviceTensor*> inputs(in.begin(), in.end());
  const ConvProblem p = make_conv_problem(n, inputs, out[0], settings, ctx.device.id());
  if (out[0].numel() == 0) return;
  const DeviceProperties& device = ctx.device.properties();
  ConvCall call;
  call.node = &n;
  call.problem = &p;
  call.geometry = conv_geometry_of(n, p.op, in, out[0]);
  call.in = in;
  call.out = out;
  call.epilogue = node_epilogue(n, in);
  call.device = {device.compute_capability(), device.sm_count};
  call.settings = &settings;

  const ConvOutcome o = run_conv_engines(ctx, call);

  const ConvEpilogueOperands all = node_epilogue(n, in);
  const ConvEpilogueOperands rest = remaining_epilogue(n, in, o.recorded.fused);
  const std::string rest_text = epilogue_text(rest);
  if (!rest_text.empty()) record_epilogue(ctx, n, rest, out[0]);
  // The parts the engine computed: the node's, less what is left.
  ConvEpilogueOperands fused;
  if (!rest.bias) fused.bias = all.bias;
  if (!rest.activation) fused.activation = all.activation;
  if (!rest.residual) fused.residual = all.residual;
  if (!rest.residual_activation) fused.residual_activation = all.residual_activation;
  const std::string fused_text = epilogue_text(fused);

  ConvDecision d;
  d.node = p.label;
  d.op = conv_op_name(p.op);
  d.problem = p.describe();
  d.path = path_of(o, fused_text, rest_text);
  d.plan = o.recorded.plan;
  // cuDNN's note says why it fused less than the node asked.
  const bool cudnn = std::string(o.engine->name()) == "cudnn";
  d.reason = cudnn && !rest_text.empty() ? o.recorded.reason : "";
  if (!o.reason.empty()) d.reason += cat(d.reason.empty() ? "" : "; ", o.reason);
  d.workspace_bytes = o.recorded.workspace_bytes;
  d.tuned_ms = o.tuned_ms;
  record_conv_decision(d);
}

}  // namespace

void conv_forward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  run_conv(ctx, n, in, out);
}

void conv_backward_data(Context& ctx, const Node& n, Inputs in, Outputs out) {
  run_conv(ctx, n, in, out);
}

void conv_backward_filter(Context& ctx, const Node& n, Inputs in, Outputs out) {
  run_conv(ctx, n, in, out);
}

}  // namespace fusebox::cuda
