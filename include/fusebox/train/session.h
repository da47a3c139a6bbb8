// Training: one step graph (forward + loss + gradients + optimizer updates) run over
// and over, with the training state living in the session between steps.
//
//   Graph model = build_zoo_model("resnet18", {.batch = 8, .image_size = 32,
//                                              .num_classes = 10, .training = true});
//   TrainingSession session(model, LossSpec{}, SgdOptions{.lr = 0.1, .momentum = 0.9});
//   for (...) float loss = session.step({{"input", x}, {"labels", y}});
//   NamedTensors out = session.predict({{"input", x}});   // eval mode: running statistics
//   session.save("ckpt.npz");                              // see train/checkpoint.h
//
// The model is a forward graph whose parameters are graph constants (a zoo model, an
// imported ONNX model). The session builds, once:
//   - the STEP graph: the model with its parameters and batch-norm running statistics
//     turned into graph inputs and every batch_norm in training form, then
//     cross_entropy(logits, labels), the gradients (passes/autodiff.h), one
//     sgd_update / adamw_update node per parameter (lr and step are scalar inputs), and
//     the batch norms' new running statistics as outputs;
//   - the EVAL graph: the same model with batch_norm in inference form reading the
//     running statistics, and no loss: predict() runs it on the same parameters.
//
// Training state: the parameters, the optimizer state (SGD momentum buffers, AdamW m and
// v), the batch-norm running statistics and, for f16, the loss scaler's state (scale,
// growth tracker, skipped steps: LossScaling) live in the step's compiled executable
// (runtime/executable.h), each a step-graph input whose "next" output is aliased to it:
// on CUDA they stay on the GPU, updated in place by the step (the optimizer updates write
// them where they are; the running statistics, written in the forward pass before the
// labels are checked, are copied in at the step's end), and only the batch, lr, step count and
// the loss cross the bus. On the CPU the executable swaps tensor handles instead. The
// whole step, forward to optimizer, is one executable run (one CUDA graph replay).
// Host copies are made only for parameters(), buffers(), optimizer_state() and
// checkpoint() (and only when a step has run since the last copy); restore() uploads once.
// The eval graph's executable reads the same arrays. The step counter is a host integer,
// fed (like lr) as a scalar input each step.
//
// Asynchronous steps: step_async() queues a step and returns its loss on its way; the
// next step does not wait for it. A kernel that finds bad data (a label outside [0, C))
// is reported as an Error naming the step, when that step's loss is read or at a later
// step, synchronize(), parameters() or checkpoint() (whichever comes first). The state is
// then the last good one: on CUDA the bad step and the steps queued after it apply nothing
// (runtime/executable.h), the error says how many, and step_count() no longer counts them;
// training may go on from there. (Exception: with SGD dampening, a bad label in step 1,
// which runs its own executable, does not stop the steps queued after it.)
//
// Determinism: on the CPU backend a step is a pure function of the state and the batch,
// and the kernels' summation order does not depend on FUSEBOX_NUM_THREADS (checked by a
// test: 1 and 3 threads give the same bits), so a resumed run repeats the losses of an
// uninterrupted one bit for bit.
//
// Which constants are trained: every floating-point constant the model's nodes read,
// except the batch-norm running statistics (inputs 3 and 4 of a batch_norm: state, not
// trained), rank-0 constants (literal numbers an ONNX export leaves behind, e.g. a
// divisor), one-element constants read only by mul / div / pow (the same literals with dims:
// PyTorch's SDPA export scales q and k^T by a [1]; a bias [1] read by an add, Linear(d, 1)'s,
// and a shared PReLU slope [1], read through an expand, are trained) and the names in
// SessionOptions::frozen. Parameter names are the constants'
// names (torchvision names for zoo models, initializer names for ONNX models).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "fusebox/dist/communicator.h"
#include "fusebox/ir/graph.h"
#include "fusebox/passes/mixed_precision.h"
#include "fusebox/runtime/executable.h"
#include "fusebox/train/checkpoint.h"
#include "fusebox/train/optimizer.h"

namespace fusebox {

enum class LossKind : uint8_t { cross_entropy };

// cross_entropy(logits, labels), mean over the batch (ops.h cross_entropy).
struct LossSpec {
  LossKind kind = LossKind::cross_entropy;
  // The model output holding the logits [N, C, D...]; empty: the model's only output.
  std::string logits;
  // The new step-graph input holding the labels [N, D...].
  std::string labels = "labels";
  DType labels_dtype = DType::i64;
  std::optional<int64_t> ignore_index;
};

// f16 training's dynamic loss scaling: PyTorch's torch.cuda.amp.GradScaler, with its
// defaults (docs/mixed_precision.md, "f16 and loss scaling"). The backward pass is seeded
// with the scale instead of 1; a step whose gradients hold an infinity or a NaN is skipped
// (parameters and optimizer state unchanged) and halves the scale; after growth_interval
// steps in a row without one the scale doubles. All of it runs inside the step, on the
// device: the scale is step state like the parameters.
struct LossScaling {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;   // > 1
  double backoff_factor = 0.5;  // in (0, 1)
  int64_t growth_interval = 2000;
};

// Data-parallel training (docs/distributed.md): one session per rank, each on its own shard
// of every batch, the ranks' gradients averaged inside the step. The step graph gets
// all_reduce nodes (ops.h), each a bucket of gradients in the order the backward pass
// produces them, placed right after the last of them so that on the GPU it overlaps the rest
// of the backward pass; the optimizer updates (and f16's inf/NaN check) read the averages, so
// every rank applies the same update to the same parameters. The loss a step returns is the
// mean of the ranks' losses. At construction the parameters and batch-norm statistics are
// taken from rank 0 (broadcast), as DDP does; later each rank keeps its own running
// statistics (its own batches'), and checkpoints are rank 0's business.
struct DataParallel {
  // The world (mpi_world() for the CPU backend, nccl_communicator() for CUDA); null: one
  // process, no all_reduce nodes. Every rank of it must build the same session.
  std::shared_ptr<dist::Communicator> world;
  // Gradient bytes (as reduce_dtype) per all_reduce: a bucket closes once it holds this many.
  size_t bucket_bytes = size_t(25) << 20;
  // What the gradients are summed in: f32, or bf16 (half the bytes; rounded once before).
  DType reduce_dtype = DType::f32;
  // Synchronized batch norm: every training batch norm normalises with the statistics of the
  // whole step's batch (all ranks' shards), forward and backward, as PyTorch's
  // SyncBatchNorm; its running statistics are then the same on every rank. The fused batch
  // norm kernels exchange their per-channel totals (BatchNormAttrs::sync): one small
  // all-gather per batch norm in the forward pass and one in the backward, on the critical
  // path.
  bool sync_batch_norm = false;
};

struct SessionOptions {
  Device device = Device::cpu;
  // On the CPU: the reference kernels (exact, the oracle's numbers) or the fast ones where
  // they take a node (oneDNN's forward and backward convolutions, products, pooling...: within
  // docs/cpu_fast.md's tolerance of the reference). `fusebox train --device cpu` takes the fast
  // ones, `cpu-ref` the reference.
  CpuKernels cpu_kernels = CpuKernels::reference;
  // bf16 / f16: the model's forward pass rewritten with PyTorch autocast's rules
  // (passes/mixed_precision.h) before the loss and the gradients are built; parameters,
  // optimizer state and batch-norm statistics stay f32. f16 also scales the loss
  // (loss_scaling). f32 / tf32 change no dtype (TF32 is the CUDA backend's math setting,
  // FUSEBOX_ALLOW_TF32*).
  Precision precision = Precision::f32;
  // Used with Precision::f16 only.
  LossScaling loss_scaling;
  // Constants (by name) that are not trained and stay constants.
  std::set<std::string> frozen;
  DataParallel data_parallel;
  // bf16 / f16: a parameter the forward pass reads only through its cast to the low dtype is
  // kept as a low copy too, which its optimizer update writes beside the f32 parameter, and its
  // gradient reaches the update in the low dtype (ops.h low_param): no cast of a weight or of a
  // gradient runs in a step. The same numbers bit for bit (the copy is the cast's rounding,
  // the update widens the gradient as the cast did); false: the casts run every step. Not with
  // data_parallel (its gradients are averaged in f32).
  bool low_parameter_copies = true;
  // The fusions of the whole step after autodiff (passes/pipeline.h training_step): a norm's
  // narrowing casts taken into it, the chains of elementwise ops (forward and backward) each
  // one generated kernel (passes/fuse_pointwise.h). The same numbers bit for bit, fewer
  // passes over memory and fewer values held. false, or FUSEBOX_FUSION=0: every op its own
  // node.
  bool step_fusion = true;
};

class TrainingSession {
 public:
  // Builds the step and eval graphs and takes the initial state from the model's
  // constants. Throws an Error naming the model, value or node at fault.
  TrainingSession(const Graph& model, const LossSpec& loss, const OptimizerSpec& optimizer,
                  const SessionOptions& opts = {});
  ~TrainingSession();
  TrainingSession(TrainingSession&&) noexcept;
  TrainingSession& operator=(TrainingSession&&) noexcept;

  // One optimizer step on a batch: the model's data inputs and the labels, by name.
  // Returns the loss (computed before the update, on the batch, batch_norm in training
  // form). On the CPU the state is replaced only when the whole step succeeded.
  float step(const NamedTensors& batch);
  // The same, queued: returns at once with the loss on its way (see "Asynchronous steps").
  PendingTensor step_async(const NamedTensors& batch);
  // ... with any part of the batch already on the device (fed by a device copy).
  PendingTensor step_async(const Feeds& batch);
  // Waits for every queued step; throws the Error of a step whose kernels found bad data.
  void synchronize();
  // Eval mode: runs the eval graph on the model's data inputs; returns the model's outputs.
  NamedTensors predict(const NamedTensors& batch) const;

  void set_lr(double lr);
  double lr() const;
  int64_t step_count() const;  // optimizer steps taken
  const OptimizerSpec& optimizer() const;

  // Inputs a batch must give: the model's data inputs, then the labels.
  const std::vector<std::string>& batch_inputs() const;
  // Trained parameters, in the model's constant order.
  const std::vector<std::string>& parameter_names() const;
  // Current values, as host copies taken after the steps queued so far (shared handles:
  // treat as read-only).
  const NamedTensors& parameters() const;
  const NamedTensors& buffers() const;          // batch-norm running statistics
  const NamedTensors& optimizer_state() const;  // see checkpoint.h for the names
  // f16's loss scaler: "loss_scale" (f32), "growth_tracker" and "skipped_steps" (i64);
  // empty for the other precisions.
  const NamedTensors& scaler_state() const;
  // f16: the steps skipped so far (a gradient held an infinity or a NaN: parameters and
  // optimizer state were left as they were; step_count() counts them too) and the loss
  // scale the next step uses. They live on the device with the rest of the state: each
  // call downloads one scalar after the steps queued so far (so it waits for them: never
  // call it per step). 0 and 1 for the other precisions.
  int64_t skipped_steps() const;
  double loss_scale() const;

  // The whole training state, for checkpoints (train/checkpoint.h).
  Checkpoint checkpoint() const;
  // Takes the state (and the lr) from `ckpt` after checking that it belongs to this model
  // and optimizer: the same optimizer kind and hyper-parameters (lr aside: a schedule
  // changes it), and every tensor present with this session's names, dtypes and shapes,
  // and no other. Errors name `where` (the file) and the tensor or hyper-parameter at
  // fault; on error the session is unchanged.
  void restore(const Checkpoint& ckpt, const std::string& where = "checkpoint");
  // save_checkpoint(path, checkpoint()) / restore(load_checkpoint(path), "checkpoint: path").
  void save(const std::string& path) const;
  void load(const std::string& path);

  const Graph& step_graph() const;
  // The compiled step (stats: memory plan, compile time).
  const Executable& step_executable() const;
  // The step compiled again with its state updates as outputs of their own (not applied in
  // place), on this session's current state, and run once on `batch` (lr and step count as
  // the next step_async would feed them; not counted as a step, the session unchanged): an
  // executable that Executable::profile accepts (`fusebox bench --mode train --report`).
  // Holds a second copy of the updated state while it lives.
  std::unique_ptr<Executable> profiled_step(const Feeds& batch) const;
  const Graph& eval_graph() const;
  // `model` (the graph this session was made from) with the session's current parameters and
  // buffers (running statistics) as its constants and every batch norm in inference form: the
  // trained model, as `fusebox train --export` writes it to ONNX. An Error naming the tensor
  // where `model` is not this session's (a parameter missing, or of another shape).
  Graph trained_model(const Graph& model) const;
  // (state name, step-graph output holding its next value), for every state tensor.
  const std::vector<std::pair<std::string, std::string>>& state_updates() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusebox
