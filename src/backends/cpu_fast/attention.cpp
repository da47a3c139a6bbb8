// attention (ir/ops.h) on oneDNN, in inference: primitives made at compile,
//   s = scale * q k^T             matmul to f32 scores, the scale as a post-op
//   s += bias, s += causal mask   binary adds in place (each broadcast over the batch)
//   p = softmax(s) over the keys  f32 in, q's dtype out
//   y = p v                       matmul
// over the leading dims as matmul's batch (rank 3 or 4). The scores take Tq x Tk f32 per batch
// entry, allocated each run. The causal mask (key j > query i out) is a constant [Tq, Tk] of 0
// and -inf made at compile (exp(-inf - max) is 0: the reference's softmax over keys 0..i). The
// adds are binary primitives of their own, not the matmul's post-ops: a binary post-op
// broadcast over a batch of more than one sent oneDNN 3.2's matmul to its reference
// implementation (GPT-2's scores at batch 8: 2.06 s a layer instead of ~3 ms). The training
// form (lse) stays on the reference kernels. Why: the inference pipeline fuses
// ViT-B/16's and GPT-2's attention (f32 too, for these kernels), which then ran on the reference
// kernel: 598 of ViT's 800 ms at batch 1 on 2 cores.
#ifdef FUSEBOX_WITH_ONEDNN
#include <limits>

#include "backends/cpu_fast/kernels.h"
#include "backends/cpu_fast/onednn.h"

namespace fusebox::cpu_fast {
namespace {

using dnnl::memory;

class AttentionKernel final : public Kernel {
 public:
  AttentionKernel(dnnl::matmul::primitive_desc scores, dnnl::softmax_forward::primitive_desc soft,
                  dnnl::matmul::primitive_desc product, memory::desc q, memory::desc k_t,
                  memory::desc v, memory::desc y,
                  std::optional<dnnl::binary::primitive_desc> add_bias,
                  std::optional<dnnl::binary::primitive_desc> add_mask,
                  std::optional<memory> causal_mask)
      : scores_pd_(std::move(scores)),
        softmax_pd_(std::move(soft)),
        product_pd_(std::move(product)),
        scores_(scores_pd_),
        softmax_(softmax_pd_),
        product_(product_pd_),
        q_(q),
        k_t_(k_t),
        v_(v),
        y_(y),
        causal_mask_(std::move(causal_mask)) {
    if (add_bias) add_bias_.emplace(*add_bias), bias_desc_ = add_bias->src_desc(1);
    if (add_mask) add_mask_.emplace(*add_mask);
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    memory s(scores_pd_.dst_desc(), cpu_engine());
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, wrap(q_, in[0]->raw())},
                                         {DNNL_ARG_WEIGHTS, wrap(k_t_, in[1]->raw())},
                                         {DNNL_ARG_DST, s}};
    execute(scores_, args);
    if (add_bias_)
      execute(*add_bias_, {{DNNL_ARG_SRC_0, s},
                           {DNNL_ARG_SRC_1, wrap(bias_desc_, in[3]->raw())},
                           {DNNL_ARG_DST, s}});
    if (add_mask_)
      execute(*add_mask_,
              {{DNNL_ARG_SRC_0, s}, {DNNL_ARG_SRC_1, *causal_mask_}, {DNNL_ARG_DST, s}});
    memory p(softmax_pd_.dst_desc(), cpu_engine());
    execute(softmax_, {{DNNL_ARG_SRC, s}, {DNNL_ARG_DST, p}});
    execute(product_, {{DNNL_ARG_SRC, p},
                       {DNNL_ARG_WEIGHTS, wrap(v_, in[2]->raw())},
                       {DNNL_ARG_DST, wrap(y_, out[0].raw())}});
  }

  std::string describe() const override {
    return cat("oneDNN attention: matmul ", implementation(scores_pd_), ", softmax ",
               implementation(softmax_pd_), ", matmul ", implementation(product_pd_));
  }

 private:
  dnnl::matmul::primitive_desc scores_pd_;
  dnnl::softmax_forward::primitive_desc softmax_pd_;
  dnnl::matmul::primitive_desc product_pd_;
  dnnl::matmul scores_;
  dnnl::softmax_forward softmax_;
  dnnl::matmul product_;
  memory::desc q_, k_t_, v_, y_;
  std::optional<dnnl::binary> add_bias_, add_mask_;  // s += bias, s += the causal mask
  memory::desc bias_desc_;
  std::optional<memory> causal_mask_;  // [1.., Tq, Tk] f32: 0 where key j <= query i, else -inf
};

// k [..., Tk, d] read as k^T [..., d, Tk]: the same bytes with the last two strides swapped.
memory::desc transposed_desc(const Shape& k, DType dtype) {
  const memory::desc plain = plain_desc(dims_of(k), dtype);
  memory::dims dims = plain.get_dims(), strides = plain.get_strides();
  const size_t r = dims.size();
  std::swap(dims[r - 1], dims[r - 2]);
  std::swap(strides[r - 1], strides[r - 2]);
  return memory::desc(dims, *data_type_of(dtype), strides);
}

}  // namespace

Planned plan_attention(const Graph& g, const Node& n) {
  const auto& a = std::get<AttentionAttrs>(n.attrs);
  if (a.with_lse || n.outputs.size() > 1) return {nullptr, "the training form (lse)"};
  const TensorType& q = g.value(n.inputs[0]).type;
  const TensorType& k = g.value(n.inputs[1]).type;
  const TensorType& v = g.value(n.inputs[2]).type;
  const TensorType& y = g.value(n.outputs[0]).type;
  if (!data_type_of(q.dtype))
    return {nullptr, cat("a ", dtype_name(q.dtype), " q (f32, bf16 and f16 only)")};
  if (q.shape.size() < 3 || q.shape.size() > 4)
    return {nullptr, cat("q ", shape_str(q.shape), " (rank 3 or 4 so far)")};
  const ValueId bias = n.inputs.size() > 3 ? n.inputs[3] : kNoValue;
  const int64_t tk = k.shape[k.shape.size() - 2];
  Shape scores_shape = q.shape;
  scores_shape.back() = tk;
  dnnl::post_ops ops;
  ops.append_eltwise(dnnl::algorithm::eltwise_linear, float(a.scale), 0.f);
  const memory::desc s_desc = plain_desc(dims_of(scores_shape), DType::f32);
  std::optional<memory::desc> bias_desc;
  if (bias != kNoValue) {
    const TensorType& b = g.value(bias).type;
    if (!data_type_of(b.dtype) || b.shape.size() > scores_shape.size())
      return {nullptr, cat("a ", dtype_name(b.dtype), shape_str(b.shape), " bias")};
    memory::dims dims(scores_shape.size() - b.shape.size(), 1);  // numpy's leading 1s
    dims.insert(dims.end(), b.shape.begin(), b.shape.end());
    bias_desc = plain_desc(dims, b.dtype);
  }
  std::optional<memory> causal_mask;
  if (a.causal) {
    const int64_t tq = scores_shape[scores_shape.size() - 2];
    memory::dims dims(scores_shape.size() - 2, 1);
    dims.insert(dims.end(), {tq, tk});
    causal_mask = memory(plain_desc(dims, DType::f32), cpu_engine());
    float* mask = static_cast<float*>(causal_mask->get_data_handle());
    for (int64_t i = 0; i < tq; ++i)
      for (int64_t j = 0; j < tk; ++j)
        mask[i * tk + j] = j <= i ? 0.f : -std::numeric_limits<float>::infinity();
  }
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  const memory::desc q_desc = plain_desc(dims_of(q.shape), q.dtype);
  const memory::desc k_t = transposed_desc(k.shape, k.dtype);
  const memory::desc v_desc = plain_desc(dims_of(v.shape), v.dtype);
  const memory::desc y_desc = plain_desc(dims_of(y.shape), y.dtype);
  const memory::desc p_desc = plain_desc(dims_of(scores_shape), v.dtype);
  try {
    dnnl::matmul::primitive_desc scores(cpu_engine(), q_desc, k_t, s_desc, attr);
    dnnl::softmax_forward::primitive_desc soft(cpu_engine(), dnnl::prop_kind::forward_inference,
                                               dnnl::algorithm::softmax_accurate, s_desc, p_desc,
                                               int(scores_shape.size() - 1));
    dnnl::matmul::primitive_desc product(cpu_engine(), p_desc, v_desc, y_desc);
    auto add = [&](const memory::desc& operand) {
      return dnnl::binary::primitive_desc(cpu_engine(), dnnl::algorithm::binary_add, s_desc,
                                          operand, s_desc);
    };
    std::optional<dnnl::binary::primitive_desc> add_bias, add_mask;
    if (bias_desc) add_bias = add(*bias_desc);
    if (causal_mask) add_mask = add(causal_mask->get_desc());
    return {std::make_unique<AttentionKernel>(scores, soft, product, q_desc, k_t, v_desc, y_desc,
                                              add_bias, add_mask, std::move(causal_mask)),
            ""};
  } catch (const dnnl::error& e) {
    return {nullptr, cat("oneDNN has no such matmul or softmax (", e.what(), ")")};
  }
}

}  // namespace fusebox::cpu_fast
#endif  // FUSEBOX_WITH_ONEDNN
