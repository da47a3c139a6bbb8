// TrainingSession: holds the graphs and the training state, feeds one into the other.
#include "fusebox/train/session.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "fusebox/core/compile_trace.h"
#include "fusebox/passes/fusion.h"
#include "train/graph_rewrite.h"
#include "train/step_graph.h"

namespace fusebox {

struct TrainingSession::Impl {
  train::ModelLayout layout;
  LossSpec loss;
  OptimizerSpec optimizer;  // its lr is the current lr
  SessionOptions opts;
  train::StepGraph step;
  // SGD with momentum and dampening: PyTorch's first step sets the buffer to the
  // gradient, undamped, which the update op leaves to us: step 1 runs this graph, built
  // with dampening 0 (a zero buffer then becomes exactly the gradient).
  std::optional<train::StepGraph> first_step;
  Graph eval;
  std::vector<std::string> batch_inputs;

  // The compiled step holds the training state (see session.h); the others read it.
  std::unique_ptr<Executable> step_exe;
  std::unique_ptr<Executable> first_step_exe;    // until step 1 has run
  mutable std::unique_ptr<Executable> eval_exe;  // made at the first predict()
  // Optimizer steps taken. Mutable: steps that a bad label stopped on the device come off
  // it once the error has been reported (count_applied_steps), whichever call finds out.
  mutable int64_t steps = 0;
  mutable int64_t not_applied_seen = 0;  // ExecutableStats::runs_not_applied taken off steps

  // The optimizer state's and (f16) the loss scaler's step-graph inputs, by checkpoint name
  // (parameters and buffers are inputs under their own names: layout).
  std::map<std::string, std::string> optimizer_inputs, scaler_inputs;
  // Host copies, taken at step `copied_at` (-1: none yet).
  mutable NamedTensors parameters, buffers, optimizer_state, scaler_state;
  mutable int64_t copied_at = -1;

  template <class Batch>
  void check_batch(const Batch& batch, const std::vector<std::string>& names,
                   const std::string& where) const;
  DeviceArray state(const std::string& step_input) const { return step_exe->input(step_input); }
  // The arrays of `inputs` (checkpoint name -> step input), by checkpoint name.
  std::map<std::string, DeviceArray> states(
      const std::map<std::string, std::string>& inputs) const {
    std::map<std::string, DeviceArray> arrays;
    for (const auto& [name, input] : inputs) arrays[name] = state(input);
    return arrays;
  }
  // f16: the scaler's state tensor `name` (step_graph.h), downloaded now.
  double scaler_value(const char* name) const {
    return state(train::kScalerPrefix + std::string(name)).to_host().get(0);
  }
  void copy_state_to_host() const;
  // The parameters' low copies (step_graph.h StepGraph::low_copies) from `parameters` (by
  // name), rounded as the cast they replace rounds.
  void fill_low_copies(const NamedTensors& parameters) const {
    for (const auto& [param, low] : step.low_copies) {
      const DeviceArray copy = state(low);
      copy.copy_from(parameters.at(param).cast(copy.dtype()));
    }
  }
  // Takes the runs a bad label stopped (runtime/executable.h) off `steps`.
  void count_applied_steps() const;
  // Waits for the queued steps and throws the Error of one whose kernels found bad data.
  void check_queued_steps() const;
  // Runs `f`; when it throws, the steps it stopped come off first.
  template <class F>
  auto counting_stopped_steps(F&& f) const {
    try {
      return f();
    } catch (...) {
      count_applied_steps();
      throw;
    }
  }
  // An executable of `g` whose state inputs are bound to the step's arrays.
  std::unique_ptr<Executable> compile_bound(const Graph& g, const train::StepGraph* updates) const;
};

namespace {

// "f32[16, 3, 3, 3]"
std::string type_str(DType dtype, const Shape& shape) {
  return cat(dtype_name(dtype), shape_str(shape));
}

// Every name of `expected` (the session's arrays, by checkpoint name) is in `got` with the
// same dtype and shape, and nothing else.
void check_same_tensors(const std::map<std::string, DeviceArray>& expected, const NamedTensors& got,
                        const std::string& kind, const std::string& where) {
  for (const auto& [name, a] : expected) {
    auto it = got.find(name);
    FUSEBOX_CHECK(it != got.end(), where, "no ", kind, " '", name, "' (",
                  type_str(a.dtype(), a.shape()),
                  ") in the checkpoint: is it from another model or optimizer?");
    const Tensor& t = it->second;
    FUSEBOX_CHECK(t.dtype() == a.dtype() && t.shape() == a.shape(), where, kind, " '", name,
                  "' is ", type_str(t.dtype(), t.shape()), " in the checkpoint but ",
                  type_str(a.dtype(), a.shape()), " in this session: is it from another model?");
  }
  for (const auto& [name, t] : got)
    FUSEBOX_CHECK(expected.count(name), where, "the checkpoint holds ", kind, " '", name,
                  "', which this session does not have: is it from another model or optimizer?");
}

}  // namespace

template <class Batch>
void TrainingSession::Impl::check_batch(const Batch& batch, const std::vector<std::string>& names,
                                        const std::string& where) const {
  for (const std::string& name : names)
    FUSEBOX_CHECK(batch.count(name), where, "the batch has no '", name, "'");
  for (const auto& [name, t] : batch) {
    bool known = std::find(names.begin(), names.end(), name) != names.end();
    FUSEBOX_CHECK(known, where, "the batch holds '", name, "', which is not a model input",
                  names.size() > layout.data_inputs.size() ? " or the labels" : "");
  }
}

void TrainingSession::Impl::check_queued_steps() const {
  counting_stopped_steps([&] {
    step_exe->check_errors();
    if (first_step_exe) first_step_exe->check_errors();
  });
  count_applied_steps();
}

void TrainingSession::Impl::count_applied_steps() const {
  int64_t not_applied = int64_t(step_exe->stats().runs_not_applied);
  if (first_step_exe) not_applied += int64_t(first_step_exe->stats().runs_not_applied);
  if (not_applied == not_applied_seen) return;
  steps -= not_applied - not_applied_seen;
  not_applied_seen = not_applied;
  copied_at = -1;
}

void TrainingSession::Impl::copy_state_to_host() const {
  check_queued_steps();  // a bad label not yet reported is reported here, before any copy
  if (copied_at == steps) return;
  for (const std::string& p : layout.parameters) parameters[p] = state(p).to_host();
  for (const std::string& b : layout.buffers) buffers[b] = state(b).to_host();
  for (const auto& [name, input] : optimizer_inputs) optimizer_state[name] = state(input).to_host();
  for (const auto& [name, input] : scaler_inputs) scaler_state[name] = state(input).to_host();
  copied_at = steps;
}

std::unique_ptr<Executable> TrainingSession::Impl::compile_bound(
    const Graph& g, const train::StepGraph* updates) const {
  CompileOptions co{.device = opts.device,
                    .cpu_kernels = opts.cpu_kernels,
                    .communicator = opts.data_parallel.world};
  for (ValueId v : g.inputs()) {
    const std::string& name = g.value(v).name;
    if (std::find(batch_inputs.begin(), batch_inputs.end(), name) != batch_inputs.end() ||
        name == train::kLrInput || name == train::kStepInput)
      continue;
    co.bound[name] = state(name);
  }
  if (updates) {
    for (const auto& [input, output] : updates->state_updates)
      co.aliases.emplace_back(output, input);
  }
  return Executable::compile(g, co);
}

TrainingSession::TrainingSession(const Graph& model, const LossSpec& loss,
                                 const OptimizerSpec& optimizer, const SessionOptions& opts)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  const std::string where = "train " + model.name();
  check_optimizer(optimizer, where);
  s.layout = train::analyse_model(model, loss, opts);
  s.loss = loss;
  s.optimizer = optimizer;
  s.opts = opts;
  const bool scaled = opts.precision == Precision::f16;
  if (scaled) {
    const double init = opts.loss_scaling.init_scale;
    FUSEBOX_CHECK(std::isfinite(init) && init > 0, where, "loss_scaling.init_scale ", init,
                  " must be finite and > 0");
  }
  const DataParallel& dp = opts.data_parallel;
  if (dp.world) {
    FUSEBOX_CHECK(dp.reduce_dtype == DType::f32 || dp.reduce_dtype == DType::bf16, where,
                  "data_parallel.reduce_dtype must be f32 or bf16, got ",
                  dtype_name(dp.reduce_dtype));
    FUSEBOX_CHECK(dp.bucket_bytes > 0, where, "data_parallel.bucket_bytes must be > 0");
  }
  const InferenceFusionOptions fusion = InferenceFusionOptions::from_env();
  const bool step_fusion = opts.step_fusion && fusion.pointwise;
  // The GPU computes the statistics in the convolutions' epilogue; the CPU backends would
  // only move the norm's pass (passes/fusion.h fold_norm_statistics: off unless asked for).
  const bool norm_statistics = step_fusion && fusion.norm_statistics && opts.device == Device::cuda;
  {
    const TracePhase trace("training step graph");
    s.step =
        train::build_step_graph(model, s.layout, loss, optimizer, opts.precision, opts.loss_scaling,
                                dp, opts.low_parameter_copies, step_fusion, norm_statistics);
  }
  // (With f16, a skipped step 1 leaves the buffer at 0 and step 2 damps: PyTorch would
  // start the buffer at step 2's gradient.)
  if (const auto* sgd = std::get_if<SgdOptions>(&optimizer);
      sgd && sgd->momentum != 0 && sgd->dampening != 0) {
    SgdOptions undamped = *sgd;
    undamped.dampening = 0;
    s.first_step =
        train::build_step_graph(model, s.layout, loss, undamped, opts.precision, opts.loss_scaling,
                                dp, opts.low_parameter_copies, step_fusion, norm_statistics);
  }
  s.eval = train::build_eval_graph(model, s.layout, opts.precision);
  s.batch_inputs = s.layout.data_inputs;
  s.batch_inputs.push_back(loss.labels);

  // Compile the step with every state input aliased to its next value, then upload the
  // initial state (the model's constants, zero optimizer state) into its arrays, once.
  CompileOptions co{
      .device = opts.device, .cpu_kernels = opts.cpu_kernels, .communicator = dp.world};
  for (const auto& [input, output] : s.step.state_updates) co.aliases.emplace_back(output, input);
  s.step_exe = Executable::compile(s.step.graph, co);
  NamedTensors initial;
  for (const std::string& p : s.layout.parameters)
    initial[p] = *model.constant(*model.find_value(p));
  for (const auto& [name, t] : train::initial_optimizer_state(s.layout, initial, optimizer)) {
    s.optimizer_inputs[name] = train::kOptimPrefix + name;
    s.state(train::kOptimPrefix + name).copy_from(t);
  }
  if (scaled) {
    for (const auto& [name, t] : train::initial_scaler_state(opts.loss_scaling)) {
      s.scaler_inputs[name] = train::kScalerPrefix + name;
      s.state(train::kScalerPrefix + name).copy_from(t);
    }
  }
  for (const std::string& b : s.layout.buffers) initial[b] = *model.constant(*model.find_value(b));
  if (dp.world && dp.world->world_size() > 1) {
    // Every rank starts from rank 0's parameters and statistics (DDP's rule); the broadcast
    // writes into copies, never into the model's constants.
    for (auto& [name, t] : initial) {
      Tensor mine = t.clone();
      dp.world->broadcast(mine, 0);
      t = mine;
    }
  }
  for (const auto& [name, t] : initial) s.state(name).copy_from(t);
  s.fill_low_copies(initial);
}

TrainingSession::~TrainingSession() = default;
TrainingSession::TrainingSession(TrainingSession&&) noexcept = default;
TrainingSession& TrainingSession::operator=(TrainingSession&&) noexcept = default;

PendingTensor TrainingSession::step_async(const NamedTensors& batch) {
  return step_async(Feeds(batch.begin(), batch.end()));
}

PendingTensor TrainingSession::step_async(const Feeds& batch) {
  Impl& s = *impl_;
  s.count_applied_steps();
  const bool first = s.first_step && s.steps == 0;
  const train::StepGraph& sg = first ? *s.first_step : s.step;
  s.check_batch(batch, s.batch_inputs, "train step " + sg.graph.name());
  if (first && !s.first_step_exe) s.first_step_exe = s.compile_bound(sg.graph, &sg);
  Executable& exe = first ? *s.first_step_exe : *s.step_exe;

  Feeds feeds = batch;
  feeds[train::kLrInput] = Tensor::scalar(DType::f32, optimizer_lr(s.optimizer));
  if (std::holds_alternative<AdamWOptions>(s.optimizer))
    feeds[train::kStepInput] = Tensor::from_vector<int64_t>({}, {s.steps + 1});
  StepResult r = s.counting_stopped_steps(
      [&] { return exe.run_async(feeds, {train::kLossOutput}, cat("step ", s.steps + 1)); });
  ++s.steps;
  if (!first && s.first_step_exe) {  // its memory, once step 1 is behind
    s.count_applied_steps();
    s.not_applied_seen -= int64_t(s.first_step_exe->stats().runs_not_applied);
    s.first_step_exe.reset();
  }
  return r.host.at(train::kLossOutput);
}

std::unique_ptr<Executable> TrainingSession::profiled_step(const Feeds& batch) const {
  const Impl& s = *impl_;
  s.check_batch(batch, s.batch_inputs, "profiled train step " + s.step.graph.name());
  std::unique_ptr<Executable> exe = s.compile_bound(s.step.graph, nullptr);
  Feeds feeds = batch;
  feeds[train::kLrInput] = Tensor::scalar(DType::f32, optimizer_lr(s.optimizer));
  if (std::holds_alternative<AdamWOptions>(s.optimizer))
    feeds[train::kStepInput] = Tensor::from_vector<int64_t>({}, {s.steps + 1});
  exe->run_async(feeds, {}, "profiled step");
  exe->check_errors();
  return exe;
}

Graph TrainingSession::trained_model(const Graph& model) const {
  train::RewriteOptions opts;
  opts.batch_norm = train::BatchNormForm::inference;
  for (const auto& [name, t] : parameters()) opts.constant_values[name] = t;
  for (const auto& [name, t] : buffers()) opts.constant_values[name] = t;
  return train::rewrite_graph(model, opts).graph;
}

float TrainingSession::step(const NamedTensors& batch) {
  return float(step_async(batch).get().get(0));
}

void TrainingSession::synchronize() {
  impl_->check_queued_steps();
}

NamedTensors TrainingSession::predict(const NamedTensors& batch) const {
  const Impl& s = *impl_;
  s.check_batch(batch, s.layout.data_inputs, "predict " + s.eval.name());
  if (!s.eval_exe) s.eval_exe = s.compile_bound(s.eval, nullptr);
  return s.eval_exe->run(batch);
}

void TrainingSession::set_lr(double lr) {
  OptimizerSpec spec = with_lr(impl_->optimizer, lr);
  check_optimizer(spec, "set_lr");
  impl_->optimizer = spec;
}

double TrainingSession::lr() const {
  return optimizer_lr(impl_->optimizer);
}
int64_t TrainingSession::step_count() const {
  impl_->count_applied_steps();
  return impl_->steps;
}
const OptimizerSpec& TrainingSession::optimizer() const {
  return impl_->optimizer;
}
const std::vector<std::string>& TrainingSession::batch_inputs() const {
  return impl_->batch_inputs;
}
const std::vector<std::string>& TrainingSession::parameter_names() const {
  return impl_->layout.parameters;
}
const NamedTensors& TrainingSession::parameters() const {
  impl_->copy_state_to_host();
  return impl_->parameters;
}
const NamedTensors& TrainingSession::buffers() const {
  impl_->copy_state_to_host();
  return impl_->buffers;
}
const NamedTensors& TrainingSession::optimizer_state() const {
  impl_->copy_state_to_host();
  return impl_->optimizer_state;
}
const NamedTensors& TrainingSession::scaler_state() const {
  impl_->copy_state_to_host();
  return impl_->scaler_state;
}
int64_t TrainingSession::skipped_steps() const {
  if (impl_->scaler_inputs.empty()) return 0;
  return int64_t(impl_->scaler_value(train::kSkippedSteps));
}
double TrainingSession::loss_scale() const {
  if (impl_->scaler_inputs.empty()) return 1.0;
  return impl_->scaler_value(train::kLossScale);
}
const Executable& TrainingSession::step_executable() const {
  return *impl_->step_exe;
}
const Graph& TrainingSession::step_graph() const {
  return impl_->step.graph;
}
const Graph& TrainingSession::eval_graph() const {
  return impl_->eval;
}
const std::vector<std::pair<std::string, std::string>>& TrainingSession::state_updates() const {
  return impl_->step.state_updates;
}

Checkpoint TrainingSession::checkpoint() const {
  const Impl& s = *impl_;
  s.copy_state_to_host();  // a snapshot: later steps replace the copies, never write them
  return Checkpoint{.step = s.steps,
                    .optimizer = s.optimizer,
                    .parameters = s.parameters,
                    .buffers = s.buffers,
                    .optimizer_state = s.optimizer_state,
                    .scaler = s.scaler_state};
}

void TrainingSession::restore(const Checkpoint& ckpt, const std::string& where) {
  Impl& s = *impl_;
  // A check point: a queued step's bad label is reported before the state is replaced (a
  // pending halt would otherwise stop the steps after the restore).
  s.check_queued_steps();
  const std::string mine = optimizer_name(s.optimizer), theirs = optimizer_name(ckpt.optimizer);
  FUSEBOX_CHECK(mine == theirs, where, "the checkpoint is for the ", theirs,
                " optimizer but this session uses ", mine);
  const auto expected = optimizer_hyper_parameters(s.optimizer);
  const auto got = optimizer_hyper_parameters(ckpt.optimizer);
  for (size_t i = 1; i < expected.size(); ++i) {  // [0] is the lr, which may change
    FUSEBOX_CHECK(expected[i].second == got[i].second, where, "the checkpoint's ", theirs, " ",
                  got[i].first, " is ", got[i].second, " but this session's is ",
                  expected[i].second);
  }
  FUSEBOX_CHECK(ckpt.step >= 0, where, "negative step count ", ckpt.step);
  const bool scaled = !s.scaler_inputs.empty();
  FUSEBOX_CHECK(scaled == !ckpt.scaler.empty(), where, "the checkpoint ",
                scaled ? "has no" : "holds", " loss-scaling state (amp/: f16 training) but this ",
                "session trains in ", precision_name(s.opts.precision));
  // Checked against the arrays' types (nothing is downloaded), then uploaded once into
  // the arrays the step updates in place.
  std::map<std::string, DeviceArray> parameters, buffers;
  for (const std::string& p : s.layout.parameters) parameters[p] = s.state(p);
  for (const std::string& b : s.layout.buffers) buffers[b] = s.state(b);
  std::map<std::string, DeviceArray> optimizer_state = s.states(s.optimizer_inputs);
  std::map<std::string, DeviceArray> scaler = s.states(s.scaler_inputs);
  check_same_tensors(parameters, ckpt.parameters, "parameter", where);
  check_same_tensors(buffers, ckpt.buffers, "buffer", where);
  check_same_tensors(optimizer_state, ckpt.optimizer_state, "optimizer state", where);
  check_same_tensors(scaler, ckpt.scaler, "loss scaler state", where);
  for (const auto& [name, t] : ckpt.parameters) parameters.at(name).copy_from(t);
  for (const auto& [name, t] : ckpt.buffers) buffers.at(name).copy_from(t);
  for (const auto& [name, t] : ckpt.optimizer_state) optimizer_state.at(name).copy_from(t);
  for (const auto& [name, t] : ckpt.scaler) scaler.at(name).copy_from(t);
  s.fill_low_copies(ckpt.parameters);
  s.steps = ckpt.step;
  s.copied_at = -1;  // the host copies are taken again when asked for
  s.optimizer = ckpt.optimizer;
}

void TrainingSession::save(const std::string& path) const {
  save_checkpoint(path, checkpoint());
}

void TrainingSession::load(const std::string& path) {
  restore(load_checkpoint(path), "checkpoint: " + path);
}

}  // namespace fusebox
