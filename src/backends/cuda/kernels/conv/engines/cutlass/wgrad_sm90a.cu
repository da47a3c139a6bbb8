// The CUTLASS Hopper backward-filter convolutions: bf16 and f16 operands, f32 sums per batch
// chunk (plan.h), tiles 128x128 and 64x128; then the chunks' in-order sum into dw.
#include <vector>

#include "backends/cuda/kernels/conv/engines/cutlass/instance.cuh"
#include "backends/cuda/kernels/conv/split_sum.cuh"

namespace fusebox::cuda::cutlass_conv {

namespace {

template <class T, int TM, int TN>
std::optional<std::string> run(Context& ctx, const Plan& plan, const ConvGeometry& g,
                               const Operands& o, const BufferList& reads,
                               const BufferRange& written, const BufferRange& partial) {
  using I = Instance<cutlass::conv::Operator::kWgrad, T, float, TM, TN>;
  const int64_t dy_image = g.out_size() * g.out_channels;  // elements of one image
  const int64_t x_image = g.in_size() * g.in_channels;
  const int64_t count = g.out_channels * g.filter_size() * g.in_channels;  // dw's elements
  std::vector<typename I::Arguments> chunks;
  for (int64_t c = 0; c < plan.chunks; ++c) {
    const int64_t first = c * plan.chunk_images;
    ConvGeometry part = g;
    part.batch = std::min(plan.chunk_images, g.batch - first);
    chunks.push_back(I::arguments(part, static_cast<const T*>(o.y) + first * dy_image,
                                  static_cast<const T*>(o.x) + first * x_image, nullptr,
                                  o.partial + c * count, nullptr, Epilogue{}));
    if (auto why = I::refusal(chunks.back())) return why;
  }
  // Each chunk writes its own slice: the slices are independent nodes and run concurrently.
  for (size_t c = 0; c < chunks.size(); ++c) {
    const size_t bytes = size_t(count) * sizeof(float);
    I::record(ctx, chunks[c], reads,
              {BufferRange(partial.buffer, partial.offset + c * bytes, bytes)});
  }
  record_sum_splits<native_t<T>>(ctx, partial, o.partial, plan.chunks, count, written,
                                 static_cast<native_t<T>*>(o.result));
  return std::nullopt;
}

}  // namespace

std::optional<std::string> record_wgrad(Context& ctx, const Plan& plan, const ConvGeometry& g,
                                        const Operands& o, const BufferList& reads,
                                        const BufferRange& written, const BufferRange& partial) {
  return dispatch<Tile::t128x128, Tile::t64x128>(plan, [&]<class T, int TM, int TN>() {
    return run<T, TM, TN>(ctx, plan, g, o, reads, written, partial);
  });
}

}  // namespace fusebox::cuda::cutlass_conv
