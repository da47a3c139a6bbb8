// The convolution problem of the CUDA backend: one rank-agnostic description of the three
// convolution ops (CUTLASS style), what the cuDNN path is built from and cached by.
//
//   ConvSettings s = conv_settings();                     // FUSEBOX_CONV_BACKEND, ...
//   ConvProblem p = make_conv_problem(node, {&x, &w, bias}, y, s, device);
//   if (auto why = cudnn_cannot_implement(p)) ... run the direct kernel, log *why
//   std::string key = conv_problem_key(p);                // the full plan-cache key
//
// Tensors as cuDNN sees them: logical NCHW (NCDHW) dims with the tensor's real strides in
// elements, so a channels-last tensor is [N, C, H, W] with strides [HWC, 1, WC, C]. 1-D
// problems are lowered to 2-D ones with a leading spatial extent of 1 (filter 1, stride 1,
// dilation 1, pad 0; the inserted dim's stride keeps the layout's pattern), so every
// problem has 2 or 3 spatial dims.
//
// Roles: x/w/y are always the forward's input, filter and output, whatever the op:
//   fprop: reads x, w (and bias [K]), writes y.
//   dgrad: reads y (= dy) and w (and bias [C]), writes x (= dx). Transposed convolution is
//          this op (its D, with output padding folded in, is given by the node).
//   wgrad: reads x and y (= dy), writes w (= dw).
//
// No CUDA or cuDNN types here: the key and the refusal reasons are tested without a GPU.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/kernels/conv/report.h"
#include "backends/cuda/runtime/tensor.h"
#include "fusebox/ir/graph.h"

namespace fusebox::cuda {

// runtime/settings.h; declared only, so that the kernels including this header (the sm_90a
// ones among them) do not depend on the settings' definition.
struct ConvSettings;

enum class ConvOp : uint8_t { fprop, dgrad, wgrad };
const char* conv_op_name(ConvOp op);  // "conv_fprop", "conv_dgrad", "conv_wgrad"

// The settings a convolution runs under: the process's (settings().conv, runtime/settings.h)
// with `fusebox run --autotune` (set_conv_autotune_override) applied.
ConvSettings conv_settings();

// One tensor of the problem.
struct ConvTensor {
  DType dtype = DType::f32;
  std::vector<int64_t> dims;     // logical N C [D] H W (rank 4 or 5 after lowering)
  std::vector<int64_t> strides;  // in elements
  uint32_t alignment = 0;        // largest power of two (<= 256) dividing the address
  bool present = false;          // false: an absent optional bias
};

// How the node's convolution is described to cuDNN: as it is (standard), or (fprop of a
// 1x1 filter with zero padding and stride > 1) as a stride-1 1x1 over a strided view of x
// that picks the pixels the filter visits: dims [N, C, O...], strides [x.N, x.C,
// s * x.S...], no copy. Same result, different kernels.
enum class ConvLowering : uint8_t { standard, subsampled_1x1 };
const char* conv_lowering_name(ConvLowering l);  // "standard", "subsampled_1x1"

// How much of a node's epilogue a cuDNN graph computes: none (the convolution alone), its
// bias, or the whole epilogue (bias, activation, residual add, residual activation: ir/ops.h
// ConvAttrs). Plans are built for the most the problem has, then less when cuDNN refuses;
// kernels/conv/conv.cpp runs the rest (conv_epilogue).
enum class ConvFusion : uint8_t { none, bias, epilogue };
const char* conv_fusion_name(ConvFusion f);  // "none", "bias", "epilogue"

struct ConvProblem {
  ConvOp op = ConvOp::fprop;
  ConvLowering lowering = ConvLowering::standard;
  int spatial_rank = 2;  // of the node (1..3); the tensors have max(2, rank) spatial dims
  ConvTensor x, w, y;    // forward roles (see above)
  ConvTensor bias;       // [K] for fprop, [C] for dgrad; absent for wgrad
  // fprop's epilogue: y = residual_activation(activation(conv + bias) + residual).
  FusedActivation activation, residual_activation;
  ConvTensor residual;         // y's dims (absent: no residual add)
  bool refuse_fusion = false;  // ConvSettings::refuse_fusion (in the key when set)
  std::vector<int64_t> pad_lo, pad_hi, stride, dilation;  // per (lowered) spatial dim
  int64_t groups = 1;
  int device = 0;
  bool allow_tf32 = true;
  bool deterministic = false;
  int64_t forced_plan_index = -1;  // ConvSettings::forced_plan_index (in the key when set)
  // ConvSettings::allow_barred_engines (through barred_engines(), which is in the key).
  bool allow_barred_engines = false;
  std::string label;  // the node's label, for messages (not part of the key)

  int lowered_spatial_rank() const { return int(x.dims.size()) - 2; }
  bool has_epilogue() const { return bool(activation) || residual.present; }
  // The fused graphs to try, most first: epilogue (when there is one and no
  // epilogue_refusal), bias (when present), none; FUSEBOX_CUDNN_FUSION=refuse leaves only none.
  std::vector<ConvFusion> fusions() const;
  // Why the epilogue is never asked of cuDNN (FUSEBOX_CUDNN_FUSION=refuse, or an activation
  // cuDNN runs only on a reference engine), or nullopt.
  std::optional<std::string> epilogue_refusal() const;
  // Multiply-adds of the convolution (the same for all three ops): N*K*O*(C/g)*R.
  double flops() const;
  // "conv_fprop bf16 x[64,64,56,56]/nhwc w[64,64,3,3] y[64,64,56,56] pad 1,1/1,1 s 1,1
  //  d 1,1 g 1": for logs and the report.
  std::string describe() const;
};

// Builds the problem for a conv / conv_backward_data / conv_backward_filter node from its
// tensors (in the node's input order, bias nullptr when absent) and its output. Checks
// the shapes against each other and the attributes (the backends' shared
// make_conv_geometry, backends/common/conv_geometry.h) and the bias (Error naming the node).
ConvProblem make_conv_problem(const Node& n, const std::vector<const DeviceTensor*>& inputs,
                              const DeviceTensor& output, const ConvSettings& settings, int device);

// The high pad used for a spatial dim: the low pad when it gives the same output extent
// (symmetric padding reaches more cuDNN engines; taps past D read zero either way), else
// the node's own high pad.
int64_t effective_pad_hi(int64_t in, int64_t out, int64_t filter, int64_t stride, int64_t dilation,
                         int64_t pad_lo, int64_t pad_hi);

// The problem with the subsampled-1x1 lowering (see ConvLowering), or nullopt when it does
// not apply: fprop, groups 1, every filter extent 1, every pad 0, some stride > 1.
std::optional<ConvProblem> subsampled_1x1(const ConvProblem& p);

// The plan-cache key: every field that can change the plan, each named (no struct bytes).
// The lowering is a field only when it is not the standard one, so the keys (and the disk
// cache files) of standard problems are those of the releases before it existed.
std::string conv_problem_key(const ConvProblem& p);
// The same, human readable (for warnings and tests).
std::string conv_problem_key_text(const ConvProblem& p);

// Why cuDNN is not tried for this problem (nullopt: it may be): f64 or integer dtypes,
// mixed dtypes, a stride-0 or negative-stride tensor, more than 3 spatial dims, an
// element pointer not aligned to its size. CUTLASS's can_implement.
std::optional<std::string> cudnn_cannot_implement(const ConvProblem& p);

// cuDNN engines never used for this problem (exact engine names, e.g. "eng20"; empty
// unless some are known to be wrong for it, or allow_barred_engines). Part of the key, so
// a plan cached before a bar was added is not reused. Known (H100, cuDNN 9.19,
// test_conv_probe.cpp): grouped 3-D wgrad in f16/bf16, engines eng1 and eng20 give a wrong
// dw (rel. error ~1 or overflow) with asymmetric and strided problems; eng0 and the others
// tried are right. Grouped f16/bf16 dgrad with asymmetric pads: eng6 left dx elements
// unwritten (NaN poison survived; depthwise 1-D f16, pads 3/2, test_depthwise.cpp, H100
// 2026-11-25).
std::vector<std::string> barred_engines(const ConvProblem& p);

// The largest power of two, at most 256, dividing `address` (256 for nullptr).
uint32_t pointer_alignment(const void* address);

}  // namespace fusebox::cuda
