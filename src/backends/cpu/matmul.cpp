// Matrix products, both on the backend's one blocked GEMM (gemm.h). It runs in
// f64 for f64 and in f32 for f32, f16 and bf16; narrow operands are widened to
// f32 copies first and the result is rounded once.
#include "gemm.h"
#include "kernel_util.h"
#include "kernels.h"
#include "pointwise_math.h"

namespace fusebox::cpu {

namespace {

// The element type the GEMM runs in for tensors of type T.
template <class T>
using gemm_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// A read-only operand as G: the tensor's own buffer when it already holds G,
// else a converted copy.
template <class G>
class GemmInput {
 public:
  explicit GemmInput(const Tensor& t) {
    if (t.dtype() == dtype_of<G>::value) {
      data_ = t.data<G>();
    } else {
      copy_ = broadcast_values<G>(t, t.shape());
      data_ = copy_.data();
    }
  }
  const G* data() const { return data_; }

 private:
  std::vector<G> copy_;
  const G* data_ = nullptr;
};

// The output as G: the tensor's own buffer when it holds G, else a scratch
// buffer that finish() rounds into the tensor.
template <class G>
class GemmOutput {
 public:
  explicit GemmOutput(Tensor& t) : t_(t) {
    if (t.dtype() == dtype_of<G>::value)
      data_ = t.data<G>();
    else {
      scratch_.resize(size_t(t.numel()));
      data_ = scratch_.data();
    }
  }
  G* data() { return data_; }
  void finish() {
    if (!scratch_.empty()) store_values(t_, scratch_);
  }

 private:
  Tensor& t_;
  std::vector<G> scratch_;
  G* data_ = nullptr;
};

}  // namespace

// numpy matmul: a [..., M, K] x b [..., K, N] -> [..., M, N] with broadcast batch
// dims; a 1-D a is [1, K] and a 1-D b is [K, 1], the added dim dropped from the
// result (y's shape, from inference, already has it dropped; the bytes agree).
// The batch is a strided nest of matrix offsets; each run along its innermost
// dim is one batched GEMM call with constant strides.
void matmul(const Node& n, Inputs in, Outputs out) {
  const Tensor& a = *in[0];
  const Tensor& b = *in[1];
  Shape sa = a.shape(), sb = b.shape();
  FUSEBOX_CHECK(!sa.empty() && !sb.empty(), node_label(n), "operands must have rank >= 1, got ",
                shape_str(sa), " and ", shape_str(sb));
  if (sa.size() == 1) sa.insert(sa.begin(), 1);
  if (sb.size() == 1) sb.push_back(1);
  const int64_t m = sa[sa.size() - 2], k = sa.back(), cols = sb.back();
  FUSEBOX_CHECK(sb[sb.size() - 2] == k, node_label(n), "inner dims differ: ", shape_str(a.shape()),
                " x ", shape_str(b.shape()));
  const Shape batch_a(sa.begin(), sa.end() - 2), batch_b(sb.begin(), sb.end() - 2);
  Shape batch;
  FUSEBOX_CHECK(broadcast_shapes(batch_a, batch_b, &batch), node_label(n),
                "batch dims do not broadcast: ", shape_str(a.shape()), " x ", shape_str(b.shape()));
  FUSEBOX_CHECK(out[0].numel() == numel(batch) * m * cols, node_label(n), "output ",
                shape_str(out[0].shape()), " does not match the product's size");

  // Element offsets of each batch entry's matrices in y, a and b.
  StridedNest<3> nest{batch,
                      {contiguous_strides(batch), broadcast_strides(batch_a, batch),
                       broadcast_strides(batch_b, batch)}};
  for (int64_t& s : nest.strides[0]) s *= m * cols;
  for (int64_t& s : nest.strides[1]) s *= m * k;
  for (int64_t& s : nest.strides[2]) s *= k * cols;
  nest.simplify();

  visit_float(n, a.dtype(), [&](auto tag) {
    using G = gemm_t<decltype(tag)>;
    GemmInput<G> ga(a), gb(b);
    GemmOutput<G> gy(out[0]);
    nest.for_each_run(0, numel(batch), [&](const std::array<int64_t, 3>& off, int64_t count) {
      blas_gemm_batched<G>(count, false, false, m, cols, k, G(1), ga.data() + off[1], k,
                           nest.inner_stride(1), gb.data() + off[2], cols, nest.inner_stride(2),
                           G(0), gy.data() + off[0], cols, nest.inner_stride(0));
    });
    gy.finish();
  });
}

// gemm: y = alpha * op(A) op(B) + beta * C, C broadcast to [M, N]. Without C (or
// with beta 0) y is written without being read.
void gemm(const Node& n, Inputs in, Outputs out) {
  const auto& attrs = std::get<GemmAttrs>(n.attrs);
  const Tensor& a = *in[0];
  const Tensor& b = *in[1];
  const Tensor* c = in.size() > 2 ? in[2] : nullptr;
  FUSEBOX_CHECK(a.rank() == 2 && b.rank() == 2, node_label(n), "expects 2-D operands, got ",
                shape_str(a.shape()), " and ", shape_str(b.shape()));
  const int64_t m = attrs.trans_a ? a.dim(1) : a.dim(0);
  const int64_t k = attrs.trans_a ? a.dim(0) : a.dim(1);
  const int64_t cols = attrs.trans_b ? b.dim(0) : b.dim(1);
  FUSEBOX_CHECK((attrs.trans_b ? b.dim(1) : b.dim(0)) == k, node_label(n),
                "inner dims differ: ", shape_str(a.shape()), " x ", shape_str(b.shape()));
  const bool add_c = c != nullptr && attrs.beta != 0.0;
  Shape c_shape;
  FUSEBOX_CHECK(
      !c || (broadcast_shapes(c->shape(), {m, cols}, &c_shape) && c_shape == Shape{m, cols}),
      node_label(n), "C ", shape_str(c ? c->shape() : Shape{}), " does not broadcast to [", m, ", ",
      cols, "]");

  visit_float(n, a.dtype(), [&](auto tag) {
    using G = gemm_t<decltype(tag)>;
    GemmInput<G> ga(a), gb(b);
    GemmOutput<G> gy(out[0]);
    if (add_c) {
      const std::vector<G> c_full = broadcast_values<G>(*c, {m, cols});
      std::copy(c_full.begin(), c_full.end(), gy.data());
    }
    blas_gemm<G>(attrs.trans_a, attrs.trans_b, m, cols, k, G(attrs.alpha), ga.data(), a.dim(1),
                 gb.data(), b.dim(1), add_c ? G(attrs.beta) : G(0), gy.data(), cols);
    activate_in_place(attrs.activation, gy.data(), m * cols);  // before the output is rounded
    gy.finish();
  });
}

}  // namespace fusebox::cpu
