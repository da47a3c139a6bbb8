// conv_forward, conv_backward_data, conv_backward_filter: the problem (problem.h), the engine
// that runs it (engines.h: forced, autotuned or the default policy; engines.cpp states the
// rules), then what the engine left of the node's epilogue (bias, activation, residual:
// ir/ops.h ConvAttrs) as one pass over y (epilogue.cu). Every call adds a row to the
// process's decision record (report.h): the engine, how much of the epilogue it fused, its
// plan and why it was chosen.
//
// Layout. Inputs and the output may be strided (channels-last views): each engine takes them
// as they are or copies them into the layout its kernels read.
//
// channel_stats (ir/ops.h: y's batch statistics as output 1): the statistics GEMM where it
// takes the problem and was timed faster, else the engines as above and the batch norm's
// statistics pass over y.
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/conv/engines.h"
#include "backends/cuda/kernels/conv/engines/cutlass_bn/stats_gemm.h"
#include "backends/cuda/kernels/conv/operand_layout.h"
#include "backends/cuda/kernels/conv/problem.h"
#include "backends/cuda/kernels/conv/report.h"
#include "backends/cuda/kernels/conv/selection.h"
#include "fusebox/core/compile_trace.h"

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

// `note`: why this call runs here (a channel_stats conv's timed choice), for the report.
void run_conv(Context& ctx, const Node& n, Inputs in, Outputs out, const std::string& note = "") {
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
  if (!note.empty()) d.reason += cat(d.reason.empty() ? "" : "; ", note);
  d.workspace_bytes = o.recorded.workspace_bytes;
  d.tuned_ms = o.tuned_ms;
  record_conv_decision(d);
}

// Why a conv with channel_stats (ir/ops.h) cannot take the statistics GEMM
// (cutlass_bn/stats_gemm.h), or nullopt: the GEMM is a bf16 1x1 stride-1 forward convolution
// over dense channels-last x and y with no epilogue, on compute capability 9.0; a forced
// engine or backend keeps its own path. (The kernel's own can_implement may still refuse.)
std::optional<std::string> statistics_gemm_refusal(Context& ctx, const Node& n, Inputs in,
                                                   Outputs out, const ConvSettings& settings) {
  if (!settings.engine.empty() || settings.backend != ConvBackend::automatic)
    return std::string("an engine or backend is forced (FUSEBOX_CONV_ENGINE, _BACKEND)");
  if (ctx.device.properties().compute_capability() != 90)
    return std::string("the statistics GEMM is sm_90a code (compute capability 9.0)");
  const DeviceTensor &x = *in[0], &w = *in[1], &y = out[0];
  if (x.dtype != DType::bf16) return std::string("not bf16");
  for (size_t i = 2; i < in.size(); ++i)
    if (in[i] != nullptr) return std::string("a bias or residual (no epilogue in the GEMM)");
  const ConvAttrs& a = conv_attrs_of(n);
  if (a.activation || a.residual_activation) return std::string("a fused activation");
  const ConvGeometry g = conv_geometry_of(n, ConvOp::fprop, in, y);
  bool plain = g.groups == 1 && x.shape.size() == 4;
  for (int d = 0; d < 3; ++d)
    plain = plain && g.filter[d] == 1 && g.stride[d] == 1 && g.dilation[d] == 1 &&
            g.pad_lo[d] == 0 && g.pad_hi[d] == 0;
  if (!plain) return std::string("not a 2-D 1x1 stride-1 convolution of one group");
  if (!x.is_channels_last() || !y.is_channels_last() || !w.is_channels_last())
    return std::string("x, w or y not dense channels-last");
  if (!aligned16(&x) || !aligned16(&w) || !aligned16(&y))
    return std::string("x, w or y not 16-byte aligned");
  return std::nullopt;
}

// A conv with channel_stats on the statistics GEMM: y and per-tile sums in one kernel, then
// the sums merged into the triples; or why not (statistics_gemm_refusal, the kernel's own).
std::optional<std::string> record_statistics_gemm(Context& ctx, const Node& n, Inputs in,
                                                  Outputs out, const ConvSettings& settings,
                                                  const std::string& note = "") {
  if (std::optional<std::string> why = statistics_gemm_refusal(ctx, n, in, out, settings))
    return why;
  const DeviceTensor &x = *in[0], &w = *in[1], &y = out[0];
  const ConvGeometry g = conv_geometry_of(n, ConvOp::fprop, in, y);
  const int64_t m = g.batch * g.out_size();
  const int64_t rows = cutlass_bn::stats_partial_rows(m);
  const int64_t pitch = cutlass_bn::stats_partial_cols(g.out_channels);
  const size_t bytes = size_t(rows * pitch) * sizeof(float);
  const BufferRange sums = ctx.encoder.temporary(ctx.allocator, bytes);
  const BufferRange squares = ctx.encoder.temporary(ctx.allocator, bytes);
  const cutlass_bn::StatsGemmCall call{m,
                                       g.out_channels,
                                       g.in_channels,
                                       x.data(),
                                       w.data(),
                                       y.data(),
                                       static_cast<float*>(sums.data()),
                                       static_cast<float*>(squares.data())};
  if (std::optional<std::string> why = cutlass_bn::record_stats_gemm(
          ctx, call, {x.range(), w.range()}, {y.range(), sums, squares}))
    return why;
  const BatchNormTileSums tile_sums{
      call.sums, call.squares, {sums, squares}, rows, pitch, cutlass_bn::kStatsTileM, m};
  channel_moments_from_tile_sums(ctx, node_label(n), tile_sums, g.out_channels, out[1]);

  const std::vector<const DeviceTensor*> inputs(in.begin(), in.end());
  const ConvProblem p = make_conv_problem(n, inputs, y, settings, ctx.device.id());
  ConvDecision d;
  d.node = p.label;
  d.op = conv_op_name(p.op);
  d.problem = p.describe();
  d.path = "cutlass_bn (statistics GEMM: y and its channel statistics)";
  d.plan = "128x64";
  d.reason = note;
  record_conv_decision(d);
  return std::nullopt;
}

// The engines' convolution, then the norm's statistics pass over y: the form every
// channel_stats conv can take.
void record_statistics_pass(Context& ctx, const Node& n, Inputs in, Outputs out,
                            const std::string& note = "") {
  run_conv(ctx, n, in, out.first(1), note);
  channel_moments(ctx, node_label(n), out[0], out[1]);
}

std::optional<bool> g_statistics_form_override;  // set_statistics_form_override (tests)

// A channel_stats conv's form where the statistics GEMM takes it: the faster of the GEMM and
// the statistics pass form, each timed as a replayed graph (selection.h time_own_conv) the
// first time a problem is met in the process, then kept. Timed, not ruled: which is faster
// differs by GPU (ResNet-50's 56x56 layers gain on an H100 and lose on an H200, where the
// statistics pass costs less against the GEMM's epilogue: docs/fusion.md).
struct StatisticsForm {
  bool gemm = true;
  std::string note;  // the report's: both times, or why not timed
};

StatisticsForm choose_statistics_form(Context& ctx, const Node& n, Inputs in, Outputs out,
                                      const ConvSettings& settings) {
  if (g_statistics_form_override)
    return {*g_statistics_form_override, "form forced (set_statistics_form_override)"};
  const std::vector<const DeviceTensor*> inputs(in.begin(), in.end());
  const std::string key =
      make_conv_problem(n, inputs, out[0], settings, ctx.device.id()).describe();
  static std::mutex mutex;
  static std::map<std::string, StatisticsForm> chosen;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = chosen.find(key); it != chosen.end()) return it->second;
  }
  // The candidates' recordings are timing's, not the node's: their decisions are not kept.
  auto timed = [&](const char* what, double bound_ms, auto&& record) -> std::optional<double> {
    TracePhase trace("conv channel statistics: time the ", what);
    std::string plan;
    try {
      return time_own_conv(
          ctx,
          [&](Context& scratch) {
            const MutedConvDecisions muted;
            record(scratch);
            return std::string(what);
          },
          plan, bound_ms);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fusebox: %s: timing the %s failed (%s)\n", node_label(n).c_str(), what,
                   e.what());
      return std::nullopt;
    }
  };
  StatisticsForm form;
  const std::optional<double> gemm_ms =
      timed("statistics GEMM", std::numeric_limits<double>::infinity(), [&](Context& scratch) {
        if (std::optional<std::string> why = record_statistics_gemm(scratch, n, in, out, settings))
          throw Error(node_label(n), *why);
      });
  const std::optional<double> pass_ms =
      gemm_ms ? timed("convolution + statistics pass", *gemm_ms,
                      [&](Context& scratch) { record_statistics_pass(scratch, n, in, out); })
              : std::nullopt;
  if (gemm_ms && pass_ms) {
    char text[128];
    std::snprintf(text, sizeof text,
                  "timed: statistics GEMM %.4f ms, convolution + statistics pass %.4f ms", *gemm_ms,
                  *pass_ms);
    form.gemm = *gemm_ms <= *pass_ms;
    form.note = text;
  } else {
    // No graphs to time on (FUSEBOX_CUDA_GRAPHS=0), or a form failed: the GEMM if it timed.
    form.gemm = gemm_ms.has_value() || !ctx.encoder.options().use_graphs;
    form.note = ctx.encoder.options().use_graphs ? "not timed: a form failed to record"
                                                 : "not timed (no CUDA graphs)";
  }
  std::lock_guard<std::mutex> lock(mutex);
  return chosen.emplace(key, form).first->second;
}

}  // namespace

void set_statistics_form_override(std::optional<bool> gemm) {
  g_statistics_form_override = gemm;
}

// A conv with channel_stats takes the statistics GEMM where it can and was timed faster
// (choose_statistics_form), else its engines and then the norm's statistics pass over y (the
// same triples, as the norm would have computed them).
void conv_forward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  if (!conv_attrs_of(n).channel_stats) return run_conv(ctx, n, in, out);
  FUSEBOX_CHECK(out.size() == 2 && in.size() >= 2 && in[0] && in[1], node_label(n),
                "expects (x, w, ...) -> (y, channel statistics)");
  if (out[0].numel() == 0) return;
  const ConvSettings settings = conv_settings();
  if (statistics_gemm_refusal(ctx, n, in, out, settings))
    return record_statistics_pass(ctx, n, in, out);
  const StatisticsForm form = choose_statistics_form(ctx, n, in, out, settings);
  if (form.gemm && !record_statistics_gemm(ctx, n, in, out, settings, form.note)) return;
  record_statistics_pass(ctx, n, in, out, form.note);
}

void conv_backward_data(Context& ctx, const Node& n, Inputs in, Outputs out) {
  run_conv(ctx, n, in, out);
}

void conv_backward_filter(Context& ctx, const Node& n, Inputs in, Outputs out) {
  run_conv(ctx, n, in, out);
}

}  // namespace fusebox::cuda
