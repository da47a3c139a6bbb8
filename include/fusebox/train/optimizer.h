// Optimizer choices for training sessions (train/session.h) and checkpoints.
#pragma once

#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace fusebox {

// PyTorch torch.optim.SGD semantics (ops.h sgd_update). The first step with momentum
// sets the buffer to the gradient (no dampening), as PyTorch does.
struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};
// PyTorch torch.optim.AdamW semantics (ops.h adamw_update).
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};
using OptimizerSpec = std::variant<SgdOptions, AdamWOptions>;

const char* optimizer_name(const OptimizerSpec& spec);  // "sgd" / "adamw"
double optimizer_lr(const OptimizerSpec& spec);
OptimizerSpec with_lr(OptimizerSpec spec, double lr);
// The hyper-parameters by name ("lr" first; nesterov as 0 / 1), as checkpoints store
// them and as error messages name them.
std::vector<std::pair<std::string, double>> optimizer_hyper_parameters(const OptimizerSpec& spec);
// Throws an Error (naming `where` and the hyper-parameter) for a value that is not
// finite, lr < 0, momentum < 0, dampening outside [0, 1], betas outside [0, 1), eps <= 0,
// weight decay < 0, or nesterov without momentum or with dampening (as PyTorch).
void check_optimizer(const OptimizerSpec& spec, const std::string& where);

}  // namespace fusebox
