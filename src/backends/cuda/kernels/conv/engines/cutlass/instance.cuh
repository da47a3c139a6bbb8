// One CUTLASS Hopper convolution kernel type per (op, element, output element, tile), and
// the recording of one problem on it. Included by fprop_sm90a.cu, dgrad_sm90a.cu and
// wgrad_sm90a.cu only: each instantiation costs ~30 s of nvcc, so every TU builds just its
// op's few.
//
// The kernel: CUTLASS's sm90 implicit-GEMM collective (KernelImplicitTmaWarpSpecializedSm90:
// one producer warp issuing TMA loads, im2col mode for the gathered operand, into a pipeline
// of 64-deep K stages (as many as shared memory holds after the epilogue's, or 4 for two
// CTAs an SM: Stages below); one consumer warpgroup on wgmma), f32 accumulation, and a TMA
// epilogue computing
//   D = clamp(acc + bias[n] + beta * C, lower, upper)        (plan.h Epilogue; beta 0 or 1)
// All problems use the 3-D (NDHWC) form: 1-D and 2-D convolutions have leading extents of 1,
// as ConvGeometry stores them, so one instantiation serves every rank.
#pragma once

// CUTLASS's headers assume this order: CuTe and the hardware info before the collectives.
#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/kernel_hardware_info.hpp>

#include <cutlass/conv/convolution.h>
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/conv/collective/collective_builder.hpp>
#include <cutlass/conv/convnd_problem_shape.hpp>
#include <cutlass/conv/device/conv_universal_adapter.hpp>
#include <cutlass/conv/dispatch_policy.hpp>
#include <cutlass/conv/kernel/conv_universal.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <optional>
#include <string>
#include <type_traits>

#include "backends/cuda/kernels/conv/engines/cutlass/kernel_node.cuh"

namespace fusebox::cuda::cutlass_conv {

template <cutlass::conv::Operator Op, class T, class TD, int TM, int TN, bool kPlain = false>
struct Instance {
  static constexpr bool kWgrad = Op == cutlass::conv::Operator::kWgrad;
  // D = acc: no source, bias or clamp to read or compute (wgrad's sums, or kPlain where the
  // plan's epilogue is plain()). It saves ~2.5 us a launch on an H200: the 64-channel 3x3
  // fprop 51.5 -> 48.8 us, a 1-tap dgrad phase 14.4 -> 11.9
  // (bench/results/2026-11-28_h200_session22_dense/).
  static constexpr bool kPlainEpilogue = kWgrad || kPlain;
  // K is a mode of its own (the reduction runs over taps and channels, or images and pixels);
  // so is wgrad's N, which covers (C, S, R, T).
  using TileN = std::conditional_t<kWgrad, cute::Shape<cute::Int<TN>>, cute::Int<TN>>;
  using TileShape = cute::Shape<cute::Int<TM>, TileN, cute::Shape<cute::_64>>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Layout = cutlass::layout::TensorNDHWC;
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<T>::value;  // 16-byte rows
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<TD>::value;
  // The output, through the TMA epilogue: activations NDHWC with the fused bias, residual and
  // clamp (or plain); wgrad's f32 filter sums KTRSC (CUTLASS's KCSRT tag: K rows of (C, S, R,
  // T), C fastest), no source (its chunks are summed afterwards).
  using LayoutD = std::conditional_t<kWgrad, cutlass::layout::TensorKCSRT, Layout>;
  using ElementC = std::conditional_t<kPlainEpilogue, void, TD>;
  using Fusion = std::conditional_t<
      kPlainEpilogue, cutlass::epilogue::fusion::LinearCombination<TD, float, void, float>,
      cutlass::epilogue::fusion::LinCombPerColBiasEltAct<cutlass::epilogue::thread::Clamp, TD,
                                                         float, TD, TD, float>>;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, LayoutD, kAlignD, TD,
      LayoutD, kAlignD, EpilogueSchedule, Fusion>::CollectiveOp;
  // The kernel is not persistent: a CTA's prologue and epilogue stall its SM unless another
  // CTA shares it. The narrow tile (104 registers) therefore takes 4 stages, 97 KiB of shared
  // memory, and two CTAs run on each SM: ResNet-50's 64-channel 3x3 fprop and dgrad 70 -> 52
  // us on an H200 (bench/results/2026-11-28_h200_session22_dense/). The wide tiles keep
  // the deepest pipeline: at 168 registers two CTAs would not fit (forced to 128, they spill
  // and run 2-6x slower).
  static constexpr bool kTwoPerSm = TN == 64 && !kWgrad;
  using Stages =
      std::conditional_t<kTwoPerSm, cutlass::conv::collective::StageCount<4>,
                         cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(
                             sizeof(typename Epilogue::SharedStorage))>>;
  using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Op, T, Layout, kAlign, T, Layout, kAlign,
      float, TileShape, Cluster, Stages,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
  using ProblemShape = cutlass::conv::ConvProblemShape<Op, 3>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, Mainloop, Epilogue>;
  using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;
  using Arguments = typename Conv::Arguments;

  // The epilogue's stride of the output (C and D): packed, from the problem's.
  template <class Stride>
  static Stride output_stride(const ProblemShape& shape) {
    if constexpr (kWgrad) {
      return cutlass::make_cute_packed_stride(Stride{}, shape.shape_C, shape.stride_C, Op);
    } else {
      // ((q, p, z, n), k, _0): the activation's [n, z, p, q, k] strides, reversed.
      Stride s{};
      cute::for_each(cute::make_seq<4>{},
                     [&](auto i) { cute::get<0, i>(s) = shape.stride_C[3 - i]; });
      return s;
    }
  }

  // The arguments for geometry g (its batch possibly a wgrad chunk's), A and B as the
  // op's GEMM reads them (plan.h's table), C the residual or null, D the result.
  // Element strides [n, d0, d1, d2, c] of the activation (x / dx) and of y / dy, where they
  // are not the packed ones (a strided dgrad's phase: dx's sub-lattice, dy's real extents).
  struct Strides {
    int64_t act[5];
    int64_t xformed[5];
  };

  static Arguments arguments(const ConvGeometry& g, const void* a, const void* b, const void* c,
                             void* d, const void* bias, const cutlass_conv::Epilogue& e,
                             const Strides* strides = nullptr) {
    auto i = [](int64_t v) { return int(v); };
    const typename ProblemShape::TensorExtent act{i(g.batch), i(g.in[0]), i(g.in[1]), i(g.in[2]),
                                                  i(g.in_channels)};
    const typename ProblemShape::TensorExtent flt{i(g.out_channels), i(g.filter[0]), i(g.filter[1]),
                                                  i(g.filter[2]), i(g.in_channels)};
    const typename ProblemShape::ShapePadding lower{i(g.pad_lo[0]), i(g.pad_lo[1]), i(g.pad_lo[2])};
    const typename ProblemShape::ShapePadding upper{i(g.pad_hi[0]), i(g.pad_hi[1]), i(g.pad_hi[2])};
    const typename ProblemShape::TraversalStride stride{i(g.stride[0]), i(g.stride[1]),
                                                        i(g.stride[2])};
    const typename ProblemShape::ShapeDilation dilation{i(g.dilation[0]), i(g.dilation[1]),
                                                        i(g.dilation[2])};
    const auto packed = [](const typename ProblemShape::TensorExtent& e5) {
      typename ProblemShape::TensorStride s5{};
      int64_t run = 1;
      for (int k = 4; k >= 0; --k) s5[k] = run, run *= e5[k];
      return s5;
    };
    typename ProblemShape::TensorStride act_stride = packed(act), xformed_stride{};
    if (strides != nullptr)
      for (int k = 0; k < 5; ++k)
        act_stride[k] = strides->act[k], xformed_stride[k] = strides->xformed[k];
    const ProblemShape shape =
        strides == nullptr
            ? ProblemShape(cutlass::conv::Mode::kCrossCorrelation, act, act_stride, flt,
                           packed(flt), lower, upper, stride, dilation, 1)
            : ProblemShape(cutlass::conv::Mode::kCrossCorrelation, act, act_stride, flt,
                           packed(flt), xformed_stride, lower, upper, stride, dilation, 1);
    const auto stride_c = output_stride<typename Kernel::StrideC>(shape);
    const auto stride_d = output_stride<typename Kernel::StrideD>(shape);
    Arguments args{shape,
                   {static_cast<const T*>(a), static_cast<const T*>(b)},
                   {{}, static_cast<const TD*>(c), stride_c, static_cast<TD*>(d), stride_d}};
    if constexpr (!kPlainEpilogue) {
      auto& fusion = args.epilogue.thread;
      fusion.alpha = 1.0f;
      fusion.beta = c != nullptr ? 1.0f : 0.0f;
      fusion.bias_ptr = e.bias ? static_cast<const TD*>(bias) : nullptr;
      fusion.activation.lower_bound = e.lower;
      fusion.activation.upper_bound = e.upper;
    }
    return args;
  }

  static std::optional<std::string> refusal(const Arguments& args) {
    return cutlass_refusal<Conv>(args);
  }
  static void record(Context& ctx, const Arguments& args, const BufferList& reads,
                     const BufferList& writes) {
    record_kernel<Kernel>(ctx, args, reads, writes);
  }
};

}  // namespace fusebox::cuda::cutlass_conv
