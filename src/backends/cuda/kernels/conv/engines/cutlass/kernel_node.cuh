// What the CUTLASS convolution and GEMM instances share: CUTLASS's refusal of a problem, the
// recording of its kernel as one node, and the dispatch of a plan's dtype and tile to the
// compile-time instance.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cutlass/bfloat16.h>
#include <cutlass/device_kernel.h>
#include <cutlass/half.h>

#include <optional>
#include <string>
#include <type_traits>

#include "backends/cuda/kernels/conv/engines/cutlass/launch.h"
#include "backends/cuda/runtime/check.h"

namespace fusebox::cuda::cutlass_conv {

// The CUDA type of CUTLASS's element T (what the project's own kernels, sum_splits, take).
template <class T>
using native_t = std::conditional_t<std::is_same_v<T, cutlass::bfloat16_t>, __nv_bfloat16, __half>;

// Why the device-level adapter (ConvUniversalAdapter, GemmUniversalAdapter) refuses the
// arguments, or nullopt. A workspace is refused too: none of our kernels needs one.
template <class Adapter>
std::optional<std::string> cutlass_refusal(const typename Adapter::Arguments& args) {
  if (Adapter::can_implement(args) != cutlass::Status::kSuccess)
    return std::string("CUTLASS's can_implement refused the problem");
  if (Adapter::get_workspace_size(args) != 0)
    return std::string("the CUTLASS kernel asks for a workspace");
  return std::nullopt;
}

// Records the kernel as one node of the encoder's graph: CUTLASS's Params (TMA descriptors
// included) built here once, copied into the node (cutlass_refusal has accepted args).
template <class Kernel>
void record_kernel(Context& ctx, const typename Kernel::Arguments& args, const BufferList& reads,
                   const BufferList& writes) {
  auto* kernel = &cutlass::device_kernel<Kernel>;
  constexpr int smem = Kernel::SharedStorageSize;
  // Per device, so at every recording (cheap; recordings are rare): not once per process.
  FUSEBOX_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const typename Kernel::Params params = Kernel::to_underlying_arguments(args, nullptr);
  ctx.encoder.launch(kernel, Kernel::get_grid_shape(params), Kernel::get_block_shape(),
                     size_t(smem), reads, writes, params);
}

// Records `args` on instance I (Instance or GemmInstance), or says why CUTLASS refuses them
// (nothing recorded then).
template <class I>
std::optional<std::string> record_unless_refused(Context& ctx, const typename I::Arguments& args,
                                                 const BufferList& reads,
                                                 const BufferList& writes) {
  if (auto why = I::refusal(args)) return why;
  I::record(ctx, args, reads, writes);
  return std::nullopt;
}
template <class I>
std::optional<std::string> record_unless_refused(Context& ctx, const typename I::Arguments& args,
                                                 const BufferList& reads,
                                                 const BufferRange& written) {
  return record_unless_refused<I>(ctx, args, reads, BufferList{written});
}

// f.template operator()<T, TM, TN>() for the plan's dtype (bf16 or f16) and tile, one of
// `Tiles` (those the calling file instantiates).
template <Tile... Tiles, class F>
std::optional<std::string> dispatch(const Plan& plan, F&& f) {
  auto for_dtype = [&]<class T>() -> std::optional<std::string> {
    std::optional<std::string> out;
    bool ran = false;
    ((plan.tile == Tiles && !ran
          ? (out = f.template operator()<T, tile_m(Tiles), tile_n(Tiles)>(), ran = true)
          : false),
     ...);
    if (!ran)
      throw Error("CUTLASS convolution",
                  cat("tile ", tile_name(plan.tile), " is not compiled for ", plan.describe()));
    return out;
  };
  if (plan.dtype == DType::bf16) return for_dtype.template operator()<cutlass::bfloat16_t>();
  return for_dtype.template operator()<cutlass::half_t>();
}

}  // namespace fusebox::cuda::cutlass_conv
