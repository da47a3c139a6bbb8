// conv_forward, conv_backward_data, conv_backward_filter: the dispatcher between cuDNN
// (cudnn/conv_graph.cpp) and the project's direct kernels (kernels/conv/direct.cu).
//
// Path. FUSEBOX_CONV_BACKEND=own runs the direct kernel; otherwise the problem
// (kernels/conv/problem.h) goes to cuDNN unless cudnn_cannot_implement names a reason (f64, ...),
// and the direct kernel runs when cuDNN has no plan, a plan fails to build or to run. The
// decision is cached with its reason (the plan caches hold refusals too) and logged once
// per problem; with FUSEBOX_CONV_BACKEND=cudnn a refusal is an Error naming the node and
// cuDNN's message. Every call adds a row to the process's decision record (kernels/conv/report.h).
//
// Layout. Inputs and the output may be strided (channels-last views): cuDNN takes their
// strides as they are; the direct kernels get contiguous copies (and write a contiguous
// temporary that is copied into a strided output).
#include <cstdio>

#include "backends/cuda/cudnn/conv.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/conv/direct.h"
#include "backends/cuda/kernels/conv/problem.h"
#include "backends/cuda/kernels/conv/report.h"

namespace fusebox::cuda {

namespace {

using DirectEntry = void (*)(Context&, const Node&, Inputs, Outputs);

DeviceTensor contiguous_copy(Context& ctx, const DeviceTensor& t) {
  DeviceTensor copy = temporary_tensor(ctx, t.dtype, t.shape);
  copy_strided(ctx, t, copy);
  return copy;
}

// The direct kernel on contiguous operands.
void run_direct(Context& ctx, const Node& n, Inputs in, Outputs out, DirectEntry entry) {
  std::vector<DeviceTensor> copies;
  copies.reserve(in.size() + 1);
  std::vector<const DeviceTensor*> inputs(in.begin(), in.end());
  for (const DeviceTensor*& t : inputs) {
    if (t != nullptr && !t->is_contiguous()) {
      copies.push_back(contiguous_copy(ctx, *t));
      t = &copies.back();
    }
  }
  DeviceTensor& y = out[0];
  if (y.is_contiguous()) return entry(ctx, n, inputs, out);
  DeviceTensor tmp = temporary_tensor(ctx, y.dtype, y.shape);
  entry(ctx, n, inputs, std::span<DeviceTensor>(&tmp, 1));
  copy_strided(ctx, tmp, y);
}

void run_conv(Context& ctx, const Node& n, Inputs in, Outputs out, DirectEntry direct) {
  const ConvSettings settings = conv_settings();
  const std::vector<const DeviceTensor*> inputs(in.begin(), in.end());
  const ConvProblem p = make_conv_problem(n, inputs, out[0], settings, ctx.device.id());
  if (out[0].numel() == 0) return;
  ConvDecision d;
  d.node = p.label;
  d.op = conv_op_name(p.op);
  d.problem = p.describe();
  std::optional<std::string> why;
  if (settings.backend == ConvBackend::own) {
    why = "FUSEBOX_CONV_BACKEND=own";
  } else {
    why = cudnn_cannot_implement(p);
    if (why && settings.backend == ConvBackend::cudnn) {
      throw Error(p.label, cat("FUSEBOX_CONV_BACKEND=cudnn, but cuDNN cannot run ", p.describe(),
                               ": ", *why));
    }
  }
  if (!why) {
    ConvOperands t;
    const DeviceTensor* bias = inputs.size() > 2 ? inputs[2] : nullptr;
    switch (p.op) {
      case ConvOp::fprop:
        t = {inputs[0], inputs[1], &out[0], bias};
        break;
      case ConvOp::dgrad:
        t = {&out[0], inputs[1], inputs[0], bias};
        break;
      case ConvOp::wgrad:
        t = {inputs[0], &out[0], inputs[1], nullptr};
        break;
    }
    const CudnnConvOutcome r = cudnn_conv_record(ctx, p, t, settings);
    if (r.ran) {
      d.path = "cudnn";
      if (p.bias.present && !r.bias_fused) {
        const DeviceTensor& b = *t.bias;
        if (b.is_contiguous()) {
          conv_add_bias(ctx, n, b, out[0]);
        } else {
          conv_add_bias(ctx, n, contiguous_copy(ctx, b), out[0]);
        }
        d.path = "cudnn + bias kernel";
      }
      d.plan = r.lowering == ConvLowering::standard
                   ? r.plan
                   : cat(r.plan, " (", conv_lowering_name(r.lowering), ")");
      d.workspace_bytes = r.workspace_bytes;
      d.tuned_ms = r.tuned_ms;
      record_conv_decision(d);
      return;
    }
    if (settings.backend == ConvBackend::cudnn) {
      throw Error(p.label, cat("FUSEBOX_CONV_BACKEND=cudnn, but cuDNN refused ", p.describe(), ": ",
                               r.reason));
    }
    why = "cuDNN: " + r.reason;
    if (r.first_use) {
      std::fprintf(stderr, "fusebox: %s: %s runs on the direct kernel (%s)\n", p.label.c_str(),
                   p.describe().c_str(), why->c_str());
    }
  }
  d.path = "own";
  d.reason = *why;
  run_direct(ctx, n, in, out, direct);
  record_conv_decision(d);
}

}  // namespace

void conv_forward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  run_conv(ctx, n, in, out, &conv_forward_direct);
}

void conv_backward_data(Context& ctx, const Node& n, Inputs in, Outputs out) {
  run_conv(ctx, n, in, out, &conv_backward_data_direct);
}

void conv_backward_filter(Context& ctx, const Node& n, Inputs in, Outputs out) {
  run_conv(ctx, n, in, out, &conv_backward_filter_direct);
}

}  // namespace fusebox::cuda
