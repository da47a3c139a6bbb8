// The statistics GEMM of stats_gemm.h. Its epilogue is a CUTLASS visitor tree (a
// chain: each reduction passes its input on):
//
//   y = float(round_bf16(acc))                 Sm90Compute<RoundThroughBf16, f32>(Sm90AccFetch)
//   sums[tile_m][n]    += y                    Sm90RowReduction<plus>        (over the tile's rows)
//   squares[tile_m][n] += y * y                Sm90RowReduction<square_and_plus>
//   D = bf16(y)                                (exact: y is already a bf16 value)
//
// "Row" reduction: the result is a row vector, one value per output channel. FinalReduction
// false: each tile writes its own partial row (the default, true, needs a workspace and zeroed
// counters that the recording does not provide; the atomic form is not deterministic).
// VisitCheckOOB false: a row past m or a column past n accumulates a zero (TMA fills the
// operands' missing rows with zeros, there is no source), which is both reductions' identity,
// so the per-element bounds test (1.5x the kernel's time) is not needed. y travels the tree in
// f32 because CUTLASS 4.2's unchecked reduction reads its input as ElementCompute (f32) arrays.

#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>

#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

#include "backends/cuda/kernels/conv/engines/cutlass/gemm_instance.cuh"
#include "backends/cuda/kernels/conv/engines/cutlass_bn/stats_gemm.h"

namespace fusebox::cuda::cutlass_bn {
namespace {

namespace fusion = cutlass::epilogue::fusion;
using cutlass_conv::PingpongGemm;
using T = cutlass::bfloat16_t;

// y rounded to bf16 as it is stored, kept in f32.
template <class V>
struct RoundThroughBf16 {
  CUTLASS_HOST_DEVICE V operator()(const V& v) const { return V(T(v)); }
};
template <int N, bool kRegisterSized>
struct RoundThroughBf16<cutlass::Array<float, N, kRegisterSized>> {
  using A = cutlass::Array<float, N, kRegisterSized>;
  CUTLASS_HOST_DEVICE A operator()(const A& a) const {
    const cutlass::Array<T, N> rounded =
        cutlass::NumericArrayConverter<T, float, N, cutlass::FloatRoundStyle::round_to_nearest>{}(
            a);
    return cutlass::NumericArrayConverter<float, T, N>{}(rounded);
  }
};

template <int TM, int TN>
struct StatsTree {
  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::_64>;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using Stored = fusion::Sm90EVT<fusion::Sm90Compute<RoundThroughBf16, float, float, kRound>,
                                 fusion::Sm90AccFetch>;
  template <template <class> class Reduce>
  using PerChannel =
      fusion::Sm90RowReduction<Reduce, cutlass::plus, cutlass::plus, 0, TileShape, float, float,
                               kRound, cute::Stride<cute::_0, cute::_1, cute::_0>, 4,
                               /*EnableNullptr=*/false, /*FinalReduction=*/false,
                               /*VisitCheckOOB=*/false>;
  using Tree = fusion::Sm90EVT<PerChannel<cutlass::square_and_plus>,
                               fusion::Sm90EVT<PerChannel<cutlass::plus>, Stored>>;
};

// x row-major [m][k] (A), w [n][k] read as B (k x n) column-major, y row-major; no source.
template <int TM, int TN>
struct StatsGemm : PingpongGemm<T, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor, void, T,
                                typename StatsTree<TM, TN>::Tree, TM, TN> {
  using Base = typename StatsGemm::PingpongGemm;
  using Kernel = typename Base::Kernel;
  using Arguments = typename Base::Arguments;

  static Arguments arguments(const StatsGemmCall& c, int sm_count, int device) {
    const int m = int(c.m), n = int(c.n), k = int(c.k);
    const auto stride_a = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, {m, k, 1});
    const auto stride_b = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, {n, k, 1});
    const auto stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, {m, n, 1});
    Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                   {m, n, k, 1},
                   {static_cast<const T*>(c.x), stride_a, static_cast<const T*>(c.w), stride_b},
                   {{}, nullptr, stride_d, static_cast<T*>(c.y), stride_d},
                   Base::hardware(sm_count, device)};
    // The tree's arguments, innermost node first at each level: {{{}, {}}, sums}, squares.
    args.epilogue.thread = {{{{}, {}}, {c.sums, 0.0f, {}}}, {c.squares, 0.0f, {}}};
    return args;
  }
};

}  // namespace

std::optional<std::string> record_stats_gemm(Context& ctx, const StatsGemmCall& call,
                                             const BufferList& reads, const BufferList& writes) {
  if (call.m <= 0 || call.n <= 0 || call.k <= 0 || call.m > INT32_MAX || call.n > INT32_MAX ||
      call.k > INT32_MAX)
    return cat("extents m ", call.m, ", n ", call.n, ", k ", call.k, " out of the kernel's range");
  if (call.sums == nullptr || call.squares == nullptr)
    return std::string("no buffers for the partial sums");
  if (call.n % 8 != 0 || call.k % 8 != 0)
    return std::string("channel counts not multiples of 8 (16-byte rows)");
  using G = StatsGemm<kStatsTileM, kStatsTileN>;
  return cutlass_conv::record_unless_refused<G>(
      ctx, G::arguments(call, ctx.device.properties().sm_count, ctx.device.id()), reads, writes);
}

}  // namespace fusebox::cuda::cutlass_bn
