// Recording a planned CUTLASS Hopper convolution (plan.h) on the encoder. The kernels are
// compiled in fprop_sm90a.cu, dgrad_sm90a.cu and wgrad_sm90a.cu (instance.cuh builds them),
// and the 1x1 GEMMs in the conv1x1_*_sm90a.cu files (gemm_instance.cuh),
// each launched as a plain kernel node of the recording: the CUTLASS kernel's parameters
// (its TMA descriptors included) are built once here and copied into the node.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "backends/common/conv_geometry.h"
#include "backends/cuda/kernels/conv/engines/cutlass/plan.h"
#include "backends/cuda/runtime/context.h"

namespace fusebox::cuda::cutlass_conv {

// Dense channels-last operands: x [N, D0, D1, D2, C], w [K, R0, R1, R2, C], y [N, O.., K]
// (roles of the forward; the op reads two and writes `result`), bias [K] (fprop) or [C]
// (dgrad) or null, residual y's shape or null.
struct Operands {
  const void* x = nullptr;
  const void* w = nullptr;
  const void* y = nullptr;
  void* result = nullptr;
  const void* bias = nullptr;
  const void* residual = nullptr;
  float* partial = nullptr;  // wgrad: plan.partial_bytes of f32 sums
  // Strided dgrad: each phase's sub-filter [K][T0][T1][T2][C] (plan.phases; null where the
  // phase is empty).
  std::vector<const void*> phase_filters;
};

// Records the convolution, or says why CUTLASS's own can_implement refused it (nothing is
// recorded then; plan.cpp's cannot_implement is meant to have caught it). `reads`: the
// buffers read; `written`: result's bytes; `partial`: the wgrad sums' bytes (null where the
// plan has none).
std::optional<std::string> record(Context& ctx, const Plan& plan, const ConvGeometry& g,
                                  const Operands& o, const BufferList& reads,
                                  const BufferRange& written, const BufferRange* partial);

// The per-op entries record() dispatches to.
std::optional<std::string> record_fprop(Context& ctx, const Plan& plan, const ConvGeometry& g,
                                        const Operands& o, const BufferList& reads,
                                        const BufferRange& written);
std::optional<std::string> record_dgrad(Context& ctx, const Plan& plan, const ConvGeometry& g,
                                        const Operands& o, const BufferList& reads,
                                        const BufferRange& written);
std::optional<std::string> record_gemm_fprop(Context& ctx, const Plan& plan, const ConvGeometry& g,
                                             const Operands& o, const BufferList& reads,
                                             const BufferRange& written);
std::optional<std::string> record_gemm_dgrad(Context& ctx, const Plan& plan, const ConvGeometry& g,
                                             const Operands& o, const BufferList& reads,
                                             const BufferRange& written);
std::optional<std::string> record_wgrad(Context& ctx, const Plan& plan, const ConvGeometry& g,
                                        const Operands& o, const BufferList& reads,
                                        const BufferRange& written, const BufferRange& partial);
// `partial`: null when the plan is unsplit (partial_bytes 0).
std::optional<std::string> record_gemm_wgrad(Context& ctx, const Plan& plan, const ConvGeometry& g,
                                             const Operands& o, const BufferList& reads,
                                             const BufferRange& written,
                                             const BufferRange* partial);

}  // namespace fusebox::cuda::cutlass_conv
