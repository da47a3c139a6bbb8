// The compile pipelines: which graph passes run, and in what order, written once
// (src/passes/pipeline.cpp holds the lists). Modelled on XLA's HloPassPipeline: a pass is
// a name and a function over the graph; a pipeline runs its passes in order, records what
// each changed, and can verify the graph after each one, so that a pass that breaks the
// graph is named instead of a later pass, or a kernel, failing on its output.
//
//   inference          the model as the compiler runs it for inference (Executable::compile
//                      with CompileOptions::pipeline.kind = inference; the CLI's run on CUDA,
//                      bench --mode infer and inspect --fusion): batch norms folded, linears
//                      formed, mixed precision (constants cast once), conv and gemm
//                      epilogues, attention, the batch-norm fusions, pointwise chains
//                      (passes/fusion.h explains each);
//   training_forward   a training step's forward pass before autodiff (train/step_graph.cpp):
//                      linears formed, mixed precision (parameters stay f32), the batch-norm
//                      fusions and attention with its lse output, which the gradient rules read;
//   training_step      the whole step after autodiff (forward, backward, updates): the
//                      gradients of concatenated slices as one concat; then (step_fusion)
//                      the forward's elementwise values the backward reads recomputed there
//                      (passes/rematerialize.h), the norms' narrowing casts folded, the
//                      gradient sums a batch norm's backward reads taken into it,
//                      (norm_statistics: GPU steps) the batch norms' statistics taken from
//                      the 1x1 convolutions that write their x, and the pointwise chains (a gemm's
//                      output cast and added to an f32 residual, the backward's chains: nothing
//                      differentiates the step again);
//   evaluation         a training session's eval graph: mixed precision and the batch-norm
//                      and attention fusions.
//
// Not here: the physical layout of values (which are stored channels-last, where the layout
// converts: passes/layout.h). That is the backend's choice, made in the CUDA executable's
// compile step on the graph this pipeline produced.
//
// Verification (Graph::verify: ids, names, producers before readers, every node's types
// re-inferred; and the graph's inputs and outputs, names and types, unchanged by the pass)
// runs after every pass in debug builds, with FUSEBOX_VERIFY_PASSES=1, or with
// PipelineOptions::verify; an Error then names the pipeline and the pass that broke the
// graph. The graph a pipeline returns is checked so once in every build (an Error then
// names the pipeline only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fusebox/ir/graph.h"
#include "fusebox/passes/fusion.h"
#include "fusebox/passes/mixed_precision.h"

namespace fusebox {

// One graph pass: it rewrites the graph in place, records the fusion groups it forms in the
// log (when given), and returns how many rewrites it made (groups formed, casts inserted;
// 0: the graph is unchanged).
struct Pass {
  std::string name;
  std::function<size_t(Graph&, FusionLog*)> run;
};

struct Pipeline {
  std::string name;
  std::vector<Pass> passes;  // in the order they run
};

// The pipelines (src/passes/pipeline.cpp lists their passes). `fusion` leaves out the
// inference fusions it switches off; mixed precision always runs.
Pipeline inference_pipeline(Precision precision, const InferenceFusionOptions& fusion = {});
Pipeline training_forward_pipeline(Precision precision);
Pipeline training_step_pipeline(bool step_fusion = true, bool norm_statistics = false);
Pipeline evaluation_pipeline(Precision precision);

// What one pass did in a run of a pipeline.
struct PassRun {
  std::string pass;
  size_t rewrites = 0;  // the pass's count (see Pass)
  size_t nodes_before = 0;
  size_t nodes_after = 0;
};

// What a run of a pipeline did: each pass in the order it ran, and the fusion groups formed
// (what `fusebox inspect --fusion` and the run/bench reports print).
struct PipelineLog {
  std::vector<PassRun> passes;
  FusionLog fusion;
};

// Whether pipelines verify after each pass without being asked: in debug builds (NDEBUG
// unset) and with FUSEBOX_VERIFY_PASSES=1 (0 or unset: no; read at each call).
bool verify_passes_by_default();

// Runs `pipeline`'s passes on `g` in order, recording them in `log` when given; with
// `verify`, checks the graph after each pass (see above). Throws the Error of a pass that
// refuses the graph as it is, or of the verification naming the pass that broke it.
void run_pipeline(const Pipeline& pipeline, Graph& g, PipelineLog* log = nullptr,
                  bool verify = verify_passes_by_default());

// Which pipeline Executable::compile runs before it plans the graph (CompileOptions).
enum class PipelineKind : uint8_t {
  none,       // the graph as given
  inference,  // inference_pipeline(precision, fusion)
};

struct PipelineOptions {
  PipelineKind kind = PipelineKind::none;
  Precision precision = Precision::f32;
  // Which inference fusions run: all by default; the CLI passes
  // InferenceFusionOptions::from_env() (FUSEBOX_FUSION=0: none).
  InferenceFusionOptions fusion;
  // Verify after each pass even where verify_passes_by_default() is false (tests).
  bool verify = false;
  // Where the run is recorded (the passes and the fusion groups), when given: the reports
  // of the CLI read it.
  PipelineLog* log = nullptr;
};

// `graph` through the pipeline `options` names (a copy of `graph` for none).
Graph prepare_graph(const Graph& graph, const PipelineOptions& options);

}  // namespace fusebox
