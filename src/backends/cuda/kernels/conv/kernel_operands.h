// The operands of the project's tensor-core engines (implicit_gemm, cutlass, im2col,
// space_to_depth, halo_wgrad, patch_wgrad, phase_dgrad) in the layouts their kernels read:
// dense channels-last activations and KRSC filters (copies where the node's are not), a
// contiguous bias, and the result written in place when it is channels-last, else into a
// channels-last temporary that finish() copies into place.
#pragma once

#include <optional>
#include <vector>

#include "backends/cuda/kernels/conv/engine.h"

namespace fusebox::cuda {

class KernelOperands {
 public:
  // Records the copies the call's operands need (its epilogue's bias and residual included).
  KernelOperands(Context& ctx, const ConvCall& call);
  KernelOperands(const KernelOperands&) = delete;
  KernelOperands& operator=(const KernelOperands&) = delete;

  // Null where the op has none: fprop reads x, w; dgrad y (= dy), w; wgrad x, y (= dy).
  const DeviceTensor *x = nullptr, *w = nullptr, *y = nullptr;
  const DeviceTensor *bias = nullptr, *residual = nullptr;  // the call's epilogue's
  const DeviceTensor* written = nullptr;                    // where the kernels write
  bool aligned = false;  // x, w, y, written and residual 16-byte aligned

  // Copies a staged result into the call's output (nothing when written in place).
  void finish(Context& ctx);

 private:
  std::vector<DeviceTensor> keep_;
  std::optional<DeviceTensor> staged_;
  DeviceTensor* result_;
};

// What KernelOperands(ctx, call).aligned will be, before any copy: a copy is aligned, an
// operand read in place is as aligned as it is.
bool kernel_operands_aligned(const ConvCall& call);
// The same for the bias (CUTLASS's epilogue reads it in 16-byte vectors).
bool kernel_bias_aligned(const ConvCall& call);

// Why the implicit-GEMM family (every engine above) cannot take the call: mixed dtypes, or
// what igemm::cannot_implement names (dtypes, extents past 2^31, too many dgrad phases).
std::optional<std::string> implicit_gemm_family_refusal(const ConvCall& call);

}  // namespace fusebox::cuda
