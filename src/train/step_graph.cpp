// The step graph: model (parameters and running statistics as inputs, batch_norm in
// training form) -> cross_entropy -> grad -> one optimizer update per parameter, with
// every state tensor's next value as an output; for f16, dynamic loss scaling around the
// gradients and the updates. The eval graph: the same model with batch_norm in inference
// form.
#include "train/step_graph.h"

#include <algorithm>
#include <set>
#include <utility>

#include "fusebox/ir/builder.h"
#include "fusebox/ir/op_info.h"
#include "fusebox/passes/autodiff.h"
#include "fusebox/passes/pipeline.h"
#include "fusebox/passes/simplify.h"
#include "passes/fusion/fusion_rewrite.h"
#include "passes/rewrite/graph_rewriter.h"
#include "train/graph_rewrite.h"

namespace fusebox::train {

std::string next_state_name(const std::string& state_input) {
  return "__next__/" + state_input;
}

namespace {

std::string model_where(const Graph& model) {
  return "train " + model.name();
}

bool is_batch_norm_statistic(const Node& n, size_t input) {
  return n.op == OpKind::batch_norm && (input == 3 || input == 4);
}

std::set<std::string> state_constants(const ModelLayout& layout) {
  std::set<std::string> names(layout.parameters.begin(), layout.parameters.end());
  names.insert(layout.buffers.begin(), layout.buffers.end());
  return names;
}

ValueId find(const Graph& g, const std::string& name) {
  auto v = g.find_value(name);
  FUSEBOX_CHECK(v.has_value(), "train " + g.name(), "no value named '", name, "'");
  return *v;
}

std::string scaler_input(const char* name) {
  return std::string(kScalerPrefix) + name;
}

// f16's dynamic loss scaling (PyTorch's GradScaler, docs/mixed_precision.md): the values
// of the step graph that the updates and the scaler's own update read; all kNoValue
// without scaling.
struct Scaler {
  ValueId scale = kNoValue;      // state: the seed of the backward pass
  ValueId tracker = kNoValue;    // state: steps since the scale last changed
  ValueId skipped = kNoValue;    // state: steps skipped so far
  ValueId found_inf = kNoValue;  // 1 when a gradient holds an infinity or a NaN
  ValueId inv_scale = kNoValue;  // 1 / scale: the updates unscale the gradients by it

  explicit operator bool() const { return scale != kNoValue; }
};

// The backward pass was seeded with a graph input (GradOptions::seed_input): it becomes
// the loss scale, so the gradients are those of loss * scale. Adds the other state inputs,
// the found_inf flag over every gradient (also an output) and 1 / scale.
// `gradients`: what the updates read (averaged across the ranks in data-parallel training, so
// that every rank finds the same).
Scaler add_scaler(Graph& g, const GradResult& grads, const std::vector<ValueId>& gradients) {
  Scaler s;
  s.scale = grads.seed;
  g.rename_value(s.scale, scaler_input(kLossScale));
  s.tracker = g.add_input(scaler_input(kGrowthTracker), DType::i64, {});
  s.skipped = g.add_input(scaler_input(kSkippedSteps), DType::i64, {});
  s.found_inf =
      g.add_node(OpKind::nonfinite_any, {}, gradients, "amp/found_inf", {kFoundInfOutput})[0];
  g.mark_output(s.found_inf);
  s.inv_scale = g.add_node(OpKind::reciprocal, {}, {s.scale}, "amp/unscale", {"amp/inv_scale"})[0];
  return s;
}

// Data parallel (session.h DataParallel): the gradients in all_reduce buckets, in the order the
// backward pass writes them (by their writers' node order), a bucket closing once it holds
// dp.bucket_bytes; returns each gradient's average, by position.
std::vector<ValueId> average_gradients(Graph& g, const std::vector<ValueId>& gradients,
                                       const DataParallel& dp) {
  std::vector<size_t> order(gradients.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return g.value(gradients[a]).producer < g.value(gradients[b]).producer;
  });
  std::map<ValueId, ValueId> averaged;  // a gradient two parameters share is reduced once
  std::vector<ValueId> bucket;
  size_t bytes = 0;
  int buckets = 0;
  auto close = [&] {
    if (bucket.empty()) return;
    std::vector<std::string> names;
    for (ValueId v : bucket) names.push_back(g.value(v).name + "/averaged");
    const std::vector<ValueId> outs = g.add_node(
        OpKind::all_reduce, AllReduceAttrs{.mean = true, .reduce_dtype = dp.reduce_dtype}, bucket,
        cat("dp/bucket", buckets++), names);
    for (size_t k = 0; k < bucket.size(); ++k) averaged[bucket[k]] = outs[k];
    bucket.clear();
    bytes = 0;
  };
  for (size_t i : order) {
    const ValueId v = gradients[i];
    if (averaged.count(v) || std::find(bucket.begin(), bucket.end(), v) != bucket.end()) continue;
    bucket.push_back(v);
    bytes += size_t(numel(g.value(v).type.shape)) * dtype_size(dp.reduce_dtype);
    if (bytes >= dp.bucket_bytes) close();
  }
  close();
  std::vector<ValueId> result;
  for (ValueId v : gradients) result.push_back(averaged.at(v));
  return result;
}

// The graph with every collective moved up to just after the last writer of its inputs (the
// earliest place it can run), the other nodes in their order: on the GPU a bucket's
// all_reduce then overlaps the backward nodes after it (ops.h all_reduce).
Graph with_collectives_early(const Graph& g) {
  std::vector<std::vector<NodeId>> after(g.nodes().size() + 1);  // by writer + 1
  for (const Node& n : g.nodes()) {
    if (op_info(n.op).family != OpFamily::collective) continue;
    NodeId last = -1;
    for (ValueId v : n.inputs) last = std::max(last, g.value(v).producer);
    after[size_t(last + 1)].push_back(n.id);
  }
  std::vector<NodeId> order = after[0];
  for (const Node& n : g.nodes()) {
    if (op_info(n.op).family == OpFamily::collective) continue;
    order.push_back(n.id);
    order.insert(order.end(), after[size_t(n.id + 1)].begin(), after[size_t(n.id + 1)].end());
  }
  return rewrite_graph(g, {.node_order = order}).graph;
}

// Low copies (SessionOptions::low_parameter_copies): each parameter whose every reader is a
// cast to one 16-bit dtype gets a state input of that dtype ("low/<param>") which those
// readers read instead; the casts go. Returns (parameter, low input) pairs.
std::vector<std::pair<std::string, std::string>> add_low_copies(
    Graph& g, const std::vector<std::string>& parameters) {
  const fusion::Readers readers(g);
  std::vector<std::pair<std::string, std::string>> copies;
  std::vector<DType> dtypes;         // by copy
  std::map<NodeId, size_t> cast_of;  // a cast that goes -> its copy
  for (const std::string& p : parameters) {
    const ValueId v = find(g, p);
    const std::vector<NodeId>& r = readers.of[size_t(v)];
    if (r.empty() || readers.outputs.count(v) || g.value(v).type.dtype != DType::f32) continue;
    std::optional<DType> low;
    bool casts_only = true;
    for (NodeId n : r) {
      const Node& c = g.node(n);
      if (c.op != OpKind::cast || !is_low_float(std::get<CastAttrs>(c.attrs).to) ||
          (low && *low != std::get<CastAttrs>(c.attrs).to)) {
        casts_only = false;
        break;
      }
      low = std::get<CastAttrs>(c.attrs).to;
    }
    if (!casts_only) continue;
    for (NodeId n : r) cast_of[n] = copies.size();
    copies.push_back({p, kLowCopyPrefix + p});
    dtypes.push_back(*low);
  }
  if (copies.empty()) return copies;
  GraphRewriter rw(g);
  std::vector<ValueId> inputs;
  for (size_t i = 0; i < copies.size(); ++i)
    inputs.push_back(rw.graph().add_input(copies[i].second, dtypes[i],
                                          g.value(find(g, copies[i].first)).type.shape));
  for (const Node& n : g.nodes()) {
    if (auto it = cast_of.find(n.id); it != cast_of.end()) {
      rw.map(n.outputs[0], inputs[it->second]);
      continue;
    }
    rw.copy(n);
  }
  g = rw.finish();
  return copies;
}

}  // namespace

ModelLayout analyse_model(const Graph& model, const LossSpec& loss, const SessionOptions& opts) {
  const std::string where = model_where(model);
  ModelLayout layout;
  for (ValueId v : model.inputs()) layout.data_inputs.push_back(model.value(v).name);

  if (loss.logits.empty()) {
    FUSEBOX_CHECK(model.outputs().size() == 1, where, "the model has ", model.outputs().size(),
                  " outputs; name the one holding the logits (LossSpec::logits)");
    layout.logits = model.value(model.outputs()[0]).name;
  } else {
    auto v = model.find_value(loss.logits);
    FUSEBOX_CHECK(v.has_value(), where, "the model has no value named '", loss.logits,
                  "' (LossSpec::logits)");
    layout.logits = loss.logits;
  }
  const TensorType& logits = model.value(find(model, layout.logits)).type;
  FUSEBOX_CHECK(is_floating(logits.dtype) && logits.shape.size() >= 2, where, "logits '",
                layout.logits, "' must be float [N, C, ...], got ", dtype_name(logits.dtype),
                shape_str(logits.shape));

  for (const std::string& name : opts.frozen) {
    auto v = model.find_value(name);
    FUSEBOX_CHECK(v && model.is_constant(*v), where, "frozen '", name,
                  "' is not a constant of the model");
  }

  // Which constants the nodes read, and which are batch-norm running statistics.
  std::map<ValueId, std::string> statistic_reader;  // constant -> the batch_norm reading it
  std::set<ValueId> read, read_beyond_scaling;
  for (const Node& n : model.nodes()) {
    // A one-element constant only scalings read (x * c, x / c, x ^ c) is a literal an export
    // left behind (session.h); one an add reads may be a layer's bias (Linear(d, 1)).
    const bool scaling = n.op == OpKind::mul || n.op == OpKind::div || n.op == OpKind::pow;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const ValueId v = n.inputs[i];
      if (v == kNoValue) continue;
      read.insert(v);
      if (!scaling) read_beyond_scaling.insert(v);
      if (!is_batch_norm_statistic(n, i)) continue;
      FUSEBOX_CHECK(model.is_constant(v), where, node_label(n), " reads running statistic '",
                    model.value(v).name,
                    "', which is not a constant; training keeps running statistics as state");
      auto [it, added] = statistic_reader.emplace(v, node_label(n));
      FUSEBOX_CHECK(added || it->second == node_label(n), where, "running statistic '",
                    model.value(v).name, "' is read by both ", it->second, " and ", node_label(n),
                    "; each batch norm needs its own");
    }
  }
  for (const auto& [v, t] : model.constants()) {
    const std::string& name = model.value(v).name;
    if (statistic_reader.count(v)) {
      layout.buffers.push_back(name);
    } else if (read.count(v) && is_floating(t.dtype()) && t.rank() > 0 &&
               !opts.frozen.count(name) && (t.numel() != 1 || read_beyond_scaling.count(v))) {
      layout.parameters.push_back(name);
    }
  }
  // A running statistic also read as an ordinary input (say, a parameter) would be both
  // updated by its batch norm and by the optimizer.
  for (const Node& n : model.nodes()) {
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const ValueId v = n.inputs[i];
      FUSEBOX_CHECK(v == kNoValue || is_batch_norm_statistic(n, i) || !statistic_reader.count(v),
                    where, node_label(n), " reads '", model.value(v).name,
                    "', which is also the running statistic of ", statistic_reader[v]);
    }
  }
  FUSEBOX_CHECK(!layout.parameters.empty(), where,
                "the model has no floating-point constants to train");
  return layout;
}

std::map<std::string, Tensor> initial_optimizer_state(const ModelLayout& layout,
                                                      const std::map<std::string, Tensor>& params,
                                                      const OptimizerSpec& optimizer) {
  std::vector<std::string> suffixes;
  if (const auto* sgd = std::get_if<SgdOptions>(&optimizer)) {
    if (sgd->momentum != 0) suffixes = {"momentum_buffer"};
  } else {
    suffixes = {"exp_avg", "exp_avg_sq"};
  }
  std::map<std::string, Tensor> state;
  for (const std::string& p : layout.parameters) {
    const Tensor& t = params.at(p);
    for (const std::string& s : suffixes) state[p + "/" + s] = Tensor::zeros(t.dtype(), t.shape());
  }
  return state;
}

std::map<std::string, Tensor> initial_scaler_state(const LossScaling& scaling) {
  return {{kLossScale, Tensor::scalar(DType::f32, scaling.init_scale)},
          {kGrowthTracker, Tensor::from_vector<int64_t>({}, {0})},
          {kSkippedSteps, Tensor::from_vector<int64_t>({}, {0})}};
}

StepGraph build_step_graph(const Graph& model, const ModelLayout& layout, const LossSpec& loss,
                           const OptimizerSpec& optimizer, Precision precision,
                           const LossScaling& scaling, const DataParallel& data_parallel,
                           bool low_copies, bool step_fusion, bool norm_statistics) {
  const bool parallel = data_parallel.world != nullptr;
  FUSEBOX_CHECK(loss.kind == LossKind::cross_entropy, model_where(model),
                "only the cross_entropy loss is supported");
  // Sync batch norm: the batch norms' statistics over every rank's shard (BatchNormAttrs::sync).
  const bool sync = parallel && data_parallel.sync_batch_norm;
  RewrittenGraph rw = rewrite_graph(
      model, {.constants_to_inputs = state_constants(layout),
              .batch_norm = sync ? BatchNormForm::synchronized_training : BatchNormForm::training});
  StepGraph step{std::move(rw.graph), {}};
  Graph& g = step.graph;

  // The loss, the step's one output so far: nothing else of the forward is fetched, so no
  // pass keeps a model output (the logits) alive.
  const ValueId logits = find(g, layout.logits);
  Shape label_shape = g.value(logits).type.shape;
  label_shape.erase(label_shape.begin() + 1);  // [N, C, D...] -> [N, D...]
  const ValueId labels = g.add_input(loss.labels, loss.labels_dtype, label_shape);
  Builder b(g);
  const ValueId local_loss =
      b.name("loss")
          .cross_entropy(logits, labels, kNoValue,
                         {.reduction = Reduction::mean, .ignore_index = loss.ignore_index})
          .at(0);
  const std::string loss_name = parallel ? "loss/local" : kLossOutput;
  g.rename_value(local_loss, loss_name);
  g.unmark_outputs();
  if (parallel)  // the step's loss: the mean of the ranks' losses
    g.mark_output(g.add_node(OpKind::all_reduce, AllReduceAttrs{}, {local_loss}, "dp/loss",
                             {kLossOutput})[0]);
  else
    g.mark_output(local_loss);

  // The forward passes (passes/pipeline.h: linears, mixed precision, the fusions autodiff
  // differentiates, the loss's own form), parameters being inputs by now (so they stay f32,
  // read through casts); values keep their names, so they are found by name from here on.
  run_pipeline(training_forward_pipeline(precision), g);
  // Not with data parallelism: the averaged gradients are f32 and the buckets follow the
  // backward's order (a widening cast per gradient would come after the whole backward).
  if (low_copies && !parallel) step.low_copies = add_low_copies(g, layout.parameters);
  std::map<std::string, std::string> low_copy_of(step.low_copies.begin(), step.low_copies.end());
  auto mapped = [&](const std::string& name) { return find(g, name); };
  const ValueId loss_value = mapped(loss_name);

  // Batch-norm running statistics: the training form's outputs 1 and 2.
  const std::set<std::string> buffers(layout.buffers.begin(), layout.buffers.end());
  std::vector<std::pair<ValueId, ValueId>> statistic_outputs;  // (state input, next value)
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::batch_norm || !buffers.count(g.value(n.inputs[3]).name)) continue;
    statistic_outputs.push_back({n.inputs[3], n.outputs[1]});
    statistic_outputs.push_back({n.inputs[4], n.outputs[2]});
  }

  // Gradients, then one update per parameter; a parameter with a low copy is differentiated
  // through the copy (its gradient in the copy's dtype: the update widens it).
  std::vector<ValueId> read;  // what the forward reads of each parameter
  for (const std::string& p : layout.parameters) {
    auto low = low_copy_of.find(p);
    read.push_back(mapped(low != low_copy_of.end() ? low->second : p));
  }
  const bool scaled = precision == Precision::f16;
  const GradResult grads = grad(g, loss_value, read, {.seed_input = scaled});
  std::vector<ValueId> gradients;  // what the updates read, by parameter
  for (ValueId v : read) gradients.push_back(grads.of(v));
  if (parallel) gradients = average_gradients(g, gradients, data_parallel);
  const Scaler scaler = scaled ? add_scaler(g, grads, gradients) : Scaler{};
  const ValueId lr = g.add_input(kLrInput, DType::f32, {});
  const auto* adamw = std::get_if<AdamWOptions>(&optimizer);
  ValueId step_now = adamw ? g.add_input(kStepInput, DType::i64, {}) : kNoValue;
  // A skipped step is no step for AdamW's bias corrections (PyTorch's optimizer.step() is
  // not called): it counts the steps taken less the steps skipped before this one.
  if (adamw && scaler)
    step_now = g.add_node(OpKind::sub, {}, {step_now, scaler.skipped}, "amp/optimizer_step",
                          {"amp/optimizer_step"})[0];
  // An update's inputs, with the scaler's grad_scale and skip when scaling, and the
  // parameter's low copy when it has one (its next value a last output, named).
  auto update_inputs = [&](std::vector<ValueId> inputs, const std::string& p,
                           std::vector<std::string>& names) {
    auto low = low_copy_of.find(p);
    if (scaler || low != low_copy_of.end())
      inputs.insert(inputs.end(), {scaler.inv_scale, scaler.found_inf});
    if (low != low_copy_of.end()) {
      inputs.push_back(mapped(low->second));
      names.push_back(next_state_name(low->second));
    }
    return inputs;
  };
  auto state_output = [&](const std::string& input, ValueId next) {
    g.mark_output(next);
    step.state_updates.push_back({input, g.value(next).name});
  };
  // The low copy's next value: the update's last output, when the parameter has a copy.
  auto low_output = [&](const std::string& p, const std::vector<ValueId>& outs) {
    auto low = low_copy_of.find(p);
    if (low != low_copy_of.end()) state_output(low->second, outs.back());
  };
  for (size_t i = 0; i < layout.parameters.size(); ++i) {
    const std::string& p = layout.parameters[i];
    const ValueId param = mapped(p);
    const TensorType type = g.value(param).type;
    const ValueId dparam = gradients[i];
    if (adamw) {
      const std::string m = kOptimPrefix + p + "/exp_avg", v = kOptimPrefix + p + "/exp_avg_sq";
      const AdamWAttrs attrs{.beta1 = adamw->beta1,
                             .beta2 = adamw->beta2,
                             .epsilon = adamw->eps,
                             .weight_decay = adamw->weight_decay};
      std::vector<std::string> names = {next_state_name(p), next_state_name(m), next_state_name(v)};
      const ValueId m_in = g.add_input(m, type.dtype, type.shape);
      const ValueId v_in = g.add_input(v, type.dtype, type.shape);
      const std::vector<ValueId> inputs =
          update_inputs({param, dparam, m_in, v_in, lr, step_now}, p, names);
      std::vector<ValueId> outs =
          g.add_node(OpKind::adamw_update, attrs, inputs, "adamw/" + p, names);
      state_output(p, outs[0]);
      state_output(m, outs[1]);
      state_output(v, outs[2]);
      low_output(p, outs);
      continue;
    }
    const auto& sgd = std::get<SgdOptions>(optimizer);
    const SgdAttrs attrs{.momentum = sgd.momentum,
                         .dampening = sgd.dampening,
                         .weight_decay = sgd.weight_decay,
                         .nesterov = sgd.nesterov};
    // Without momentum the buffer is never read (momentum * buf = 0) and PyTorch keeps
    // none: feed transient zeros instead of carrying state.
    const std::string buf = kOptimPrefix + p + "/momentum_buffer";
    const ValueId buf_in = sgd.momentum != 0 ? g.add_input(buf, type.dtype, type.shape)
                                             : b.op(OpKind::expand, ExpandAttrs{type.shape},
                                                    {b.constant(Tensor::zeros(type.dtype, {}))})
                                                   .at(0);
    std::vector<std::string> names = {next_state_name(p),
                                      sgd.momentum != 0 ? next_state_name(buf) : ""};
    const std::vector<ValueId> inputs = update_inputs({param, dparam, buf_in, lr}, p, names);
    std::vector<ValueId> outs = g.add_node(OpKind::sgd_update, attrs, inputs, "sgd/" + p, names);
    state_output(p, outs[0]);
    if (sgd.momentum != 0) state_output(buf, outs[1]);
    low_output(p, outs);
  }
  // The scaler's next state, after every other reader of its state (so that the CUDA
  // executable updates it in place).
  if (scaler) {
    const std::string names[] = {scaler_input(kLossScale), scaler_input(kGrowthTracker),
                                 scaler_input(kSkippedSteps)};
    const std::vector<ValueId> next = g.add_node(
        OpKind::loss_scale_update,
        LossScaleAttrs{.growth_factor = scaling.growth_factor,
                       .backoff_factor = scaling.backoff_factor,
                       .growth_interval = scaling.growth_interval},
        {scaler.scale, scaler.tracker, scaler.found_inf, scaler.skipped}, "amp/update",
        {next_state_name(names[0]), next_state_name(names[1]), next_state_name(names[2])});
    for (size_t i = 0; i < next.size(); ++i) state_output(names[i], next[i]);
  }
  for (const auto& [input, next] : statistic_outputs) {
    const std::string name = g.value(input).name;
    g.rename_value(next, next_state_name(name));
    state_output(name, next);
  }
  // The whole step's passes (passes/pipeline.h): values keep their names.
  run_pipeline(training_step_pipeline(step_fusion, norm_statistics), g);
  if (parallel) g = with_collectives_early(g);
  return step;
}

Graph build_eval_graph(const Graph& model, const ModelLayout& layout, Precision precision) {
  Graph g = rewrite_graph(model, {.constants_to_inputs = state_constants(layout),
                                  .batch_norm = BatchNormForm::inference})
                .graph;
  run_pipeline(evaluation_pipeline(precision), g);
  return g;
}

}  // namespace fusebox::train
