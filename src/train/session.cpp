// TrainingSession: holds the graphs and the training state, feeds one into the other.
#include "fusebox/train/session.h"

#include <algorithm>

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

  // The training state (see session.h on where it lives).
  NamedTensors parameters, buffers, optimizer_state;
  int64_t steps = 0;

  // Checks that `batch` holds exactly `names`.
  void check_batch(const NamedTensors& batch, const std::vector<std::string>& names,
                   const std::string& where) const;
  // Runs `g` on the batch plus the state; the one place that hands state to a backend.
  NamedTensors run_with_state(const Graph& g, NamedTensors feeds, bool with_optimizer) const;
};

namespace {

// "f32[16, 3, 3, 3]"
std::string type_str(const Tensor& t) {
  return cat(dtype_name(t.dtype()), shape_str(t.shape()));
}

// Every name of `expected` is in `got` with the same dtype and shape, and nothing else.
void check_same_tensors(const NamedTensors& expected, const NamedTensors& got,
                        const std::string& kind, const std::string& where) {
  for (const auto& [name, t] : expected) {
    auto it = got.find(name);
    FUSEBOX_CHECK(it != got.end(), where, "no ", kind, " '", name, "' (", type_str(t),
                  ") in the checkpoint: is it from another model or optimizer?");
    FUSEBOX_CHECK(it->second.dtype() == t.dtype() && it->second.shape() == t.shape(), where, kind,
                  " '", name, "' is ", type_str(it->second), " in the checkpoint but ", type_str(t),
                  " in this session: is it from another model?");
  }
  for (const auto& [name, t] : got)
    FUSEBOX_CHECK(expected.count(name), where, "the checkpoint holds ", kind, " '", name,
                  "', which this session does not have: is it from another model or optimizer?");
}

NamedTensors cloned(const NamedTensors& tensors) {
  NamedTensors out;
  for (const auto& [name, t] : tensors) out[name] = t.clone();
  return out;
}

}  // namespace

void TrainingSession::Impl::check_batch(const NamedTensors& batch,
                                        const std::vector<std::string>& names,
                                        const std::string& where) const {
  for (const std::string& name : names)
    FUSEBOX_CHECK(batch.count(name), where, "the batch has no '", name, "'");
  for (const auto& [name, t] : batch) {
    bool known = std::find(names.begin(), names.end(), name) != names.end();
    FUSEBOX_CHECK(known, where, "the batch holds '", name, "', which is not a model input",
                  names.size() > layout.data_inputs.size() ? " or the labels" : "");
  }
}

NamedTensors TrainingSession::Impl::run_with_state(const Graph& g, NamedTensors feeds,
                                                   bool with_optimizer) const {
  feeds.insert(parameters.begin(), parameters.end());
  feeds.insert(buffers.begin(), buffers.end());
  if (with_optimizer) {
    for (const auto& [name, t] : optimizer_state) feeds[train::kOptimPrefix + name] = t;
    feeds[train::kLrInput] = Tensor::scalar(DType::f32, optimizer_lr(optimizer));
    if (std::holds_alternative<AdamWOptions>(optimizer))
      feeds[train::kStepInput] = Tensor::from_vector<int64_t>({}, {steps + 1});
  }
  return run_graph(g, feeds, RunOptions{.device = opts.device});
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
  // The model's constants are never written, so the state can start as handles to them.
  for (const std::string& p : s.layout.parameters)
    s.parameters[p] = *model.constant(*model.find_value(p));
  for (const std::string& b : s.layout.buffers)
    s.buffers[b] = *model.constant(*model.find_value(b));
  s.optimizer_state = train::initial_optimizer_state(s.layout, s.parameters, optimizer);

  s.step = train::build_step_graph(model, s.layout, loss, optimizer);
  if (const auto* sgd = std::get_if<SgdOptions>(&optimizer);
      sgd && sgd->momentum != 0 && sgd->dampening != 0) {
    SgdOptions undamped = *sgd;
    undamped.dampening = 0;
    s.first_step = train::build_step_graph(model, s.layout, loss, undamped);
  }
  s.eval = train::build_eval_graph(model, s.layout);
  s.batch_inputs = s.layout.data_inputs;
  s.batch_inputs.push_back(loss.labels);
}

TrainingSession::~TrainingSession() = default;
TrainingSession::TrainingSession(TrainingSession&&) noexcept = default;
TrainingSession& TrainingSession::operator=(TrainingSession&&) noexcept = default;

float TrainingSession::step(const NamedTensors& batch) {
  Impl& s = *impl_;
  const train::StepGraph& sg = s.first_step && s.steps == 0 ? *s.first_step : s.step;
  s.check_batch(batch, s.batch_inputs, "train step " + sg.graph.name());
  NamedTensors out = s.run_with_state(sg.graph, batch, true);

  // The run succeeded: swap every state tensor for its next value.
  const size_t prefix = std::string(train::kOptimPrefix).size();
  for (const auto& [input, output] : sg.state_updates) {
    Tensor next = out.at(output);
    if (input.starts_with(train::kOptimPrefix)) {
      s.optimizer_state[input.substr(prefix)] = std::move(next);
    } else if (s.parameters.count(input)) {
      s.parameters[input] = std::move(next);
    } else {
      s.buffers.at(input) = std::move(next);
    }
  }
  ++s.steps;
  return float(out.at(train::kLossOutput).get(0));
}

NamedTensors TrainingSession::predict(const NamedTensors& batch) const {
  const Impl& s = *impl_;
  s.check_batch(batch, s.layout.data_inputs, "predict " + s.eval.name());
  return s.run_with_state(s.eval, batch, false);
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
  return impl_->parameters;
}
const NamedTensors& TrainingSession::buffers() const {
  return impl_->buffers;
}
const NamedTensors& TrainingSession::optimizer_state() const {
  return impl_->optimizer_state;
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
  // State tensors are replaced, never written, so handles are a consistent snapshot.
  return Checkpoint{.step = s.steps,
                    .optimizer = s.optimizer,
                    .parameters = s.parameters,
                    .buffers = s.buffers,
                    .optimizer_state = s.optimizer_state};
}

void TrainingSession::restore(const Checkpoint& ckpt, const std::string& where) {
  Impl& s = *impl_;
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
  check_same_tensors(s.parameters, ckpt.parameters, "parameter", where);
  check_same_tensors(s.buffers, ckpt.buffers, "buffer", where);
  check_same_tensors(s.optimizer_state, ckpt.optimizer_state, "optimizer state", where);

  s.parameters = cloned(ckpt.parameters);
  s.buffers = cloned(ckpt.buffers);
  s.optimizer_state = cloned(ckpt.optimizer_state);
  s.steps = ckpt.step;
  s.optimizer = ckpt.optimizer;
}

void TrainingSession::save(const std::string& path) const {
  save_checkpoint(path, checkpoint());
}

void TrainingSession::load(const std::string& path) {
  restore(load_checkpoint(path), "checkpoint: " + path);
}

}  // namespace fusebox
