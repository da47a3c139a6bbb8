// conv_forward, conv_backward_data, conv_backward_filter: the dispatcher between cuDNN
// (cudnn/conv_graph.cpp) and the project's direct kernels (kernels/conv/direct.cu).
//
// Path. FUSEBOX_CONV_BACKEND=own runs the project's kernels; otherwise the problem
// (kernels/conv/problem.h) goes to cuDNN unless cudnn_cannot_implement names a reason (f64, ...),
// and the project's kernels run when cuDNN has no plan, a plan fails to build or to run.
// Depthwise problems (groups == C == K) under own go to kernels/conv/depthwise/ first
// (memory-bound ops where an implicit GEMM's K would be a few taps), and there by default
// too where depthwise_beats_cudnn names them measured faster than cuDNN. Under autotuning
// (FUSEBOX_AUTOTUNE, backend unset), our kernel and cuDNN's engines are timed, and the
// faster runs (kernels/conv/selection.h: the decision is cached in memory and on disk).
// The project's kernels: the implicit GEMM (kernels/conv/implicit_gemm/, tensor cores, the
// whole epilogue fused), else (f64, what igemm::cannot_implement names) the direct kernel,
// the test oracle, with the epilogue as a second pass. The
// decision is cached with its reason (the plan caches hold refusals too) and logged once
// per problem; with FUSEBOX_CONV_BACKEND=cudnn a refusal is an Error naming the node and
// cuDNN's message. Every call adds a row to the process's decision record (kernels/conv/report.h).
//
// Epilogue (a conv's bias, activation, residual: ir/ops.h ConvAttrs). cuDNN is asked for
// the most fused graph first (cudnn/plans.cpp); whatever the plan leaves, and everything
// after a direct kernel but its bias, runs as one pass over y (kernels/conv/epilogue.cu).
// The report names what was fused and why the rest was not.
//
// Layout. Inputs and the output may be strided (channels-last views): cuDNN takes their
// strides as they are; the direct kernels get contiguous copies (and write a contiguous
// temporary that is copied into a strided output).
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <optional>

#include "backends/cuda/cudnn/conv.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/conv/depthwise/depthwise.h"
#include "backends/cuda/kernels/conv/direct.h"
#include "backends/cuda/kernels/conv/implicit_gemm/implicit_gemm.h"
#include "backends/cuda/kernels/conv/problem.h"
#include "backends/cuda/kernels/conv/report.h"
#include "backends/cuda/kernels/conv/selection.h"

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

// What the node's epilogue asks for beyond the convolution, given how much of it a cuDNN
// plan computed (`fused`); the direct kernels add the bias themselves (kBiasDone).
ConvEpilogueOperands remaining_epilogue(const Node& n, const std::vector<const DeviceTensor*>& in,
                                        ConvFusion fused) {
  ConvEpilogueOperands e;
  if (n.op != OpKind::conv) {
    if (fused == ConvFusion::none && in.size() > 2) e.bias = in[2];  // dgrad's bias
    return e;
  }
  const auto& a = std::get<ConvAttrs>(n.attrs);
  if (fused == ConvFusion::none && in.size() > 2) e.bias = in[2];
  if (fused != ConvFusion::epilogue) {
    e.activation = a.activation;
    e.residual = in.size() > 3 ? in[3] : nullptr;
    e.residual_activation = a.residual_activation;
  }
  return e;
}

// The epilogue's parts, as the report names them ("bias+relu+residual+relu").
std::string epilogue_text(const ConvEpilogueOperands& e) {
  std::string s;
  auto part = [&](const std::string& p) { s += (s.empty() ? "" : "+") + p; };
  if (e.bias) part("bias");
  if (e.activation) part(activation_name(e.activation.kind));
  if (e.residual) part("residual");
  if (e.residual_activation) part(activation_name(e.residual_activation.kind));
  return s;
}

// Runs the epilogue's remaining parts on y (a contiguous bias first: a kernel reads it flat).
void run_epilogue(Context& ctx, const Node& n, ConvEpilogueOperands e, const DeviceTensor& y) {
  std::optional<DeviceTensor> bias;
  if (e.bias && !e.bias->is_contiguous()) {
    bias = contiguous_copy(ctx, *e.bias);
    e.bias = &*bias;
  }
  conv_epilogue(ctx, n, e, y);
}

// Our candidate for autotuning: the depthwise kernels where they apply, else the implicit
// GEMM with the whole epilogue. Why neither takes the problem, or nullopt.
std::optional<std::string> own_candidate_refusal(const Node& n, ConvOp op, Inputs in,
                                                 const DeviceTensor& out) {
  if (!depthwise_cannot_implement(n, op, in, out)) return std::nullopt;
  return implicit_gemm_cannot_implement(n, op, in, out);
}
std::string record_own_candidate(Context& ctx, const Node& n, ConvOp op, Inputs in, Outputs out,
                                 const ConvEpilogueOperands& all, const ConvSettings& settings) {
  if (!depthwise_cannot_implement(n, op, in, out[0]))
    return run_depthwise(ctx, n, op, in, out, all);
  return run_implicit_gemm(ctx, n, op, in, out, all, settings);
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
  // Depthwise problems: the project's NHWC kernels under FUSEBOX_CONV_BACKEND=own, and by
  // default (no autotuning, no forced cuDNN plan) where depthwise_beats_cudnn names them
  // measured faster than cuDNN. Under autotuning both are timed below.
  const ConvEpilogueOperands all = remaining_epilogue(n, inputs, ConvFusion::none);
  const bool own_backend = settings.backend == ConvBackend::own;
  if (own_backend && !depthwise_cannot_implement(n, p.op, in, out[0])) {
    d.path = "own (depthwise)";
    d.reason = "FUSEBOX_CONV_BACKEND=own";
  } else if (settings.backend == ConvBackend::automatic && !settings.autotune &&
             p.forced_plan_index < 0 && depthwise_beats_cudnn(n, p.op, in, out[0], all)) {
    d.path = "own (depthwise)";
    d.reason = "measured faster than cuDNN for this kind of problem (depthwise_beats_cudnn)";
  }
  if (!d.path.empty()) {
    d.plan = run_depthwise(ctx, n, p.op, in, out, all);
    record_conv_decision(d);
    return;
  }
  std::optional<std::string> why;
  if (own_backend) {
    why = "FUSEBOX_CONV_BACKEND=own";
  } else {
    why = cudnn_cannot_implement(p);
    if (why && settings.backend == ConvBackend::cudnn) {
      throw Error(p.label, cat("FUSEBOX_CONV_BACKEND=cudnn, but cuDNN cannot run ", p.describe(),
                               ": ", *why));
    }
  }
  // `all`: our kernel's whole epilogue (the implicit GEMM and depthwise kernels fuse it).
  if (!why) {
    ConvOperands t;
    const DeviceTensor* bias = inputs.size() > 2 ? inputs[2] : nullptr;
    switch (p.op) {
      case ConvOp::fprop:
        t = {inputs[0], inputs[1], &out[0], bias, inputs.size() > 3 ? inputs[3] : nullptr};
        break;
      case ConvOp::dgrad:
        t = {&out[0], inputs[1], inputs[0], bias};
        break;
      case ConvOp::wgrad:
        t = {inputs[0], &out[0], inputs[1], nullptr};
        break;
    }
    // Autotuning: our kernel timed first, so cuDNN's tuned plan is recorded only if faster.
    std::optional<ConvSelection> selected;
    std::optional<double> own_ms;
    std::string own_plan;
    if (settings.backend == ConvBackend::automatic && settings.autotune &&
        p.forced_plan_index < 0 && !own_candidate_refusal(n, p.op, in, out[0])) {
      selected = find_conv_selection(p);
      try {
        if (!selected)
          own_ms = time_own_conv(
              ctx,
              [&](Context& scratch) {
                return record_own_candidate(scratch, n, p.op, in, out, all, settings);
              },
              own_plan);
      } catch (const std::exception& ex) {
        // Our kernel could not be timed (out of memory for its temporaries, say): cuDNN
        // alone, as without autotuning; a broken context fails the next call anyway.
        std::fprintf(stderr,
                     "fusebox: %s: timing the project's kernel failed (%s); cuDNN runs it\n",
                     p.label.c_str(), ex.what());
      }
    }
    auto record_selected_own = [&] {
      d.path = "own (autotuned)";
      d.reason = selected->describe();
      d.tuned_ms = selected->own_ms;
      d.plan = record_own_candidate(ctx, n, p.op, in, out, all, settings);
      record_conv_decision(d);
    };
    if (selected && selected->own) return record_selected_own();
    const CudnnConvOutcome r = cudnn_conv_record(ctx, p, t, settings, own_ms);
    if (own_ms && (r.ran || r.slower)) {
      selected = ConvSelection{r.slower, *own_ms, r.tuned_ms, own_plan, r.plan};
      store_conv_selection(p, *selected);
      std::fprintf(stderr, "fusebox: %s: %s\n", p.label.c_str(), selected->describe().c_str());
    }
    if (r.slower) return record_selected_own();
    if (r.ran) {
      const ConvEpilogueOperands rest = remaining_epilogue(n, inputs, r.fused);
      const std::string fused_text = epilogue_text(remaining_epilogue(n, inputs, ConvFusion::none));
      const std::string rest_text = epilogue_text(rest);
      d.path = "cudnn";
      if (r.fused != ConvFusion::none) d.path = cat("cudnn (fused ", fused_text, ")");
      if (!rest_text.empty()) {
        run_epilogue(ctx, n, rest, out[0]);
        d.path = cat("cudnn", r.fused == ConvFusion::bias ? " (fused bias)" : "",
                     " + epilogue kernel (", rest_text, ")");
        d.reason = r.reason;
      }
      d.plan = r.lowering == ConvLowering::standard
                   ? r.plan
                   : cat(r.plan, " (", conv_lowering_name(r.lowering), ")");
      d.workspace_bytes = r.workspace_bytes;
      d.tuned_ms = r.tuned_ms;
      if (selected) d.reason += (d.reason.empty() ? "" : "; ") + selected->describe();
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
  // The implicit GEMM computes the whole epilogue in its own epilogue.
  const std::optional<std::string> igemm_refusal =
      implicit_gemm_cannot_implement(n, p.op, in, out[0]);
  if (!igemm_refusal) {
    d.plan = run_implicit_gemm(ctx, n, p.op, in, out, all, settings);
    if (!epilogue_text(all).empty())
      d.path = cat("own (epilogue in kernel: ", epilogue_text(all), ")");
    record_conv_decision(d);
    return;
  }
  // What the implicit GEMM cannot take (f64, ...) runs on the direct kernel, the test oracle.
  d.plan = "direct";
  d.reason = cat(*why, "; implicit GEMM: ", *igemm_refusal);
  if (settings.backend == ConvBackend::own) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      std::fprintf(stderr,
                   "fusebox: %s: FUSEBOX_CONV_BACKEND=own runs %s on the direct kernel (%s)\n",
                   p.label.c_str(), p.describe().c_str(), igemm_refusal->c_str());
    });
  }
  // The direct kernels take x, w and the bias; the rest of the epilogue is a pass over y.
  run_direct(ctx, n, in.subspan(0, std::min<size_t>(in.size(), 3)), out, direct);
  ConvEpilogueOperands rest = remaining_epilogue(n, inputs, ConvFusion::bias);
  if (!epilogue_text(rest).empty()) {
    run_epilogue(ctx, n, rest, out[0]);
    d.path = cat("own + epilogue kernel (", epilogue_text(rest), ")");
  }
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
