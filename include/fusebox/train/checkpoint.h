// Training checkpoints: everything a training session needs to continue exactly where it
// stopped, in one .npz file (numpy can read it: np.load("ckpt.npz")).
//
// Arrays (keys of the .npz):
//   __meta__/format        i64 scalar, kCheckpointFormat
//   __meta__/step          i64 scalar, optimizer steps taken
//   __meta__/optimizer     i64 scalar, 1 = sgd, 2 = adamw
//   __meta__/<hyper>       f64 scalars: lr, momentum, dampening, weight_decay, nesterov (0/1)
//                          for sgd; lr, beta1, beta2, eps, weight_decay for adamw
//   param/<name>           each trained parameter (the model's constant names)
//   buffer/<name>          each batch-norm running statistic
//   optim/<param>/momentum_buffer                 sgd with momentum != 0
//   optim/<param>/exp_avg, optim/<param>/exp_avg_sq  adamw (PyTorch's names)
//   amp/loss_scale        f32 scalar   f16 training's loss scaler (session.h LossScaling):
//   amp/growth_tracker    i64 scalar     the scale, the steps since it last changed, and
//   amp/skipped_steps     i64 scalar     the steps skipped (non-finite gradients)
//
// Files are written atomically (temporary file, fsync, rename): a killed process leaves
// the old file or the new one, never a torn one, and perhaps its temporary file, which the
// next run writing there removes (prepare_checkpoint_path). The .npz members are
// CRC-checked, so a corrupt or truncated file is an Error, never silently wrong state.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fusebox/core/tensor.h"
#include "fusebox/train/optimizer.h"

namespace fusebox {

constexpr int64_t kCheckpointFormat = 1;

struct Checkpoint {
  int64_t step = 0;
  OptimizerSpec optimizer;
  std::map<std::string, Tensor> parameters;
  std::map<std::string, Tensor> buffers;
  std::map<std::string, Tensor> optimizer_state;  // "<param>/momentum_buffer", ...
  std::map<std::string, Tensor> scaler;           // "loss_scale", ... (f16 only)
};

std::string serialize_checkpoint(const Checkpoint& ckpt);
// Validates the layout: the format version, the metadata's presence, dtypes and shapes,
// and that every key is one of the above. Errors name `where` and the array at fault.
// (That the tensors fit a model, amp/ names included, is TrainingSession::restore's check.)
Checkpoint parse_checkpoint(const std::string& bytes, const std::string& where);

void save_checkpoint(const std::string& path, const Checkpoint& ckpt);  // atomic
Checkpoint load_checkpoint(const std::string& path);  // errors name "checkpoint: <path>"

// Before a run's first step, so that a run whose checkpoint cannot be written fails at once
// rather than after its training: that `path` can be written (io: check_writable: the folder
// exists and takes a file), then the temporary files of killed writers of `path` removed
// (io: remove_stale_temporaries; a running process's stay). Returns the paths removed.
// Errors name "checkpoint: <path>".
std::vector<std::string> prepare_checkpoint_path(const std::string& path);

}  // namespace fusebox
