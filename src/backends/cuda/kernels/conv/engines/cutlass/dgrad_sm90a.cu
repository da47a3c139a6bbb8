// The CUTLASS Hopper backward-data convolutions: bf16 and f16, tiles 128x128 and 128x64, a
// plain epilogue or the fused one (instance.cuh); unit-stride problems in one launch, strided
// ones as one launch per stride phase (plan.h DgradPhase) writing dx's sub-lattice.
#include "backends/cuda/kernels/conv/engines/cutlass/instance.cuh"

#include <algorithm>
#include <vector>

namespace fusebox::cuda::cutlass_conv {

namespace {

// Launches that are independent of each other, recorded as one operation: a child graph of
// kernel nodes without edges among them, so they run concurrently. The stride phases write
// disjoint, interleaved sub-lattices of dx, which the encoder's byte ranges cannot tell
// apart: as separate operations on dx's range they would run one after another. Concurrent,
// ResNet-50's 3x3 stride-2 dgrads on an H200: 62.7 -> 57.0 us (layer 2), 52.4 -> 41.9 (layer
// 3), 42.9 -> 35.9 (layer 4) (bench/results/2026-11-28_h200_session22_dense/).
class ConcurrentKernels {
 public:
  ConcurrentKernels() { FUSEBOX_CUDA_CHECK(cudaGraphCreate(&graph_, 0)); }
  ~ConcurrentKernels() { (void)cudaGraphDestroy(graph_); }
  ConcurrentKernels(const ConcurrentKernels&) = delete;
  ConcurrentKernels& operator=(const ConcurrentKernels&) = delete;

  // Nodes start in the order they are added.
  template <class Kernel>
  void add(const typename Kernel::Arguments& args) {
    auto* kernel = &cutlass::device_kernel<Kernel>;
    constexpr int smem = Kernel::SharedStorageSize;
    FUSEBOX_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    typename Kernel::Params params = Kernel::to_underlying_arguments(args, nullptr);
    void* pointers[] = {&params};
    cudaKernelNodeParams node{};
    node.func = reinterpret_cast<void*>(kernel);
    node.gridDim = Kernel::get_grid_shape(params);
    node.blockDim = Kernel::get_block_shape();
    node.sharedMemBytes = unsigned(smem);
    node.kernelParams = pointers;  // copied into the node
    cudaGraphNode_t added = nullptr;
    FUSEBOX_CUDA_CHECK(cudaGraphAddKernelNode(&added, graph_, nullptr, 0, &node));
  }
  void record(Context& ctx, const BufferList& reads, const BufferList& writes) {
    ctx.encoder.add_child_graph(reads, writes, graph_);  // copies the graph
  }

 private:
  cudaGraph_t graph_ = nullptr;
};

template <class T, int TM, int TN, bool kPlain>
std::optional<std::string> run(Context& ctx, const Plan& plan, const ConvGeometry& g,
                               const Operands& o, const BufferList& reads,
                               const BufferRange& written) {
  using I = Instance<cutlass::conv::Operator::kDgrad, T, T, TM, TN, kPlain>;
  if (plan.phases.empty()) {
    const auto args = I::arguments(g, o.y, o.w, nullptr, o.result, o.bias, plan.epilogue);
    return record_unless_refused<I>(ctx, args, reads, written);
  }
  // dx [N, D0, D1, D2, C] and dy [N, O0, O1, O2, K], dense channels-last.
  const int64_t dx_stride[5] = {g.in_size() * g.in_channels, g.in[1] * g.in[2] * g.in_channels,
                                g.in[2] * g.in_channels, g.in_channels, 1};
  const int64_t dy_stride[5] = {g.out_size() * g.out_channels, g.out[1] * g.out[2] * g.out_channels,
                                g.out[2] * g.out_channels, g.out_channels, 1};
  // The phases with the most taps first: their CTAs run longest, and the short phases' CTAs
  // then fill the last wave (H200, ResNet-50's 3x3 stride-2 dgrads against the phases in
  // order: layer 2 57.4 -> 56.4 us, layer 3 41.7 -> 39.9, layer 4 35.7 -> 34.0;
  // bench/results/2026-11-29_h200_session24_phase_dgrad/).
  auto taps = [&](size_t i) {
    const DgradPhase& p = plan.phases[i];
    return p.taps[0] * p.taps[1] * p.taps[2];
  };
  std::vector<size_t> order;
  for (size_t i = 0; i < plan.phases.size(); ++i)
    if (!plan.phases[i].empty()) order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return taps(a) > taps(b); });
  ConcurrentKernels phases;
  for (size_t i : order) {
    const DgradPhase& p = plan.phases[i];
    typename I::Strides strides;
    int64_t offset = 0;
    strides.act[0] = dx_stride[0];
    strides.act[4] = 1;
    for (int d = 0; d < 3; ++d) {
      offset += p.phase[d] * dx_stride[d + 1];
      strides.act[d + 1] = g.stride[d] * dx_stride[d + 1];
    }
    for (int k = 0; k < 5; ++k) strides.xformed[k] = dy_stride[k];
    const auto args =
        I::arguments(phase_geometry(g, p), o.y, o.phase_filters[i], nullptr,
                     static_cast<T*>(o.result) + offset, o.bias, plan.epilogue, &strides);
    if (auto why = I::refusal(args)) return cat("stride phase ", i, ": ", *why);
    phases.add<typename I::Kernel>(args);
  }
  // The phases write disjoint parts of dx: one operation, the phases concurrent inside it.
  if (!order.empty()) phases.record(ctx, reads, {written});
  return std::nullopt;
}

}  // namespace

std::optional<std::string> record_dgrad(Context& ctx, const Plan& plan, const ConvGeometry& g,
                                        const Operands& o, const BufferList& reads,
                                        const BufferRange& written) {
  return dispatch<Tile::t128x128, Tile::t128x64>(plan, [&]<class T, int TM, int TN>() {
    if (plan.epilogue.plain()) return run<T, TM, TN, true>(ctx, plan, g, o, reads, written);
    return run<T, TM, TN, false>(ctx, plan, g, o, reads, written);
  });
}

}  // namespace fusebox::cuda::cutlass_conv
