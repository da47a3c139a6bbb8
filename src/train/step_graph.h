// Building a training session's graphs from a model (see fusebox/train/session.h).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fusebox/train/session.h"

namespace fusebox::train {

// Reserved value names in the step graph.
constexpr const char* kLrInput = "__lr__";
constexpr const char* kStepInput = "__step__";  // the step being taken, counting from 1
constexpr const char* kLossOutput = "__loss__";
// The step-graph input of optimizer state "<param>/exp_avg" is "optim/<param>/exp_avg".
constexpr const char* kOptimPrefix = "optim/";
// The output holding state input S's next value is "__next__/S".
std::string next_state_name(const std::string& state_input);
// The step-graph input of parameter P's low copy (SessionOptions::low_parameter_copies) is
// "low/P".
constexpr const char* kLowCopyPrefix = "low/";
// f16 dynamic loss scaling (docs/mixed_precision.md): the scaler's state, step-graph
// inputs "amp/<name>" of these checkpoint names, and the flag of a skipped step (f32,
// 1: a gradient held an infinity or a NaN, the updates were skipped; else 0).
constexpr const char* kScalerPrefix = "amp/";
constexpr const char* kLossScale = "loss_scale";          // f32 scalar
constexpr const char* kGrowthTracker = "growth_tracker";  // i64 scalar
constexpr const char* kSkippedSteps = "skipped_steps";    // i64 scalar
constexpr const char* kFoundInfOutput = "__found_inf__";

// How a model's constants and inputs divide up.
struct ModelLayout {
  std::vector<std::string> data_inputs;  // the model's graph inputs
  std::string logits;                    // the model output the loss reads
  std::vector<std::string> parameters;   // trained constants, in value-id order
  std::vector<std::string> buffers;      // batch-norm running statistics, in value-id order
};
ModelLayout analyse_model(const Graph& model, const LossSpec& loss, const SessionOptions& opts);

// The optimizer state of each parameter, by checkpoint name ("<param>/momentum_buffer",
// "<param>/exp_avg", ...), all zeros with the parameter's dtype and shape.
std::map<std::string, Tensor> initial_optimizer_state(const ModelLayout& layout,
                                                      const std::map<std::string, Tensor>& params,
                                                      const OptimizerSpec& optimizer);

// The scaler's state before the first step, by checkpoint name (above).
std::map<std::string, Tensor> initial_scaler_state(const LossScaling& scaling);

struct StepGraph {
  Graph graph;
  // (state input name, output holding its next value) for every parameter, buffer,
  // optimizer state tensor, (f16) loss scaler state and low copy.
  std::vector<std::pair<std::string, std::string>> state_updates;
  // (parameter, its low copy's state input): the copies to fill, by rounding the parameter to
  // the input's dtype, wherever the parameter is set (not in a checkpoint).
  std::vector<std::pair<std::string, std::string>> low_copies;
};
// `optimizer`'s lr is not used (it is the kLrInput input).
// `precision`: passes/mixed_precision.h on the forward pass (parameters stay f32); f16 adds
// dynamic loss scaling with `scaling`'s factors (its init_scale is initial_scaler_state's).
// `data_parallel` with a world: the gradients averaged in all_reduce buckets and the loss
// averaged (session.h DataParallel); the collectives placed right after their inputs' last
// writer.
// `low_copies`: SessionOptions::low_parameter_copies; `step_fusion`: its
// step_fusion, `norm_statistics` fold_norm_statistics (passes/pipeline.h training_step).
StepGraph build_step_graph(const Graph& model, const ModelLayout& layout, const LossSpec& loss,
                           const OptimizerSpec& optimizer, Precision precision = Precision::f32,
                           const LossScaling& scaling = {}, const DataParallel& data_parallel = {},
                           bool low_copies = true, bool step_fusion = true,
                           bool norm_statistics = false);
// The model with its parameters and buffers as inputs and batch_norm in inference form.
Graph build_eval_graph(const Graph& model, const ModelLayout& layout,
                       Precision precision = Precision::f32);

}  // namespace fusebox::train
