// The pipelines' pass lists (passes/pipeline.h), and running them with the verifier.
#include "fusebox/passes/pipeline.h"

#include <cstdlib>
#include <utility>

#include "fusebox/core/compile_trace.h"
#include "fusebox/passes/fuse_pointwise.h"
#include "fusebox/passes/rematerialize.h"
#include "fusebox/passes/simplify.h"

namespace fusebox {
namespace {

// A pass of the free functions `size_t pass(Graph&, FusionLog*)`.
Pass pass(std::string name, size_t (*fn)(Graph&, FusionLog*)) {
  return {std::move(name), fn};
}

// Mixed precision rebuilds the graph (apply_mixed_precision returns a new one).
Pass mixed_precision(Precision precision, MixedPrecisionOptions options = {}) {
  return {"mixed_precision", [precision, options](Graph& g, FusionLog*) {
            MixedPrecisionReport report;
            g = apply_mixed_precision(g, precision, &report, options);
            return size_t(report.casts_inserted + report.constants_folded);
          }};
}

// pad_product_columns at its default threshold.
Pass pad_columns() {
  return {"pad_product_columns",
          [](Graph& g, FusionLog* log) { return pad_product_columns(g, log); }};
}

Pass attention(bool training, bool f32 = false) {
  return {
      training ? "fuse_attention (training)" : "fuse_attention",
      [training, f32](Graph& g, FusionLog* log) { return fuse_attention(g, log, training, f32); }};
}

// What a pass must leave as it found it: the graph's inputs and outputs, by name and type.
struct Interface {
  std::vector<std::pair<std::string, TensorType>> inputs, outputs;
  bool operator==(const Interface&) const = default;

  explicit Interface(const Graph& g) {
    for (ValueId v : g.inputs()) inputs.push_back({g.value(v).name, g.value(v).type});
    for (ValueId v : g.outputs()) outputs.push_back({g.value(v).name, g.value(v).type});
  }
};

std::string describe(const std::vector<std::pair<std::string, TensorType>>& values) {
  std::string s;
  for (const auto& [name, type] : values)
    s += cat(s.empty() ? "" : ", ", name, " ", dtype_name(type.dtype), shape_str(type.shape));
  return s.empty() ? "none" : s;
}

// Graph::verify and the interface check, after the pass `culprit` names ("pass fuse_x"), its
// Error naming it.
void verify_after(const Pipeline& pipeline, const std::string& culprit, const Graph& g,
                  const Interface& before) {
  const std::string where = cat("pipeline ", pipeline.name, " of ", g.name());
  try {
    g.verify();
  } catch (const Error& e) {
    throw Error(where, cat(culprit, " left an invalid graph: ", e.what()));
  }
  const Interface after(g);
  FUSEBOX_CHECK(after.inputs == before.inputs, where, culprit, " changed the graph's inputs from (",
                describe(before.inputs), ") to (", describe(after.inputs), ")");
  FUSEBOX_CHECK(after.outputs == before.outputs, where, culprit,
                " changed the graph's outputs from (", describe(before.outputs), ") to (",
                describe(after.outputs), ")");
}

}  // namespace

// The orders. A comment says why a pass runs where it does.

Pipeline inference_pipeline(Precision precision, const InferenceFusionOptions& fusion) {
  std::vector<Pass> passes;
  auto add = [&](bool enabled, Pass p) {
    if (enabled) passes.push_back(std::move(p));
  };
  // Identities first: no pass after needs to see a node that copies its input unchanged.
  add(fusion.identity_ops, pass("remove_identity_ops", remove_identity_ops));
  // On the f32 graph: mixed precision then places one gelu (a gemm's epilogue after
  // fuse_gemm_epilogues) instead of casting around each of its ops (pow is on the f32 list).
  add(fusion.gelu, pass("recognize_gelu", recognize_gelu));
  // Folding next, on the model's own (f32) weights: the folded ones are rounded once.
  add(fusion.fold_batch_norm, pass("fold_batch_norms", fold_batch_norms));
  // Before mixed precision: as a gemm, a linear layer runs in the low dtype with its bias.
  add(fusion.conv_epilogue, pass("form_linears", form_linears));
  add(true, mixed_precision(precision, {.fold_constants = true}));
  add(fusion.conv_epilogue, pass("fuse_conv_epilogues", fuse_conv_epilogues));
  add(fusion.conv_epilogue, pass("fuse_gemm_epilogues", fuse_gemm_epilogues));
  // Before the pointwise chains, which would take the scale and the casts around the softmax.
  add(fusion.attention, attention(/*training=*/false, fusion.f32_attention));
  // The batch norms the folding left (not after a conv); the residual first, which takes the
  // relu after the add too.
  add(fusion.batch_norm, pass("fuse_batch_norm_residual", fuse_batch_norm_residual));
  add(fusion.batch_norm, pass("fuse_batch_norm_relu", fuse_batch_norm_relu));
  // After the fusions that match casts where mixed precision put them (attention); the casts
  // moved above layout ops first, so that a norm's casts are its readers.
  add(fusion.hoist_casts, pass("hoist_narrowing_casts", hoist_narrowing_casts));
  // Before the pointwise chains, which would take the casts into kernels of their own.
  add(fusion.norm_casts, pass("fold_norm_casts", fold_norm_casts));
  // Likewise a product's widening cast (GPT-2's LM head writing its f32 logits).
  add(fusion.product_casts, pass("fold_product_casts", fold_product_casts));
  // Last: the elementwise chains no pass above took into a node of its own.
  add(fusion.pointwise, pass("fuse_pointwise_chains", fuse_pointwise_chains));
  return {"inference", std::move(passes)};
}

// The fusions here run before autodiff, so that the backward pass is derived from the fused
// nodes; only those with a gradient rule (no conv or gemm epilogues, no pointwise chains).
Pipeline training_forward_pipeline(Precision precision) {
  return {"training_forward",
          {
              // As for inference; autodiff then has no copies to differentiate either.
              pass("remove_identity_ops", remove_identity_ops),
              // As for inference; gelu has a gradient rule in both forms (one node to
              // differentiate instead of eight).
              pass("recognize_gelu", recognize_gelu),
              // Before mixed precision, as for inference.
              pass("form_linears", form_linears),
              pass("fold_gemm_transposes", fold_gemm_transposes),
              // Products whose columns leave cuBLASLt only slow kernels: padded, so that
              // autodiff derives aligned products (passes/simplify.h).
              pad_columns(),
              // Parameters are graph inputs by now: they stay f32, read through casts.
              mixed_precision(precision),
              pass("fuse_batch_norm_residual", fuse_batch_norm_residual),
              pass("fuse_batch_norm_relu", fuse_batch_norm_relu),
              attention(/*training=*/true),
              // Last: the casts and layout ops the loss reads through are all in place.
              pass("fold_cross_entropy", fold_cross_entropy),
          }};
}

// After autodiff, on the whole step; values keep their names (the step's state is found by
// name after).
Pipeline training_step_pipeline(bool step_fusion, bool norm_statistics) {
  std::vector<Pass> passes = {pass("concat_slice_gradients", concat_slice_gradients)};
  if (step_fusion) {
    // The attention output is kept once: attention_backward reads it through the projection's
    // layout copy.
    passes.push_back(pass("attention_output_from_layout_copy", attention_output_from_layout_copy));
    // Then, on the step as autodiff wrote it: the forward's elementwise values the backward
    // reads are computed again there from what it keeps anyway (x * sigmoid(x) keeps x, not
    // the gate too); the copies then fuse into the backward's kernels below.
    passes.push_back(pass("rematerialize_pointwise", [](Graph& g, FusionLog* log) {
      return rematerialize_pointwise(g, log);
    }));
    // As for inference, on the forward's norms (their statistics outputs are kept): the
    // narrowing cast of a norm's y moved above the layout ops to be its reader, then taken
    // into the norm (it writes the low dtype, as the cast rounded it).
    passes.push_back(pass("hoist_narrowing_casts", hoist_narrowing_casts));
    passes.push_back(pass("fold_norm_casts", fold_norm_casts));
    // Before the pointwise chains, which would take a block output's gradient sum into a
    // kernel of its own: the batch norm's backward adds its two terms as it reads them.
    passes.push_back(pass("fold_gradient_sums", fold_gradient_sums));
    // The forward's 1x1 convolutions give their batch norms x's statistics (the GPU computes
    // them in the convolution's epilogue; GPU sessions with FUSEBOX_CONV_NORM_STATISTICS=1).
    if (norm_statistics)
      passes.push_back({"fold_norm_statistics",
                        [](Graph& g, FusionLog* log) { return fold_norm_statistics(g, log); }});
    // Last, as for inference: the casts around the f32 residual adds and the backward's
    // elementwise chains, each one generated kernel.
    passes.push_back(pass("fuse_pointwise_chains", fuse_pointwise_chains));
  }
  return {"training_step", std::move(passes)};
}

Pipeline evaluation_pipeline(Precision precision) {
  return {"evaluation",
          {
              pass("remove_identity_ops", remove_identity_ops),
              pass("recognize_gelu", recognize_gelu),
              mixed_precision(precision),
              pass("fuse_batch_norm_residual", fuse_batch_norm_residual),
              pass("fuse_batch_norm_relu", fuse_batch_norm_relu),
              attention(/*training=*/false),
          }};
}

bool verify_passes_by_default() {
#ifdef NDEBUG
  constexpr bool debug_build = false;
#else
  constexpr bool debug_build = true;
#endif
  const char* text = std::getenv("FUSEBOX_VERIFY_PASSES");
  const std::string value = text == nullptr ? "" : text;
  FUSEBOX_CHECK(value.empty() || value == "0" || value == "1", "settings",
                "FUSEBOX_VERIFY_PASSES='", value,
                "' must be 1 (verify the graph after every pass) or 0 (after the whole pipeline, "
                "the default of release builds)");
  return debug_build || value == "1";
}

void run_pipeline(const Pipeline& pipeline, Graph& g, PipelineLog* log, bool verify) {
  if (pipeline.passes.empty()) return;
  const Interface interface(g);
  if (verify) {
    try {
      g.verify();
    } catch (const Error& e) {
      throw Error(cat("pipeline ", pipeline.name, " of ", g.name()),
                  cat("the graph given to it is invalid: ", e.what()));
    }
  }
  for (const Pass& p : pipeline.passes) {
    const TracePhase trace("pass ", p.name.c_str());
    const size_t nodes_before = g.nodes().size();
    const size_t rewrites = p.run(g, log ? &log->fusion : nullptr);
    if (log) log->passes.push_back({p.name, rewrites, nodes_before, g.nodes().size()});
    if (verify) verify_after(pipeline, "pass " + p.name, g, interface);
  }
  if (!verify) verify_after(pipeline, "a pass (FUSEBOX_VERIFY_PASSES=1 names which)", g, interface);
}

Graph prepare_graph(const Graph& graph, const PipelineOptions& options) {
  Graph g = graph;
  switch (options.kind) {
    case PipelineKind::none:
      break;
    case PipelineKind::inference:
      run_pipeline(inference_pipeline(options.precision, options.fusion), g, options.log,
                   options.verify || verify_passes_by_default());
      break;
  }
  return g;
}

}  // namespace fusebox
