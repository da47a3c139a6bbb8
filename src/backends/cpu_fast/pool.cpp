// Pooling on oneDNN: max_pool (without indices), avg_pool and global_avg_pool (an average
// over the whole spatial extent) as one forward-inference pooling primitive each. On dense
// NCHW values the primitive is made at compile (oneDNN's ncsp kernels); a value a convolution
// left in its blocked layout (ResNet's stem conv -> max_pool -> convs) is read as it lies, by a
// primitive made for that layout on the first run that meets it (then kept), and the output
// stays in the primitive's layout where the executable asks (every reader a convolution). The
// ncsp max pool ran ResNet-50's stem pool in ~16 ms at batch 1 on 2 cores, between a reorder
// out of conv1's layout and one back into layer1's.
#ifdef FUSEBOX_WITH_ONEDNN
#include <deque>
#include <mutex>
#include <vector>

#include "backends/cpu_fast/kernels.h"
#include "backends/cpu_fast/onednn.h"

namespace fusebox::cpu_fast {
namespace {

using dnnl::memory;

// What a pooling primitive is made from, whatever the source's layout.
struct PoolShape {
  dnnl::algorithm algorithm;
  memory::dims strides, kernel, dilation, pad_l, pad_r;
};

class PoolKernel final : public Kernel {
 public:
  PoolKernel(PoolShape shape, dnnl::pooling_forward::primitive_desc pd, memory::desc x,
             memory::desc y)
      : shape_(std::move(shape)), x_(x), y_(y) {
    variants_.push_back({x, pd, dnnl::pooling_forward(pd)});
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    run_own(in, {}, 0, out, nullptr);
  }

  bool writes_own_layout() const override { return true; }
  bool reads_own_layout(size_t input) const override { return input == 0; }

  void run_own(std::span<const Tensor* const> in, std::span<const OwnLayout* const> own_in,
               uint32_t /*consumable*/, std::span<Tensor> out,
               std::shared_ptr<OwnLayout>* own_out) override {
    const OwnLayout* own = own_in.empty() ? nullptr : own_in[0];
    const memory src = own ? static_cast<const OnednnValue*>(own)->memory : wrap(x_, in[0]->raw());
    const Variant& v = variant_for(src.get_desc());
    // A layout no primitive takes is read through a reorder into the dense one's.
    const memory source = v.src == src.get_desc() ? src : in_layout(src, v.src);
    const bool direct = !own_out && v.pd.dst_desc() == y_;
    const memory dst = direct ? wrap(y_, out[0].raw()) : memory(v.pd.dst_desc(), cpu_engine());
    execute(v.primitive, {{DNNL_ARG_SRC, source}, {DNNL_ARG_DST, dst}});
    if (own_out) {
      *own_out = std::make_shared<OnednnValue>(dst);
    } else if (!direct) {
      const memory y = wrap(y_, out[0].raw());
      execute(dnnl::reorder(dst, y), {{DNNL_ARG_FROM, dst}, {DNNL_ARG_TO, y}});
    }
  }

  std::string describe() const override {
    return cat("oneDNN pooling ", implementation(variants_.front().pd));
  }

 private:
  struct Variant {
    memory::desc src;
    dnnl::pooling_forward::primitive_desc pd;
    dnnl::pooling_forward primitive;
  };

  // The primitive for a source of layout `src`: the dense one made at compile, or one made for
  // a writer's layout when first met (the output's layout left to oneDNN: the source's); the
  // dense one where oneDNN has no pooling for that layout (remembered).
  const Variant& variant_for(const memory::desc& src) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (const Variant& v : variants_)
      if (v.src == src) return v;
    for (const memory::desc& d : refused_)
      if (d == src) return variants_.front();
    const memory::desc y_any(y_.get_dims(), y_.get_data_type(), memory::format_tag::any);
    try {
      const dnnl::pooling_forward::primitive_desc pd(
          cpu_engine(), dnnl::prop_kind::forward_inference, shape_.algorithm, src, y_any,
          shape_.strides, shape_.kernel, shape_.dilation, shape_.pad_l, shape_.pad_r);
      variants_.push_back({src, pd, dnnl::pooling_forward(pd)});
      return variants_.back();
    } catch (const dnnl::error&) {
      refused_.push_back(src);
      return variants_.front();
    }
  }

  PoolShape shape_;
  memory::desc x_, y_;
  std::mutex mutex_;
  std::deque<Variant> variants_;  // few, found by a scan; a deque keeps references valid
  std::vector<memory::desc> refused_;
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
    return {
        std::make_unique<PoolKernel>(PoolShape{algorithm, strides, kernel, dilation, pad_l, pad_r},
                                     pd, x_plain, y_plain),
        ""};
  } catch (const dnnl::error& e) {
    return {nullptr, cat("oneDNN has no pooling for it (", e.what(), ")")};
  }
}

}  // namespace fusebox::cpu_fast
#endif  // FUSEBOX_WITH_ONEDNN
