// The convolution problem of the CUDA backend: one rank-agnostic description of the three
// convolution ops (CUTLASS style), what the cuDNN path is built from and cached by.
//
//   ConvSettings s = ConvSettings::from_env();            // FUSEBOX_CONV_BACKEND, ...
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

#include "backends/cuda/conv_report.h"
#include "backends/cuda/tensor.h"
#include "fusebox/ir/graph.h"

namespace fusebox::cuda {

enum class ConvOp : uint8_t { fprop, dgrad, wgrad };
const char* conv_op_name(ConvOp op);  // "conv_fprop", "conv_dgrad", "conv_wgrad"

// Which implementation runs: FUSEBOX_CONV_BACKEND=auto (cuDNN, falling back to the direct
// kernel), cudnn (cuDNN or an error), own (the direct kernel).
enum class ConvBackend : uint8_t { automatic, cudnn, own };
const char* conv_backend_name(ConvBackend b);  // "auto", "cudnn", "own"

// Settings read from the environment at each convolution (cheap; tests change them).
// A malformed value is an Error naming the variable and the values it takes.
struct ConvSettings {
  ConvBackend backend = ConvBackend::automatic;  // FUSEBOX_CONV_BACKEND
  bool allow_tf32 = true;                        // FUSEBOX_ALLOW_TF32 (f32 convolutions)
  bool deterministic = false;                    // FUSEBOX_DETERMINISTIC
  bool autotune = false;                         // FUSEBOX_AUTOTUNE, or --autotune
  size_t plan_cache_capacity = 256;              // FUSEBOX_CONV_PLAN_CACHE (0: unbounded)
  bool native_graph = true;  // FUSEBOX_CUDNN_NATIVE_GRAPH: 0 records every plan by capture

  static ConvSettings from_env();
};
ConvBackend parse_conv_backend(std::string_view text);  // throws on anything else

// One tensor of the problem.
struct ConvTensor {
  DType dtype = DType::f32;
  std::vector<int64_t> dims;     // logical N C [D] H W (rank 4 or 5 after lowering)
  std::vector<int64_t> strides;  // in elements
  uint32_t alignment = 0;        // largest power of two (<= 256) dividing the address
  bool present = false;          // false: an absent optional bias
};

struct ConvProblem {
  ConvOp op = ConvOp::fprop;
  int spatial_rank = 2;  // of the node (1..3); the tensors have max(2, rank) spatial dims
  ConvTensor x, w, y;    // forward roles (see above)
  ConvTensor bias;       // [K] for fprop, [C] for dgrad; absent for wgrad
  std::vector<int64_t> pad_lo, pad_hi, stride, dilation;  // per (lowered) spatial dim
  int64_t groups = 1;
  int device = 0;
  bool allow_tf32 = true;
  bool deterministic = false;
  std::string label;  // the node's label, for messages (not part of the key)

  int lowered_spatial_rank() const { return int(x.dims.size()) - 2; }
  // Multiply-adds of the convolution (the same for all three ops): N*K*O*(C/g)*R.
  double flops() const;
  // "conv_fprop bf16 x[64,64,56,56]/nhwc w[64,64,3,3] y[64,64,56,56] pad 1,1/1,1 s 1,1
  //  d 1,1 g 1": for logs and the report.
  std::string describe() const;
};

// Builds the problem for a conv / conv_backward_data / conv_backward_filter node from its
// tensors (in the node's input order, bias nullptr when absent) and its output. Checks
// the shapes against each other and the attributes (Error naming the node).
ConvProblem make_conv_problem(const Node& n, const std::vector<const DeviceTensor*>& inputs,
                              const DeviceTensor& output, const ConvSettings& settings, int device);

// The high pad used for a spatial dim: the low pad when it gives the same output extent
// (symmetric padding reaches more cuDNN engines; taps past D read zero either way), else
// the node's own high pad.
int64_t effective_pad_hi(int64_t in, int64_t out, int64_t filter, int64_t stride, int64_t dilation,
                         int64_t pad_lo, int64_t pad_hi);

// The plan-cache key: every field that can change the plan, each named (no struct bytes).
std::string conv_problem_key(const ConvProblem& p);
// The same, human readable (for warnings and tests).
std::string conv_problem_key_text(const ConvProblem& p);

// Why cuDNN is not tried for this problem (nullopt: it may be): f64 or integer dtypes,
// mixed dtypes, a stride-0 or negative-stride tensor, more than 3 spatial dims, tensors
// whose element offsets do not fit cuDNN's int64 arithmetic. CUTLASS's can_implement.
std::optional<std::string> cudnn_cannot_implement(const ConvProblem& p);

// The largest power of two, at most 256, dividing `address` (256 for nullptr).
uint32_t pointer_alignment(const void* address);

}  // namespace fusebox::cuda
