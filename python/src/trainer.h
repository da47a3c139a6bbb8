// fusebox.Trainer: a TrainingSession (fusebox/train/session.h) driven from Python, on arrays from
// any data loader (docs/python.md).
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "fusebox/train/session.h"

namespace fusebox::python {

// A step's loss, on its way: float(loss) or loss.item() waits for the step (the GIL released)
// and throws the Error of a step whose kernels found bad data (a label out of range).
class PendingLoss {
 public:
  explicit PendingLoss(PendingTensor t) : pending_(std::move(t)) {}
  double item();
  bool ready() const { return pending_.ready(); }

 private:
  PendingTensor pending_;
  std::optional<double> value_;
};

class PyTrainer {
 public:
  PyTrainer(std::shared_ptr<const Graph> model, const std::string& optimizer,
            std::optional<double> lr, double momentum, std::optional<double> weight_decay,
            const std::string& device, const std::string& precision);

  // One optimizer step on (x, y): the model's input and the labels, each of exactly the
  // batch's dtype and shape, on the trainer's device (CPU: read in place where C-contiguous;
  // CUDA: one device copy). Returns at once with the loss on its way.
  PendingLoss step(nb::handle x, nb::handle y);
  // The model's outputs on x in eval form (batch norms with their running statistics), as
  // numpy arrays in the model's output order.
  nb::tuple predict(nb::handle x);
  // Parameters and buffers (running statistics) by their model names, as numpy copies taken
  // after the steps queued so far.
  nb::dict state_dict();
  // Takes parameters and buffers by name (the same dtypes and shapes; strict: every one of them
  // given and no other). The optimizer state is kept. On error nothing changes.
  void load_state_dict(nb::dict state, bool strict);
  void save(const std::string& path);  // a checkpoint (.npz, train/checkpoint.h)
  void load(const std::string& path);
  // The trained model as ONNX (TrainingSession::trained_model: batch norms in inference form).
  void export_onnx(const std::string& path);

  int64_t step_count();
  double lr();
  void set_lr(double lr);
  const std::vector<TensorSpec>& batch() const { return batch_; }
  Device device() const { return device_; }

 private:
  // An input array checked against its spec and fed as the device takes it.
  Feed feed(const InputArray& a, const TensorSpec& spec) const;

  std::shared_ptr<const Graph> model_;
  std::unique_ptr<TrainingSession> session_;
  std::vector<TensorSpec> batch_;  // the model's input, then the labels
  Device device_;
  std::string where_;
  std::mutex mutex_;  // a session takes one call at a time; the GIL is released in its calls
};

}  // namespace fusebox::python
