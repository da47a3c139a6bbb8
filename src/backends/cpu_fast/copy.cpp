// transpose and slice as oneDNN reorders: the input read through a memory descriptor of the
// output's dims with the input's strides permuted (transpose) or offset and scaled (slice),
// written dense. Why: the reference's strided nest moved ViT-B/16's [197, 768] transposes at
// ~1.4 GB/s (16 of 187 ms at batch 1 on 2 cores); oneDNN's reorders are blocked and threaded.
#ifdef FUSEBOX_WITH_ONEDNN
#include "backends/cpu_fast/kernels.h"
#include "backends/cpu_fast/onednn.h"

namespace fusebox::cpu_fast {
namespace {

using dnnl::memory;

class StridedCopyKernel final : public Kernel {
 public:
  StridedCopyKernel(dnnl::reorder::primitive_desc pd, memory::desc from, memory::desc to,
                    int64_t offset_bytes)
      : pd_(std::move(pd)), primitive_(pd_), from_(from), to_(to), offset_(offset_bytes) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    const auto* base = static_cast<const std::byte*>(in[0]->raw());
    execute(primitive_,
            {{DNNL_ARG_FROM, wrap(from_, base + offset_)}, {DNNL_ARG_TO, wrap(to_, out[0].raw())}});
  }
  std::string describe() const override { return cat("oneDNN reorder ", implementation(pd_)); }

 private:
  dnnl::reorder::primitive_desc pd_;
  dnnl::reorder primitive_;
  memory::desc from_, to_;
  int64_t offset_;
};

// The reorder from the input viewed as `strides` (elements) at `offset` to the dense output.
Planned strided_copy(const Graph& g, const Node& n, const Shape& strides, int64_t offset) {
  const TensorType& y = g.value(n.outputs[0]).type;
  if (!data_type_of(y.dtype))
    return {nullptr, cat("a ", dtype_name(y.dtype), " tensor (f32, bf16 and f16 only)")};
  if (y.shape.empty() || numel(y.shape) == 0) return {nullptr, "a scalar or empty output"};
  for (int64_t s : strides)
    if (s < 0) return {nullptr, "a negative step (oneDNN's strides are not negative)"};
  const memory::desc from(dims_of(y.shape), *data_type_of(y.dtype), dims_of(strides));
  const memory::desc to = plain_desc(dims_of(y.shape), y.dtype);
  try {
    dnnl::reorder::primitive_desc pd(cpu_engine(), from, cpu_engine(), to);
    return {
        std::make_unique<StridedCopyKernel>(pd, from, to, offset * int64_t(dtype_size(y.dtype))),
        ""};
  } catch (const dnnl::error& e) {
    return {nullptr, cat("oneDNN has no reorder for it (", e.what(), ")")};
  }
}

}  // namespace

Planned plan_transpose(const Graph& g, const Node& n) {
  const auto& perm = std::get<TransposeAttrs>(n.attrs).perm;
  const Shape x = contiguous_strides(g.value(n.inputs[0]).type.shape);
  Shape strides(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) strides[i] = x[size_t(perm[i])];
  return strided_copy(g, n, strides, 0);
}

// Normalised attributes (ir/graph.h): absolute starts, the output's shape holds the counts.
Planned plan_slice(const Graph& g, const Node& n) {
  const auto& a = std::get<SliceAttrs>(n.attrs);
  Shape strides = contiguous_strides(g.value(n.inputs[0]).type.shape);
  int64_t offset = 0;
  for (size_t i = 0; i < a.axes.size(); ++i) {
    const size_t d = size_t(a.axes[i]);
    offset += a.starts[i] * strides[d];
    strides[d] *= a.steps[i];
  }
  return strided_copy(g, n, strides, offset);
}

}  // namespace fusebox::cpu_fast
#endif  // FUSEBOX_WITH_ONEDNN
