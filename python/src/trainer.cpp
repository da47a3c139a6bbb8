#include "trainer.h"

#include <nanobind/stl/string.h>

#include <set>

#include "fusebox/backends/cuda.h"
#include "fusebox/frontends/onnx.h"
#include "fusebox/io/tensor_file.h"
#include "fusebox/passes/mixed_precision.h"
#include "fusebox/runtime/executor.h"
#include "fusebox/train/checkpoint.h"

namespace fusebox::python {

double PendingLoss::item() {
  if (!value_) {
    nb::gil_scoped_release released;
    value_ = pending_.get().get(0);
  }
  return *value_;
}

namespace {

OptimizerSpec make_optimizer(const std::string& name, std::optional<double> lr, double momentum,
                             std::optional<double> weight_decay) {
  if (name == "sgd") {
    SgdOptions o;
    o.lr = lr.value_or(0.05);
    o.momentum = momentum;
    o.weight_decay = weight_decay.value_or(0.0);
    return o;
  }
  if (name == "adamw") {
    AdamWOptions o;
    o.lr = lr.value_or(1e-3);
    o.weight_decay = weight_decay.value_or(0.01);
    return o;
  }
  throw Error("fusebox.Trainer", cat("optimizer '", name, "' is not one of sgd, adamw"));
}

}  // namespace

PyTrainer::PyTrainer(std::shared_ptr<const Graph> model, const std::string& optimizer,
                     std::optional<double> lr, double momentum, std::optional<double> weight_decay,
                     const std::string& device, const std::string& precision)
    : model_(std::move(model)), where_("fusebox.Trainer " + model_->name()) {
  device_ = parse_device(device);
  const Precision p = parse_precision(precision);
  const OptimizerSpec spec = make_optimizer(optimizer, lr, momentum, weight_decay);
  {
    nb::gil_scoped_release released;
    if (device_ == Device::cuda) cuda::set_tf32(p != Precision::f32);
    session_ = std::make_unique<TrainingSession>(
        *model_, LossSpec{}, spec,
        SessionOptions{.device = device_, .cpu_kernels = cpu_kernels_for(device), .precision = p});
  }
  const Graph& step = session_->step_graph();
  for (const std::string& name : session_->batch_inputs()) {
    const Value& v = step.value(*step.find_value(name));
    batch_.push_back({name, v.type.dtype, v.type.shape});
  }
}

Feed PyTrainer::feed(const InputArray& a, const TensorSpec& spec) const {
  check_type(a, spec, where_);
  check_device(a, spec.name, device_, where_);
  if (device_ == Device::cpu) return host_tensor(a, spec.dtype);
  return cuda_feed(a, spec.dtype);
}

PendingLoss PyTrainer::step(nb::handle x, nb::handle y) {
  FUSEBOX_CHECK(batch_.size() == 2, where_, "step(x, y) takes a model of one input; this one has ",
                batch_.size() - 1);
  const InputArray xa = import_array(x, batch_[0].name, where_);
  const InputArray ya = import_array(y, batch_[1].name, where_);
  nb::gil_scoped_release released;
  std::lock_guard lock(mutex_);
  Feeds feeds;
  feeds[batch_[0].name] = feed(xa, batch_[0]);
  feeds[batch_[1].name] = feed(ya, batch_[1]);
  return PendingLoss(session_->step_async(feeds));
}

nb::tuple PyTrainer::predict(nb::handle x) {
  const InputArray xa = import_array(x, batch_[0].name, where_);
  check_type(xa, batch_[0], where_);
  FUSEBOX_CHECK(xa.device_type() == nb::device::cpu::value, where_,
                "predict reads host arrays (numpy, or torch's x.cpu())");
  NamedTensors outputs;
  {
    nb::gil_scoped_release released;
    std::lock_guard lock(mutex_);
    outputs = session_->predict({{batch_[0].name, host_tensor(xa, batch_[0].dtype)}});
  }
  nb::list out;
  for (ValueId v : model_->outputs())
    out.append(to_numpy(outputs.at(model_->value(v).name).clone()));
  return nb::tuple(out);
}

nb::dict PyTrainer::state_dict() {
  NamedTensors params, buffers;
  {
    nb::gil_scoped_release released;
    std::lock_guard lock(mutex_);
    params = session_->parameters();
    buffers = session_->buffers();
  }
  nb::dict d;
  for (const NamedTensors* group : {&params, &buffers})
    for (const auto& [name, t] : *group) d[name.c_str()] = to_numpy(t.clone());
  return d;
}

void PyTrainer::load_state_dict(nb::dict state, bool strict) {
  const std::string where = where_ + ": load_state_dict";
  std::map<std::string, InputArray> given;
  for (auto [key, value] : state) {
    const std::string name = nb::cast<std::string>(key);
    given.emplace(name, import_array(value, name, where));
  }
  nb::gil_scoped_release released;
  std::lock_guard lock(mutex_);
  Checkpoint ckpt = session_->checkpoint();
  std::set<std::string> taken;
  for (auto* group : {&ckpt.parameters, &ckpt.buffers}) {
    for (auto& [name, t] : *group) {
      auto it = given.find(name);
      if (it == given.end()) {
        FUSEBOX_CHECK(!strict, where, "'", name,
                      "' is not given (strict=True: every parameter and buffer)");
        continue;
      }
      check_type(it->second, TensorSpec{name, t.dtype(), t.shape()}, where);
      FUSEBOX_CHECK(it->second.device_type() == nb::device::cpu::value, where, "'", name,
                    "' must be a host array (numpy, or torch's .cpu())");
      t = host_tensor(it->second, t.dtype()).clone();
      taken.insert(name);
    }
  }
  if (strict) {
    for (const auto& [name, a] : given)
      FUSEBOX_CHECK(taken.count(name), where, "'", name,
                    "' is not a parameter or buffer of the model (strict=True)");
  }
  session_->restore(ckpt, where);
}

void PyTrainer::save(const std::string& path) {
  nb::gil_scoped_release released;
  std::lock_guard lock(mutex_);
  session_->save(path);
}

void PyTrainer::load(const std::string& path) {
  nb::gil_scoped_release released;
  std::lock_guard lock(mutex_);
  session_->load(path);
}

void PyTrainer::export_onnx(const std::string& path) {
  nb::gil_scoped_release released;
  std::lock_guard lock(mutex_);
  write_file_atomic(path, export_onnx_bytes(session_->trained_model(*model_)));
}

int64_t PyTrainer::step_count() {
  nb::gil_scoped_release released;
  std::lock_guard lock(mutex_);
  return session_->step_count();
}

double PyTrainer::lr() {
  std::lock_guard lock(mutex_);
  return session_->lr();
}

void PyTrainer::set_lr(double lr) {
  std::lock_guard lock(mutex_);
  session_->set_lr(lr);
}

}  // namespace fusebox::python
