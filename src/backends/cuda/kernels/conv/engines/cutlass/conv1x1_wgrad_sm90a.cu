// The 1x1 backward-filter convolutions as one batched CUTLASS ping-pong GEMM over pixel chunks
// (gemm_instance.cuh, plan.h): bf16 and f16, tiles 128x128 and 64x128, f32 sums per chunk,
// then the chunks' in-order sum into dw; or, unsplit, one GEMM writing dw.
#include "backends/cuda/kernels/conv/engines/cutlass/gemm_instance.cuh"
#include "backends/cuda/kernels/conv/split_sum.cuh"

namespace fusebox::cuda::cutlass_conv {

std::optional<std::string> record_gemm_wgrad(Context& ctx, const Plan& plan, const ConvGeometry& g,
                                             const Operands& o, const BufferList& reads,
                                             const BufferRange& written,
                                             const BufferRange* partial) {
  const int64_t rows = g.batch * g.out_size();
  const int m = int(g.out_channels), n = int(g.in_channels);
  const int64_t full = rows / plan.chunk_rows, rest = rows - full * plan.chunk_rows;
  const int sm_count = ctx.device.properties().sm_count;
  const size_t slice = size_t(m) * size_t(n);  // elements of one chunk's sums
  return dispatch<Tile::t128x128, Tile::t64x128>(
      plan, [&]<class T, int TM, int TN>() -> std::optional<std::string> {
        if (plan.partial_bytes == 0) {
          using I = WgradGemmInstance<T, TM, TN, T>;
          const auto args =
              I::arguments(m, n, int(rows), 1, o.y, o.x, o.result, sm_count, ctx.device.id());
          return record_unless_refused<I>(ctx, args, reads, written);
        }
        using I = WgradGemmInstance<T, TM, TN>;
        // The whole chunks as the batch mode of one launch; the short last one on its own.
        std::vector<std::pair<typename I::Arguments, BufferRange>> launches;
        if (full > 0)
          launches.emplace_back(
              I::arguments(m, n, int(plan.chunk_rows), int(full), o.y, o.x, o.partial, sm_count,
                           ctx.device.id()),
              BufferRange(partial->buffer, partial->offset, size_t(full) * slice * sizeof(float)));
        if (rest > 0) {
          const int64_t first = full * plan.chunk_rows;
          launches.emplace_back(
              I::arguments(m, n, int(rest), 1, static_cast<const T*>(o.y) + first * m,
                           static_cast<const T*>(o.x) + first * n, o.partial + full * slice,
                           sm_count, ctx.device.id()),
              BufferRange(partial->buffer, partial->offset + size_t(full) * slice * sizeof(float),
                          slice * sizeof(float)));
        }
        for (const auto& [args, range] : launches)
          if (auto why = I::refusal(args)) return why;
        for (const auto& [args, range] : launches) I::record(ctx, args, reads, {range});
        record_sum_splits<native_t<T>>(ctx, *partial, o.partial, plan.chunks, int64_t(slice),
                                       written, static_cast<native_t<T>*>(o.result));
        return std::nullopt;
      });
}

}  // namespace fusebox::cuda::cutlass_conv
