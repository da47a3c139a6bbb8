// The 1x1 convolutions (stride 1, no padding) are plain GEMMs over the channels-last
// tensors, and a plain GEMM on Hopper is fastest persistent: CUTLASS's ping-pong kernel
// (KernelTmaWarpSpecializedPingpong) keeps one CTA per SM walking tiles, its two consumer
// warpgroups alternating so one's epilogue overlaps the other's main loop. The implicit-GEMM
// conv kernel (instance.cuh) is not persistent (CUTLASS 4.2 has no persistent conv schedule
// on sm90): its epilogue stalls the SM, which costs most on the short-K 1x1 layers.
//
//   op     A (M x K)                      B (K x N)                      D (M x N)
//   fprop  x  [NDHW][C]                   w  [K][C]  (K-major: ColumnMajor) y  [NDHW][K]
//   dgrad  dy [NDHW][K]                   w  [K][C]  (N-major: RowMajor)    dx [NDHW][C]
//   wgrad  dy [NDHW][K] (M-major: Column) x  [NDHW][C] (N-major: RowMajor)  dw [K][C] f32 or T
// wgrad reduces over the pixels: its chunks (plan.h) are the batch mode L of one GEMM, each
// chunk's rows consecutive in dy and x (packed batch strides) and its sums one f32 slice;
// unsplit (plan.partial_bytes 0), dw itself in T.
//
// Included by the conv1x1_*_sm90a.cu files only.
#pragma once

// CUTLASS's headers assume this order: CuTe and the hardware info before the collectives.
#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/kernel_hardware_info.hpp>

#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <optional>
#include <string>
#include <type_traits>

#include "backends/cuda/kernels/conv/engines/cutlass/kernel_node.cuh"

namespace fusebox::cuda::cutlass_conv {

// The ping-pong GEMM kernel type: T operands in layouts LayoutA / LayoutB, f32 accumulation,
// D of TD (row-major) through a TMA epilogue computing Fusion (ElementC: its source, or void).
template <class T, class LayoutA, class LayoutB, class ElementC, class TD, class Fusion, int TM,
          int TN>
struct PingpongGemm {
  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Row = cutlass::layout::RowMajor;
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<T>::value;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<TD>::value;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, Row, kAlignD, TD,
      Row, kAlignD, cutlass::epilogue::TmaWarpSpecialized, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, LayoutA, kAlign, T, LayoutB, kAlign,
      float, TileShape, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedPingpong>::CollectiveOp;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using Arguments = typename Gemm::Arguments;

  static cutlass::KernelHardwareInfo hardware(int sm_count, int device) {
    cutlass::KernelHardwareInfo hw;
    hw.device_id = device;
    hw.sm_count = sm_count;
    return hw;
  }
  static std::optional<std::string> refusal(const Arguments& args) {
    return cutlass_refusal<Gemm>(args);
  }
  static void record(Context& ctx, const Arguments& args, const BufferList& reads,
                     const BufferList& writes) {
    record_kernel<Kernel>(ctx, args, reads, writes);
  }
};

// fprop and dgrad: D = clamp(A B + bias + residual) in T; or, kPlain, D = A B. The plain
// epilogue reads no source and keeps no bias or clamp: on ResNet-50's short-K 1x1 layers,
// streaming D, it is 15-25% faster (H200: the 28x28 128 -> 512 fprop 32.0 -> 23.1 us,
// bench/results/2026-11-28_h200_session22_dense/).
template <class T, class LayoutB, int TM, int TN, bool kPlain = false>
struct GemmInstance
    : PingpongGemm<T, cutlass::layout::RowMajor, LayoutB, std::conditional_t<kPlain, void, T>, T,
                   std::conditional_t<
                       kPlain, cutlass::epilogue::fusion::LinearCombination<T, float, void, float>,
                       cutlass::epilogue::fusion::LinCombPerColBiasEltAct<
                           cutlass::epilogue::thread::Clamp, T, float, T, T, float>>,
                   TM, TN> {
  using Base = typename GemmInstance::PingpongGemm;
  using Kernel = typename Base::Kernel;
  using Arguments = typename Base::Arguments;

  // D[m][n] = clamp(sum_k A[m][k] B[k][n] + bias[n] + C[m][n], e.lower, e.upper); C may be null.
  static Arguments arguments(int m, int n, int k, const void* a, const void* b, const void* c,
                             void* d, const void* bias, const cutlass_conv::Epilogue& e,
                             int sm_count, int device) {
    using namespace cute;
    const auto stride_a = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, {m, k, 1});
    const auto stride_b = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, {n, k, 1});
    const auto stride_c = cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, {m, n, 1});
    const auto stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, {m, n, 1});
    Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                   {m, n, k, 1},
                   {static_cast<const T*>(a), stride_a, static_cast<const T*>(b), stride_b},
                   {{}, static_cast<const T*>(c), stride_c, static_cast<T*>(d), stride_d},
                   Base::hardware(sm_count, device)};
    auto& fusion = args.epilogue.thread;
    fusion.alpha = 1.0f;
    fusion.beta = c != nullptr ? 1.0f : 0.0f;
    if constexpr (!kPlain) {
      fusion.bias_ptr = e.bias ? static_cast<const T*>(bias) : nullptr;
      fusion.activation.lower_bound = e.lower;
      fusion.activation.upper_bound = e.upper;
    }
    return args;
  }
};

// wgrad: `batches` chunks of `rows` pixels, D[l] = A[l] B[l] in TD (no source): f32 slices
// of chunks, or dw in T when unsplit.
template <class T, int TM, int TN, class TD = float>
struct WgradGemmInstance
    : PingpongGemm<T, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, void, TD,
                   cutlass::epilogue::fusion::LinearCombination<TD, float, void, float>, TM, TN> {
  using Base = typename WgradGemmInstance::PingpongGemm;
  using Kernel = typename Base::Kernel;
  using Arguments = typename Base::Arguments;

  static Arguments arguments(int m, int n, int rows, int batches, const void* dy, const void* x,
                             void* d, int sm_count, int device) {
    const auto stride_a =
        cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, {m, rows, batches});
    const auto stride_b =
        cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, {n, rows, batches});
    const auto stride_d =
        cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, {m, n, batches});
    return Arguments{cutlass::gemm::GemmUniversalMode::kGemm,
                     {m, n, rows, batches},
                     {static_cast<const T*>(dy), stride_a, static_cast<const T*>(x), stride_b},
                     {{}, static_cast<const TD*>(nullptr), stride_d, static_cast<TD*>(d), stride_d},
                     Base::hardware(sm_count, device)};
  }
};

// Records the 1x1 op (`a` its A operand: x for fprop, dy for dgrad) on the plan's dtype and
// tile.
template <class LayoutB>
std::optional<std::string> record_gemm(Context& ctx, const Plan& plan, const ConvGeometry& g,
                                       const void* a, const Operands& o, const BufferList& reads,
                                       const BufferRange& written) {
  const bool fprop = plan.op == ConvOp::fprop;
  const int m = int(g.batch * (fprop ? g.out_size() : g.in_size()));
  const int n = int(fprop ? g.out_channels : g.in_channels);
  const int k = int(fprop ? g.in_channels : g.out_channels);
  const void* c = plan.epilogue.residual ? o.residual : nullptr;
  const int sm_count = ctx.device.properties().sm_count;
  return dispatch<Tile::t128x128, Tile::t128x64>(
      plan, [&]<class T, int TM, int TN>() -> std::optional<std::string> {
        auto run = [&]<bool kPlain>() {
          using I = GemmInstance<T, LayoutB, TM, TN, kPlain>;
          const auto args = I::arguments(m, n, k, a, o.w, c, o.result, o.bias, plan.epilogue,
                                         sm_count, ctx.device.id());
          return record_unless_refused<I>(ctx, args, reads, written);
        };
        if (plan.epilogue.plain()) return run.template operator()<true>();
        return run.template operator()<false>();
      });
}

}  // namespace fusebox::cuda::cutlass_conv
