// Pooling on oneDNN: max_pool (without indices), avg_pool and global_avg_pool (an average
// over the whole spatial extent) as one forward-inference pooling primitive each, on the
// dense NCHW values as they lie (oneDNN's ncsp kernels: no reorder around them).
#ifdef FUSEBOX_WITH_ONEDNN
#include "backends/cpu_fast/kernels.h"
#include "backends/cpu_fast/onednn.h"

namespace fusebox::cpu_fast {
namespace {

using dnnl::memory;

class PoolKernel final : public Kernel {
 public:
  PoolKernel(dnnl::pooling_forward::primitive_desc pd, memory::desc x, memory::desc y)
      : pd_(std::move(pd)), primitive_(pd_), x_(x), y_(y) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    execute(primitive_,
            {{DNNL_ARG_SRC, wrap(x_, in[0]->raw())}, {DNNL_ARG_DST, wrap(y_, out[0].raw())}});
  }

  std::string describe() const override { return cat("oneDNN pooling ", implementation(pd_)); }

 private:
  dnnl::pooling_forward::primitive_desc pd_;
  dnnl::pooling_forward primitive_;
  memory::desc x_, y_;
};

}  // namespace

Planned plan_pool(const Graph& g, const Node& n) {
  const TensorType& x = g.value(n.inputs[0]).type;
  const TensorType& y = g.value(n.outputs[0]).type;
  if (!data_type_of(x.dtype) || y.dtype != x.dtype)
    return {nullptr, cat("a ", dtype_name(x.dtype), " input (f32, bf16 and f16 only)")};
  const size_t spatial = x.shape.size() - 2;
  if (spatial < 1 || spatial > 3)
    return {nullptr, cat(spatial, " spatial dims (oneDNN takes 1 to 3)")};
  memory::dims kernel(spatial), strides(spatial, 1), dilation(spatial, 0), pad_l(spatial, 0),
      pad_r(spatial, 0);
  dnnl::algorithm algorithm = dnnl::algorithm::pooling_avg_exclude_padding;
  if (n.op == OpKind::global_avg_pool) {
    for (size_t d = 0; d < spatial; ++d) kernel[d] = x.shape[2 + d];
  } else {
    const auto& a = std::get<PoolAttrs>(n.attrs);
    if (a.return_indices || n.outputs.size() > 1)
      return {nullptr, "max_pool's indices (oneDNN's workspace is not them)"};
    for (size_t d = 0; d < spatial; ++d) {
      kernel[d] = a.kernel[d];
      if (d < a.strides.size()) strides[d] = a.strides[d];
      if (d < a.dilations.size()) dilation[d] = a.dilations[d] - 1;
      if (d < a.pads_begin.size()) pad_l[d] = a.pads_begin[d];
      // The high padding the output's extent implies (ceil_mode reaches past pads_end).
      pad_r[d] = (y.shape[2 + d] - 1) * strides[d] + (kernel[d] - 1) * (dilation[d] + 1) + 1 -
                 x.shape[2 + d] - pad_l[d];
      if (pad_r[d] < 0) return {nullptr, "an output that leaves input rows unread"};
      const int64_t declared = d < a.pads_end.size() ? a.pads_end[d] : 0;
      if (n.op == OpKind::avg_pool && a.count_include_pad && pad_r[d] > declared)
        return {nullptr, "ceil_mode with count_include_pad (which padding counts differs)"};
    }
    if (n.op == OpKind::max_pool)
      algorithm = dnnl::algorithm::pooling_max;
    else if (a.count_include_pad)
      algorithm = dnnl::algorithm::pooling_avg_include_padding;
  }
  const memory::desc x_plain = plain_desc(dims_of(x.shape), x.dtype),
                     y_plain = plain_desc(dims_of(y.shape), y.dtype);
  try {
    dnnl::pooling_forward::primitive_desc pd(cpu_engine(), dnnl::prop_kind::forward_inference,
                                             algorithm, x_plain, y_plain, strides, kernel, dilation,
                                             pad_l, pad_r);
    return {std::make_unique<PoolKernel>(pd, x_plain, y_plain), ""};
  } catch (const dnnl::error& e) {
    return {nullptr, cat("oneDNN has no pooling for it (", e.what(), ")")};
  }
}

}  // namespace fusebox::cpu_fast
#endif  // FUSEBOX_WITH_ONEDNN
