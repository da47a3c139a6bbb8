// CUDA C for fused_pointwise (ir/ops.h): one kernel per (program, dtypes, access pattern,
// vector width), compiled at run time by NVRTC (runtime/nvrtc.h). The source is a pure
// function of a FusedKernelSpec; sizes, strides and pointers are run-time parameters
// (FusedParams), so one compiled kernel serves every shape with the same pattern.
//
// The kernel is a grid-stride loop. With a vector width W > 1, each step takes W output
// elements: contiguous inputs and the output by 16-byte loads and stores, a `row` input
// by 16-byte loads at its broadcast offset, a `uniform` input (a per-channel or scalar
// broadcast) by one load per step, and the instructions whose operands are all uniform run
// once per step. The n % W last elements, and every element when W == 1 (the general
// path: any strides, broadcasts, misaligned bases), go through per-element index math: the
// coordinates of flat index i along the walk's dims (fast 32-bit division when the element
// count allows), only the dims an input moves along, dotted with its strides.
//
// Arithmetic is the unfused kernels': each instruction's formula as kernels/pointwise/
// unary.cu and binary.cu write it, in f32 (f64 for f64), each result rounded to its dtype
// (bf16 and f16 pairwise, one cvt per two values; skipped where it is exact: relu, neg,
// abs, max, min, clip to bounds of that dtype, and the last instruction, which the store
// rounds). add/sub/mul/div use the _rn intrinsics, which are never contracted into an FMA
// with a neighbouring instruction: the unfused kernels round every op's result, and so does
// a fused chain of f32 instructions. Within a formula (gelu, silu, ...) nvcc and NVRTC
// contract alike (--fmad=true for both).
//
// Host C++ only (no CUDA headers): the generator is tested without a GPU.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "fusebox/ir/pointwise_program.h"

namespace fusebox::cuda {

inline constexpr int kFusedMaxDims = 8;  // as device/strided_layout.cuh's kMaxDims
inline constexpr const char* kFusedKernelName = "fusebox_fused_pointwise";

// 32-bit division by a run-time constant d >= 1 as a multiply-high and a shift (exact for
// dividends below 2^31): q = d == 1 ? n : umulhi(n, mul) >> shift.
struct FastDivisor {
  uint32_t mul = 0;
  uint32_t shift = 0;
};
FastDivisor fast_divisor(uint32_t d);
uint32_t fast_divide(uint32_t n, uint32_t d, const FastDivisor& f);  // the device's arithmetic

// The kernel's only parameter, laid out the same here and in the generated source (every
// member 8-byte aligned, no padding). Dims are the walk's (the output's shape with extent-1
// dims dropped and neighbours merged where every operand allows), innermost first.
struct FusedParams {
  const void* in[kMaxPointwiseInputs];
  void* out;
  int64_t n;  // output elements
  int64_t extent[kFusedMaxDims];
  int64_t stride[kMaxPointwiseInputs][kFusedMaxDims];  // elements; 0 where it broadcasts
  uint32_t div_mul[kFusedMaxDims];                     // FastDivisor of each extent
  uint32_t div_shift[kFusedMaxDims];
};
static_assert(sizeof(FusedParams) == 1296, "the generated FbParams declares 1296 bytes");

// How the kernel reads an input.
enum class FusedAccess : uint8_t {
  contiguous,  // as the output: element i (W-wide vectors at i in the vectorised loop)
  uniform,     // vectorised loop: one element per step, at the input's offset of the step
  row,         // vectorised loop: W contiguous elements at the input's offset of the step
  strided,     // its offset per element (the general path)
};
const char* fused_access_name(FusedAccess a);

struct FusedKernelSpec {
  PointwiseProgram program;
  std::vector<DType> values;        // every value's dtype: inputs, then instructions
  int vector_width = 1;             // W; 1: the general path only
  std::vector<FusedAccess> access;  // per input
  int rank = 1;                     // dims of the walk
  std::vector<uint32_t> moves;      // per input: bit d set when its stride along dim d != 0
  bool index32 = true;              // flat indices below 2^31: 32-bit index math
  int unroll = 4;                   // vectorised steps per loop iteration (1, 2 or 4)
};

// The kernel's CUDA C source (kernel kFusedKernelName, parameter FbParams), headed by a
// comment naming the program and the pattern.
std::string fused_kernel_source(const FusedKernelSpec& spec);
// What every such source starts with after its header comment: FbParams, the math and
// the ops' formulas, the element types, vector loads and stores (fused_preamble.cpp).
const char* fused_kernel_preamble();

// The vectorised loop's shape, process-wide (the bench sets both to compare 1, 2 and 4):
//   vectors per step: 16-byte vectors (of the narrowest dtype) per thread step, where the
//     inputs allow it (else fewer); a step's fixed work (per-channel offsets and loads) is
//     shared by its elements, but a thread's vectors sit side by side, so each load
//     instruction of a warp strides over 16 * vectors bytes (uncoalesced beyond 1);
//   steps per iteration: the grid-stride loop unrolled, that many steps' loads in flight
//     per thread, each load instruction coalesced.
// Defaults 1 and 4: on an H100 the 8-op bf16 chain of bench_fused_pointwise ran at 92% of
// the copy bandwidth so, against 87% at 2 and 2 (bench/results/2026-11-24_h100_issue13/).
int fused_vectors_per_step();
void set_fused_vectors_per_step(int vectors);
int fused_steps_per_iteration();
void set_fused_steps_per_iteration(int steps);

}  // namespace fusebox::cuda
