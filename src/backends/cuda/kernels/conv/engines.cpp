// THE list of convolution engines and the default policy over them (engines.h).
//
// Order of preference (conv_engines()):
//   depthwise       only where a rule below names it (FUSEBOX_CONV_BACKEND=own: wherever it
//                   applies); memory-bound ops an implicit GEMM would run with a K of a few taps
//   cudnn           everything it takes (unless FUSEBOX_CONV_BACKEND=own); may decline while
//                   recording (no plan builds): the list goes on
//   halo_wgrad      where halo_wgrad::preferred (64 filters; CUTLASS's wgrad is faster above)
//   patch_wgrad     wherever it applies (an RGB stem's 7x7 wgrad)
//   phase_dgrad     wherever it applies (3x3 stride-2 dgrad without a bias)
//   space_to_depth  few-channel problems it can widen (an RGB stem), ahead of im2col: a third
//                   of im2col's bytes
//   im2col          other few-channel problems on the CUTLASS kernels
//   cutlass         the CUTLASS Hopper kernels; may decline while recording (CUTLASS's own
//                   can_implement)
//   implicit_gemm   the project's main loops: every float problem under 2^31 elements
//   direct          the rest (f64, ...): the test oracle
// Once cuDNN has been passed over or declined, depthwise is not a candidate again: the
// engines after it are the "own" path that cuDNN's refusals fall back to.
//
// Depthwise rules (FUSEBOX_CONV_BACKEND unset, no autotuning, no forced cuDNN plan):
//  1. A depthwise fprop with an epilogue (bias, activation, residual) runs on the depthwise
//     engine, which computes the epilogue in the same pass. cuDNN runs a fused grouped
//     convolution graph on its generic engine eng0 only: EfficientNet-B0's 96-channel 112x112
//     depthwise layer (bf16, batch 256, bias + SiLU) took 5.2 ms there against 0.22 ms on the
//     depthwise kernel; unfused, cuDNN's convolution would be followed by a pass over y that
//     alone reads and writes more bytes than the depthwise kernel's whole pass.
//  2. Elsewhere, where the depthwise kernels were measured faster than cuDNN's best engine on
//     every shape (bf16, f16 runs the same loop; bench/results/2026-11-25_h100_session14/,
//     2026-11-28_h200_session19/, 2026-11-28_h200_session21_dw_wgrad_sweep/): dgrad at stride 1
//     (1.5-2.6x); fprop at stride 1 with a 7-wide filter, or a 3-wide one on the ring kernel;
//     3- and 7-wide weight gradients on the ring kernel (7-wide: 0.99-1.35x cuDNN's best plan,
//     where cuDNN's heuristic plan ran ConvNeXt-T's 96-channel 56x56 wgrad (bf16, batch 128) in
//     2.25 ms). f32: cuDNN; other bf16/f16 shapes: rule 4.
//
//  3. A patchify fprop (every filter extent equal to its stride, no padding or dilation, one
//     group: ViT's 16x16/16 patch embedding, Swin's and ConvNeXt's 4x4/4 stems) passes cuDNN
//     over where space_to_depth takes it: its im2col is a permutation of x, so the problem
//     is one GEMM over C * R channels. cuDNN ran ViT-B/16's (3 -> 768 channels, bf16, batch
//     128) at 0.89 ms on an H200, ~33 TFLOP/s.
//
//  4. Where cuDNN's heuristics are known to pick slow plans, bf16/f16 problems are timed as
//     autotuning times them even with FUSEBOX_AUTOTUNE unset (a few distinct problems per
//     model, each timed once and cached on disk with the other decisions):
//     - a grouped convolution (1 < groups, not depthwise: RegNet's, ResNeXt's), any op: the
//       heuristics put RegNetY-1.6GF's fused grouped fprops (group width 24, bias + ReLU) on
//       eng10/eng41 at ~12 TFLOP/s (block1-0: 2.32 ms; whole model 30.7 ms), where cuDNN's
//       own eng52 runs them in 0.48 ms and the implicit GEMM in 0.51 (whole model autotuned
//       15.2 ms; H200, batch 256, bench/results/2026-11-29_h200_issue40_session31/);
//     - a strided fprop or wgrad over few channels (an RGB stem: C <= 4, a stride > 1): the
//       fused 7x7/2 stem of DenseNet-121 and ResNet-50 ran on eng10 at 1.93 ms (~16 TFLOP/s,
//       batch 256), and space-to-depth measured 2.13x cuDNN's best plan on that stem (session
//       25); the stem's wgrad ran on the heuristics' eng33 at 1.11 ms (batch 256, ~54
//       TFLOP/s, 3% of ResNet-50's training step), where the patch wgrad measured 1.56x
//       cuDNN's best plan (batch 64, session 25).
//     - a depthwise convolution rules 1 and 2 leave to cuDNN (strided dgrads, 5-wide or
//       rows-kernel wgrads, fprops with neither an epilogue nor a measured shape): its
//       heuristics' plan for a depthwise wgrad was 10-20x the depthwise kernel (ConvNeXt-T
//       above), so nothing but a timing decides between them.
//     Rule 4 times the heuristics' first kRule4Candidates (8) cuDNN plans, not autotuning's 48,
//     and of them only those cuDNN does not compile when it builds the plan (behaviour note
//     RUNTIME_COMPILATION; all of them where none other builds): building EfficientNet-B0's
//     runtime-compiled candidates took 5.3 s of its 13.9 s cold first step (H200, session 50;
//     10.8-11.75 s without them, the step unchanged). FUSEBOX_CONV_RULE4_RUNTIME_COMPILED=1
//     times them too.
//
// Autotuning (FUSEBOX_AUTOTUNE, FUSEBOX_CONV_BACKEND unset, cuDNN takes the problem): every
// engine but cuDNN and the direct kernel that accepts the problem, fused or unfused, is
// timed; cuDNN records its tuned plan only if faster than the fastest (selection.h). The
// decision is cached in memory and on disk.
#include "backends/cuda/kernels/conv/engines.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <mutex>
#include <vector>

#include "backends/cuda/kernels/conv/engines/depthwise/plan.h"
#include "backends/cuda/kernels/conv/engines/engine_list.h"
#include "backends/cuda/kernels/conv/engines/halo_wgrad/plan.h"
#include "backends/cuda/kernels/conv/selection.h"
#include "fusebox/core/compile_trace.h"

namespace fusebox::cuda {

std::span<const ConvEngine* const> conv_engines() {
  static const ConvEngine* const list[] = {&depthwise_engine(),     &cudnn_engine(),
                                           &halo_wgrad_engine(),    &patch_wgrad_engine(),
                                           &phase_dgrad_engine(),   &space_to_depth_engine(),
                                           &im2col_engine(),        &cutlass_engine(),
                                           &implicit_gemm_engine(), &direct_engine()};
  return list;
}

const ConvEngine* find_conv_engine(std::string_view name) {
  for (const ConvEngine* e : conv_engines())
    if (name == e->name()) return e;
  return nullptr;
}

std::string conv_engine_names() {
  std::string names;
  for (const ConvEngine* e : conv_engines()) names += cat(names.empty() ? "" : ", ", e->name());
  return names;
}

const ConvEngine& checked_conv_engine(const ConvEngineChoice& choice, std::string_view setting,
                                      const std::string& where) {
  const ConvEngine* e = find_conv_engine(choice.name);
  FUSEBOX_CHECK(e != nullptr, where, setting, "='", choice.text(),
                "' names no engine (known: ", conv_engine_names(), ")");
  if (auto why = e->variant_refusal(choice.variant))
    throw Error(where, cat(setting, "='", choice.text(), "': ", *why));
  return *e;
}

namespace {

struct EngineOverride {
  std::mutex mutex;
  std::optional<ConvEngineChoice> choice;
};

EngineOverride& engine_override() {
  static EngineOverride* o = new EngineOverride;  // never destroyed: read at exit too
  return *o;
}

}  // namespace

void set_conv_engine_override(std::optional<ConvEngineChoice> choice) {
  EngineOverride& o = engine_override();
  std::lock_guard lock(o.mutex);
  o.choice = std::move(choice);
}

std::optional<ConvEngineChoice> conv_engine_override() {
  EngineOverride& o = engine_override();
  std::lock_guard lock(o.mutex);
  return o.choice;
}

namespace {

// Which engines the policy may take.
enum class Scope {
  all,          // FUSEBOX_CONV_BACKEND unset: the rules above
  own,          // FUSEBOX_CONV_BACKEND=own, or replaying "the project's kernel" of an old
                // autotuning decision: every engine but cuDNN, depthwise wherever it applies
  cudnn,        // FUSEBOX_CONV_BACKEND=cudnn
  after_cudnn,  // cuDNN declined under autotuning: the engines after it
};

// Rule 1 (see the top of the file).
bool depthwise_fuses_epilogue(const ConvCall& call) {
  return call.op() == ConvOp::fprop && call.has_epilogue();
}

// Rule 2: measured faster than cuDNN.
bool depthwise_measured_faster(const ConvCall& call) {
  const DType dtype = call.dtype();
  if (dtype != DType::bf16 && dtype != DType::f16) return false;  // f32: not measured
  const ConvGeometry& g = call.geometry;
  const ConvOp op = call.op();
  const std::pair<int, int> rows = depthwise::rows_kernel_shape(g, op);
  if (rows.first == 0) return false;
  if (op == ConvOp::dgrad) return true;  // rows_kernel_shape: stride 1 on every dim
  const int v = depthwise::vector_width(dtype);
  if (op == ConvOp::wgrad)
    return (rows.first == 3 || rows.first == 7) && depthwise::ring_shape(g, op, rows, v);
  const ConvEpilogueOperands& e = call.epilogue;
  if (e.activation || e.residual != nullptr || rows.second != 1) return false;
  return rows.first == 7 || (rows.first == 3 && depthwise::ring_shape(g, op, rows, v));
}

// Rule 3: why cuDNN is passed over for a patchify problem, or nullopt.
std::optional<std::string> patchify_passes_cudnn_over(const ConvCall& call) {
  const ConvSettings& s = *call.settings;
  if (s.autotune || s.forced_plan_index >= 0 || call.op() != ConvOp::fprop) return std::nullopt;
  const ConvGeometry& g = call.geometry;
  if (g.groups != 1) return std::nullopt;
  for (int d = 0; d < 3; ++d) {
    if (g.filter[d] != g.stride[d] || g.dilation[d] != 1 || g.pad_lo[d] != 0 || g.pad_hi[d] != 0)
      return std::nullopt;
  }
  if (g.filter_size() == 1 || space_to_depth_engine().cannot_implement(call)) return std::nullopt;
  return std::string(
      "a patchify convolution (filter == stride) runs as one GEMM on space_to_depth "
      "(engines.cpp, rule 3)");
}

// Rule 4: why this call is timed though autotuning is off, or nullopt.
std::optional<std::string> timed_by_default(const ConvCall& call) {
  const ConvSettings& s = *call.settings;
  if (s.autotune || s.forced_plan_index >= 0) return std::nullopt;
  const DType dtype = call.dtype();
  if (dtype != DType::bf16 && dtype != DType::f16) return std::nullopt;
  const ConvGeometry& g = call.geometry;
  if (g.groups > 1 && (g.in_per_group() > 1 || g.out_per_group() > 1))
    return std::string(
        "a grouped convolution: timed, not the heuristics' plan (engines.cpp, rule 4)");
  if (!depthwise_engine().cannot_implement(call) && !depthwise_fuses_epilogue(call) &&
      !depthwise_measured_faster(call))
    return std::string(
        "a depthwise convolution no rule routes: timed, not the heuristics' plan (engines.cpp, "
        "rule 4)");
  bool strided = false;
  for (int d = 0; d < 3; ++d) strided = strided || g.stride[d] > 1;
  const bool stem_op = call.op() == ConvOp::fprop || call.op() == ConvOp::wgrad;
  if (stem_op && g.groups == 1 && g.in_channels <= 4 && strided &&
      !patchify_passes_cudnn_over(call))  // rule 3 decides those
    return cat("a strided few-channel stem's ", call.op() == ConvOp::fprop ? "fprop" : "wgrad",
               ": timed, not the heuristics' plan (engines.cpp, rule 4)");
  return std::nullopt;
}

// The most cuDNN candidates rule 4 times: the heuristics' first 8. Timing 8 instead of 48 left
// EfficientNet-B0's and MobileNetV3-L's training steps unchanged (23.60 vs 23.60 ms, 12.69 vs
// 12.68; H200, bf16, batch 128) and cut their cold first steps from 25.7 to 13.0 s and 21.5 to
// 11.5 s: the winners sit early in the heuristics' order, and the generic engines further down
// cost tens of ms a run on depthwise problems (bench/results/2026-11-30_h200_issue40_session39/).
// A smaller FUSEBOX_CONV_AUTOTUNE_CANDIDATES still applies; 0 (all) does not lift the cap.
constexpr size_t kRule4Candidates = 8;

size_t rule4_candidates(size_t setting) {
  return setting == 0 ? kRule4Candidates : std::min(setting, kRule4Candidates);
}

// Whether `scope` lets engine `e` run at all.
bool in_scope(const ConvEngine& e, Scope scope) {
  switch (scope) {
    case Scope::all:
      return true;
    case Scope::own:
      return &e != &cudnn_engine();
    case Scope::cudnn:
      return &e == &cudnn_engine();
    case Scope::after_cudnn:
      return &e != &cudnn_engine() && &e != &depthwise_engine();
  }
  return false;
}

// Whether the policy takes engine `e` (in scope) for a call it accepts, and why (the report's
// reason; "" where the order says it all), or nullopt: passed over.
std::optional<std::string> policy_takes(const ConvEngine& e, const ConvCall& call, Scope scope) {
  const ConvSettings& s = *call.settings;
  if (&e == &depthwise_engine()) {
    if (scope == Scope::own) return std::string("groups == C == K: depthwise first");
    if (s.autotune || s.forced_plan_index >= 0) return std::nullopt;
    if (depthwise_fuses_epilogue(call))
      return cat("the epilogue (", epilogue_text(call.epilogue),
                 ") fused in one pass; cuDNN's fused grouped graph runs on its generic engine "
                 "(engines.cpp, rule 1)");
    if (depthwise_measured_faster(call))
      return std::string(
          "measured faster than cuDNN for this kind of problem (engines.cpp, rule 2)");
    return std::nullopt;
  }
  if (&e == &halo_wgrad_engine() && !halo_wgrad::preferred(call.geometry)) return std::nullopt;
  return "";
}

std::string joined(const std::vector<std::string>& parts) {
  std::string s;
  for (const std::string& p : parts)
    if (!p.empty()) s += cat(s.empty() ? "" : "; ", p);
  return s;
}

// The policy's first engine that takes the call, recorded. `notes`: what passed over or
// declined so far that the report names (cuDNN's reason, the implicit GEMM's refusal).
ConvOutcome run_policy(Context& ctx, const ConvCall& call, Scope scope,
                       std::vector<std::string> notes) {
  const ConvProblem& p = *call.problem;
  if (scope == Scope::own) notes.push_back("FUSEBOX_CONV_BACKEND=own");
  for (const ConvEngine* e : conv_engines()) {
    if (!in_scope(*e, scope) || !e->implements(call.op())) continue;
    if (auto why = e->cannot_implement(call)) {
      if (scope == Scope::cudnn)
        throw Error(p.label, cat("FUSEBOX_CONV_BACKEND=cudnn, but cuDNN cannot run ", p.describe(),
                                 ": ", *why));
      if (e == &cudnn_engine() || e == &implicit_gemm_engine())
        notes.push_back(cat(e->name(), ": ", *why));
      continue;
    }
    if (e == &cudnn_engine() && scope == Scope::all) {
      if (auto why = patchify_passes_cudnn_over(call)) {
        notes.push_back(cat("cudnn passed over: ", *why));
        continue;
      }
    }
    const std::optional<std::string> rule = policy_takes(*e, call, scope);
    if (!rule) continue;
    if (e == &direct_engine() && scope == Scope::own) {
      static std::once_flag warned;
      std::call_once(warned, [&] {
        std::fprintf(stderr,
                     "fusebox: %s: FUSEBOX_CONV_BACKEND=own runs %s on the direct kernel (%s)\n",
                     p.label.c_str(), p.describe().c_str(), joined(notes).c_str());
      });
    }
    const ConvRecorded r = e->record(ctx, call, e->plan(call));
    if (r.ran) {
      notes.insert(notes.begin(), *rule);
      return {e, r, "", joined(notes), r.tuned_ms};
    }
    if (scope == Scope::cudnn)
      throw Error(p.label, cat("FUSEBOX_CONV_BACKEND=cudnn, but cuDNN refused ", p.describe(), ": ",
                               r.reason));
    notes.push_back(cat(e->name(), ": ", r.reason));
    if (e == &cudnn_engine() && r.first_use)
      std::fprintf(stderr, "fusebox: %s: %s runs on the project's engines (cuDNN: %s)\n",
                   p.label.c_str(), p.describe().c_str(), r.reason.c_str());
  }
  // The direct engine takes everything.
  throw Error(p.label, cat("no convolution engine ran ", p.describe(), ": ", joined(notes)));
}

// `call` in the unfused form (no epilogue asked of the engine).
ConvCall unfused(const ConvCall& call) {
  ConvCall u = call;
  u.epilogue = {};
  return u;
}

// Records e in its fused or unfused form and the part of the epilogue it leaves (autotuning's
// candidates are timed with it). Returns the recording.
ConvRecorded record_with_epilogue(Context& ctx, const ConvCall& call, const ConvEngine& e,
                                  bool unfused_form) {
  const ConvCall c = unfused_form ? unfused(call) : call;
  const ConvRecorded r = e.record(ctx, c, e.plan(c));
  if (!r.ran) return r;
  const ConvEpilogueOperands rest = remaining_epilogue(*call.node, call.in, r.fused);
  if (!epilogue_text(rest).empty()) record_epilogue(ctx, *call.node, rest, call.out[0]);
  return r;
}

struct Candidate {
  const ConvEngine* engine;
  bool unfused;
};

// Autotuning's candidates: every engine but cuDNN and the direct kernel (the oracle) that
// takes the call fused, or else unfused. A depthwise problem timed by default (rule 4) weighs
// the depthwise kernel alone against cuDNN: the GEMM engines would run it as C groups of one
// channel (a K of R*S taps), and timing the implicit GEMM on EfficientNet-B0's 22 such
// problems took 1.9 s of its cold first step (H200, session 39).
std::vector<Candidate> tuning_candidates(const ConvCall& call, bool by_default) {
  std::vector<Candidate> out;
  for (const ConvEngine* e : conv_engines()) {
    if (e == &cudnn_engine() || e == &direct_engine() || !e->implements(call.op())) continue;
    if (!e->cannot_implement(call))
      out.push_back({e, false});
    else if (call.has_epilogue() && !e->cannot_implement(unfused(call)))
      out.push_back({e, true});
  }
  auto depthwise = [](const Candidate& c) { return c.engine == &depthwise_engine(); };
  if (by_default && std::any_of(out.begin(), out.end(), depthwise))
    std::erase_if(out, [&](const Candidate& c) { return !depthwise(c); });
  return out;
}

struct Timed {
  Candidate candidate;
  double ms = -1;
  std::string plan;
};

// The fastest candidate, or nullopt (no graphs to time: FUSEBOX_CUDA_GRAPHS=0; or none ran).
std::optional<Timed> fastest(Context& ctx, const ConvCall& call,
                             const std::vector<Candidate>& candidates) {
  std::optional<Timed> best;
  for (const Candidate& c : candidates) {
    std::string plan;
    std::optional<double> ms;
    TracePhase trace("conv autotune: time our engine ", c.engine->name());
    try {
      ms = time_own_conv(
          ctx,
          [&](Context& scratch) {
            const ConvRecorded r = record_with_epilogue(scratch, call, *c.engine, c.unfused);
            if (!r.ran) throw Error(call.label(), cat(c.engine->name(), " declined: ", r.reason));
            return r.plan;
          },
          plan, best ? best->ms : std::numeric_limits<double>::infinity());
    } catch (const std::exception& ex) {
      // Not timed (out of memory for its temporaries, a decline): the others compete; a
      // broken context fails the next call anyway.
      const ConvCall form = c.unfused ? unfused(call) : call;
      std::fprintf(stderr, "fusebox: %s: timing engine %s failed (%s)\n", call.label().c_str(),
                   c.engine->describe(c.engine->plan(form)).c_str(), ex.what());
      continue;
    }
    if (!ms) return std::nullopt;
    if (!best || *ms < best->ms) best = Timed{c, *ms, plan};
  }
  return best;
}

// Records the engine a stored decision names (an old decision: the default own choice), or
// nullopt where it no longer takes the call.
std::optional<ConvOutcome> replay_own(Context& ctx, const ConvCall& call, const ConvSelection& s) {
  const std::string how = "autotuned";
  if (s.own_engine.empty()) {
    ConvOutcome o = run_policy(ctx, call, Scope::own, {});
    o.how = how, o.reason = s.describe(), o.tuned_ms = s.own_ms;
    return o;
  }
  const ConvEngine* e = find_conv_engine(s.own_engine);
  const ConvCall c = s.own_unfused ? unfused(call) : call;
  if (e == nullptr || e->cannot_implement(c)) return std::nullopt;
  const ConvRecorded r = e->record(ctx, c, e->plan(c));
  if (!r.ran) return std::nullopt;
  return ConvOutcome{e, r, how, s.describe(), s.own_ms};
}

// Autotuning (see the top of the file), or nullopt with cuDNN's reason in *notes where it
// declined. by_default: rule 4's timing, not FUSEBOX_AUTOTUNE's.
std::optional<ConvOutcome> run_autotuned(Context& ctx, const ConvCall& call,
                                         std::vector<std::string>* notes, bool by_default) {
  const ConvProblem& p = *call.problem;
  const ConvEngine& cudnn = cudnn_engine();
  std::optional<ConvSelection> selected;
  std::optional<Timed> best;
  const std::vector<Candidate> candidates = tuning_candidates(call, by_default);
  if (!candidates.empty()) {
    selected = find_conv_selection(p);
    if (selected && selected->own) {
      if (std::optional<ConvOutcome> o = replay_own(ctx, call, *selected)) return o;
      std::fprintf(stderr,
                   "fusebox: %s: the autotuned engine %s no longer takes %s; timing again\n",
                   p.label.c_str(), selected->own_engine.c_str(), p.describe().c_str());
      selected.reset();
    }
    if (!selected) best = fastest(ctx, call, candidates);
  }
  ConvCall c = call;
  if (best) c.beat_ms = best->ms;
  const ConvRecorded r = cudnn.record(ctx, c, cudnn.plan(c));
  if (best && (r.ran || r.slower)) {
    selected = ConvSelection{r.slower,
                             best->ms,
                             r.tuned_ms,
                             best->plan,
                             r.plan,
                             best->candidate.engine->name(),
                             best->candidate.unfused};
    store_conv_selection(p, *selected);
    if (!call.settings->quiet_tuning)
      std::fprintf(stderr, "fusebox: %s: %s\n", p.label.c_str(), selected->describe().c_str());
  }
  if (r.slower) {
    const Candidate& w = best->candidate;
    const ConvCall wc = w.unfused ? unfused(call) : call;
    const ConvRecorded own = w.engine->record(ctx, wc, w.engine->plan(wc));
    if (own.ran)
      return ConvOutcome{w.engine, own, "autotuned", selected->describe(), selected->own_ms};
    notes->push_back(cat(w.engine->name(), ": ", own.reason));
    return run_policy(ctx, call, Scope::after_cudnn, *notes);
  }
  if (r.ran) return ConvOutcome{&cudnn, r, "", selected ? selected->describe() : "", r.tuned_ms};
  notes->push_back(cat("cudnn: ", r.reason));
  if (r.first_use)
    std::fprintf(stderr, "fusebox: %s: %s runs on the project's engines (cuDNN: %s)\n",
                 p.label.c_str(), p.describe().c_str(), r.reason.c_str());
  return std::nullopt;
}

// FUSEBOX_CONV_ENGINE (or the in-process override): that engine, or an Error.
ConvOutcome run_forced(Context& ctx, const ConvCall& call) {
  const ConvEngineChoice& choice = call.settings->engine;
  const ConvProblem& p = *call.problem;
  const ConvEngine& e = checked_conv_engine(choice, "FUSEBOX_CONV_ENGINE", p.label);
  const std::string forced = cat("FUSEBOX_CONV_ENGINE=", choice.text());
  auto refuse = [&](const std::string& why) {
    return Error(p.label, cat(forced, " cannot run ", p.describe(), ": ", why));
  };
  if (!e.implements(call.op()))
    throw refuse(cat(e.name(), " has no ", conv_op_name(call.op()), " kernels"));
  ConvCall c = call;
  c.variant = choice.variant;
  std::optional<std::string> why = e.cannot_implement(c);
  // An engine that cannot compute the epilogue runs without it, the epilogue kernel after.
  if (why && c.has_epilogue() && !e.cannot_implement(unfused(c))) {
    c = unfused(c);
    why.reset();
  }
  if (why) throw refuse(*why);
  const ConvRecorded r = e.record(ctx, c, e.plan(c));
  if (!r.ran) throw refuse(cat("it declined while recording: ", r.reason));
  return {&e, r, "forced", forced, r.tuned_ms};
}

}  // namespace

ConvOutcome run_conv_engines(Context& ctx, const ConvCall& call) {
  const ConvSettings& s = *call.settings;
  if (!s.engine.empty()) return run_forced(ctx, call);
  switch (s.backend) {
    case ConvBackend::cudnn:
      return run_policy(ctx, call, Scope::cudnn, {});
    case ConvBackend::own:
      return run_policy(ctx, call, Scope::own, {});
    case ConvBackend::automatic:
      break;
  }
  std::vector<std::string> notes;
  const std::optional<std::string> rule4 = timed_by_default(call);
  if ((s.autotune || rule4) && s.forced_plan_index < 0 && !cudnn_engine().cannot_implement(call)) {
    ConvSettings timed = s;
    timed.autotune = true;
    timed.quiet_tuning = !s.autotune;
    if (rule4) {
      timed.autotune_candidates = rule4_candidates(s.autotune_candidates);
      timed.skip_runtime_compiled = !s.rule4_runtime_compiled;
    }
    ConvCall c = call;
    c.settings = &timed;
    if (rule4) notes.push_back(*rule4);
    TracePhase trace(rule4 ? "conv timed by default (rule 4), " : "conv autotuned, ",
                     conv_op_name(call.op()));
    if (std::optional<ConvOutcome> o = run_autotuned(ctx, c, &notes, rule4.has_value())) {
      if (rule4) o->reason = joined({*rule4, o->reason});
      return *o;
    }
    return run_policy(ctx, call, Scope::after_cudnn, notes);
  }
  return run_policy(ctx, call, Scope::all, notes);
}

}  // namespace fusebox::cuda
