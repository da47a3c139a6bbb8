// Convolution, forward and both backward ops, lowered to GEMM through im2col.
//
// For one image and one group g the data are matrices (NCHW makes each of them a
// plain row-major slice): X_g [C/g, D], W_g [K/g, C/g*R], Y_g [K/g, O], and
// col(X_g) [C/g*R, O], the im2col matrix whose row (c, r) holds the input value that
// filter tap r of channel c meets at each output position (0 in the padding).
// Then conv is Y_g = W_g col(X_g), and its two adjoints follow:
//
//   op     GEMM                         M            N            K (reduction)
//   -----  ---------------------------  -----------  -----------  ---------------------
//   fprop  Y_g   = W_g   . col(X_g)     K/g          O            C/g * R
//   dgrad  col   = W_g^T . dY_g         C/g * R      O            K/g      then col2im -> dX_g
//   wgrad  dW_g += dY_g  . col(X_g)^T   K/g          C/g * R      O        summed over images
//
// (O, D, R are the products of the spatial extents.) The O dimension is cut into
// blocks so that the im2col scratch stays small; a 1x1 stride-1 unpadded conv skips
// im2col, since col(X_g) is X_g. Work is spread over threads at the outermost level
// that has enough independent tasks (images x groups x blocks); when there are too
// few, the tasks run one after another and the GEMM and im2col/col2im parallelise
// inside (a parallel_for nested in another runs serially, so both cannot happen).
#include <algorithm>
#include <functional>
#include <vector>

#include "conv_problem.h"
#include "gemm.h"
#include "kernels.h"
#include "pointwise_math.h"

namespace fusebox::cpu {

namespace {

// About 1 MiB of f32 im2col scratch per thread.
constexpr int64_t kColBudget = int64_t(1) << 18;
constexpr int64_t kMinBlock = 64;

struct Blocking {
  int64_t block = 1;  // output positions per block
  int64_t count = 1;  // blocks per (image, group) plane
};

// Cuts O into blocks whose im2col matrix fits the budget; with `split_for_threads`,
// also into more (not smaller than kMinBlock) when the planes alone are too few tasks.
Blocking plan_blocks(const ConvProblem& p, int64_t planes, bool split_for_threads) {
  const int64_t o = p.out_size(), threads = num_threads();
  int64_t block = std::clamp<int64_t>(kColBudget / std::max<int64_t>(p.col_rows(), 1), kMinBlock,
                                      std::max<int64_t>(o, 1));
  int64_t count = (o + block - 1) / block;
  // planes == 0 (a batch of 0: run_node skips the node, but the helper must not divide by it).
  if (split_for_threads && planes > 0 && planes * count < 2 * threads) {
    int64_t most = std::max<int64_t>(1, o / kMinBlock);
    int64_t wanted = (2 * threads + planes - 1) / planes;
    wanted = (wanted + threads - 1) / threads * threads;  // whole rounds of threads
    count = std::min(std::max(count, wanted), most);
  }
  return {std::max<int64_t>(1, (o + count - 1) / count), count};
}

// Runs task(t, scratch) for t < tasks: in parallel when there are enough of them,
// else serially so that the work inside each task can use the threads.
template <class C>
void run_tasks(int64_t tasks, int64_t scratch_size,
               const std::function<void(int64_t, std::vector<C>&)>& task) {
  const bool outer_parallel = tasks >= 2 * int64_t(num_threads());
  parallel_for(tasks, outer_parallel ? 1 : tasks, [&](int64_t begin, int64_t end) {
    std::vector<C> scratch(size_t(std::max<int64_t>(scratch_size, 0)));
    for (int64_t t = begin; t < end; ++t) task(t, scratch);
  });
}

// Adds bias[c] to rows c of a [rows, cols] block with leading dimension ld.
template <class C>
void add_row_bias(const C* bias, int64_t rows, int64_t cols, C* out, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    C* row = out + r * ld;
    for (int64_t j = 0; j < cols; ++j) row[j] += bias[r];
  }
}

template <class C>
void conv_forward_impl(const ConvProblem& p, const C* x, const C* w, const C* bias, C* y) {
  const int64_t groups = p.groups, cg = p.in_per_group(), kg = p.out_per_group();
  const int64_t rows = p.col_rows(), in_size = p.in_size(), out_size = p.out_size();
  const bool pointwise = p.is_pointwise();
  const Blocking blocks = plan_blocks(p, p.batch * groups, true);
  run_tasks<C>(p.batch * groups * blocks.count, pointwise ? 0 : rows * blocks.block,
               [&](int64_t t, std::vector<C>& col) {
                 const int64_t image = t / (groups * blocks.count);
                 const int64_t g = t / blocks.count % groups;
                 const int64_t o_begin = t % blocks.count * blocks.block;
                 const int64_t o_end = std::min(out_size, o_begin + blocks.block);
                 if (o_begin >= o_end) return;
                 const C* x_g = x + (image * p.in_channels + g * cg) * in_size;
                 const C* cols = x_g + o_begin;  // pointwise: col(X_g) is X_g
                 int64_t ld_cols = in_size;
                 if (!pointwise) {
                   im2col(p, x_g, o_begin, o_end, col.data());
                   cols = col.data();
                   ld_cols = o_end - o_begin;
                 }
                 C* y_g = y + (image * p.out_channels + g * kg) * out_size + o_begin;
                 blas_gemm<C>(false, false, kg, o_end - o_begin, rows, C(1), w + g * kg * rows,
                              rows, cols, ld_cols, C(0), y_g, out_size);
                 if (bias) add_row_bias(bias + g * kg, kg, o_end - o_begin, y_g, out_size);
               });
}

template <class C>
void conv_backward_data_impl(const ConvProblem& p, const C* dy, const C* w, const C* bias, C* dx) {
  const int64_t groups = p.groups, cg = p.in_per_group(), kg = p.out_per_group();
  const int64_t rows = p.col_rows(), in_size = p.in_size(), out_size = p.out_size();
  const bool pointwise = p.is_pointwise();
  // Blocks of one plane scatter into the same dx plane, so they stay in one task.
  const Blocking blocks = plan_blocks(p, p.batch * groups, false);
  run_tasks<C>(p.batch * groups, pointwise ? 0 : rows * blocks.block,
               [&](int64_t t, std::vector<C>& col) {
                 const int64_t image = t / groups, g = t % groups;
                 const C* dy_g = dy + (image * p.out_channels + g * kg) * out_size;
                 const C* w_g = w + g * kg * rows;
                 C* dx_g = dx + (image * p.in_channels + g * cg) * in_size;
                 if (pointwise) {
                   blas_gemm<C>(true, false, cg, in_size, kg, C(1), w_g, rows, dy_g, out_size, C(0),
                                dx_g, in_size);
                 } else {
                   std::fill(dx_g, dx_g + cg * in_size, C(0));
                   for (int64_t o_begin = 0; o_begin < out_size; o_begin += blocks.block) {
                     const int64_t o_end = std::min(out_size, o_begin + blocks.block);
                     blas_gemm<C>(true, false, rows, o_end - o_begin, kg, C(1), w_g, rows,
                                  dy_g + o_begin, out_size, C(0), col.data(), o_end - o_begin);
                     col2im(p, col.data(), o_begin, o_end, dx_g);
                   }
                 }
                 if (bias) add_row_bias(bias + g * cg, cg, in_size, dx_g, in_size);
               });
}

template <class C>
void conv_backward_filter_impl(const ConvProblem& p, const C* x, const C* dy, C* dw) {
  const int64_t groups = p.groups, cg = p.in_per_group(), kg = p.out_per_group();
  const int64_t rows = p.col_rows(), in_size = p.in_size(), out_size = p.out_size();
  const bool pointwise = p.is_pointwise();
  // Every image and block adds into the same dW_g, so a task is a whole group.
  const Blocking blocks = plan_blocks(p, groups, false);
  run_tasks<C>(groups, pointwise ? 0 : rows * blocks.block, [&](int64_t g, std::vector<C>& col) {
    C* dw_g = dw + g * kg * rows;
    if (p.batch == 0 || out_size == 0) std::fill(dw_g, dw_g + kg * rows, C(0));
    bool first = true;
    for (int64_t image = 0; image < p.batch; ++image) {
      const C* x_g = x + (image * p.in_channels + g * cg) * in_size;
      const C* dy_g = dy + (image * p.out_channels + g * kg) * out_size;
      for (int64_t o_begin = 0; o_begin < out_size; o_begin += blocks.block) {
        const int64_t o_end = std::min(out_size, o_begin + blocks.block);
        const C* cols = x_g + o_begin;
        int64_t ld_cols = in_size;
        if (!pointwise) {
          im2col(p, x_g, o_begin, o_end, col.data());
          cols = col.data();
          ld_cols = o_end - o_begin;
        }
        blas_gemm<C>(false, true, kg, rows, o_end - o_begin, C(1), dy_g + o_begin, out_size, cols,
                     ld_cols, first ? C(0) : C(1), dw_g, rows);
        first = false;
      }
    }
  });
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* a_name, const char* b_name,
                      const std::string& where) {
  FUSEBOX_CHECK(a.dtype() == b.dtype(), where, a_name, " is ", dtype_name(a.dtype()), " but ",
                b_name, " is ", dtype_name(b.dtype()));
}

void check_bias(const Tensor* bias, const Tensor& out, int64_t channels, const std::string& where) {
  if (!bias) return;
  check_same_dtype(*bias, out, "bias", "output", where);
  FUSEBOX_CHECK(bias->shape() == Shape{channels}, where, "bias ", shape_str(bias->shape()),
                " should be [", channels, "]");
}

const Tensor* optional_input(Inputs in, size_t i) {
  return i < in.size() ? in[i] : nullptr;
}

}  // namespace

// The fused epilogue on y (bias already added), in the compute type, before y is rounded:
// y = residual_activation(activation(y) + residual), a pass per step (the oracle: simple).
template <class C>
void apply_epilogue(const ConvAttrs& a, const C* residual, C* y, int64_t count) {
  activate_in_place(a.activation, y, count);
  if (!residual) return;
  parallel_for(count, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] += residual[i];
  });
  activate_in_place(a.residual_activation, y, count);
}

// x [N, C, D...], w [K, C/g, R...], bias [K]?, residual [N, K, O...]? -> y [N, K, O...]
void conv_forward(const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const Tensor &x = *in[0], &w = *in[1];
  const Tensor* bias = optional_input(in, 2);
  const Tensor* residual = optional_input(in, 3);
  Tensor& y = out[0];
  check_same_dtype(x, y, "input", "output", where);
  check_same_dtype(w, y, "weight", "output", where);
  const auto& attrs = std::get<ConvAttrs>(n.attrs);
  const ConvProblem p{make_conv_geometry(attrs, x.shape(), w.shape(), y.shape(), where)};
  check_bias(bias, y, p.out_channels, where);
  if (residual) {
    check_same_dtype(*residual, y, "residual", "output", where);
    FUSEBOX_CHECK(residual->shape() == y.shape(), where, "residual ", shape_str(residual->shape()),
                  " should be the output's ", shape_str(y.shape()));
  }
  visit_float_compute(n, y.dtype(), [&](auto tag) {
    using C = decltype(tag);
    ComputeInput<C> xc(&x), wc(&w), bc(bias), zc(residual);
    ComputeOutput<C> yc(y);
    conv_forward_impl(p, xc.data(), wc.data(), bc.data(), yc.data());
    if (attrs.activation || residual) apply_epilogue(attrs, zc.data(), yc.data(), y.numel());
    yc.store();
  });
  FUSEBOX_CHECK(out.size() == (attrs.channel_stats ? 2u : 1u), where, "expects ",
                attrs.channel_stats ? "2 outputs (y, channel statistics)" : "1 output (y)");
  if (attrs.channel_stats) channel_moments(n, y, out[1]);  // of y as stored
}

// dy [N, K, O...], w [K, C/g, R...], bias [C]? -> dx [N, C, D...]
void conv_backward_data(const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const Tensor &dy = *in[0], &w = *in[1];
  const Tensor* bias = optional_input(in, 2);
  Tensor& dx = out[0];
  check_same_dtype(dy, dx, "dy", "dx", where);
  check_same_dtype(w, dx, "weight", "dx", where);
  const auto& attrs = std::get<ConvBackwardDataAttrs>(n.attrs);
  const ConvProblem p{make_conv_geometry(attrs.conv, dx.shape(), w.shape(), dy.shape(), where)};
  check_bias(bias, dx, p.in_channels, where);
  visit_float_compute(n, dx.dtype(), [&](auto tag) {
    using C = decltype(tag);
    ComputeInput<C> dyc(&dy), wc(&w), bc(bias);
    ComputeOutput<C> dxc(dx);
    conv_backward_data_impl(p, dyc.data(), wc.data(), bc.data(), dxc.data());
    dxc.store();
  });
}

// x [N, C, D...], dy [N, K, O...] -> dw [K, C/g, R...]
void conv_backward_filter(const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const Tensor &x = *in[0], &dy = *in[1];
  Tensor& dw = out[0];
  check_same_dtype(x, dw, "x", "dw", where);
  check_same_dtype(dy, dw, "dy", "dw", where);
  const auto& attrs = std::get<ConvBackwardFilterAttrs>(n.attrs);
  const ConvProblem p{make_conv_geometry(attrs.conv, x.shape(), dw.shape(), dy.shape(), where)};
  visit_float_compute(n, dw.dtype(), [&](auto tag) {
    using C = decltype(tag);
    ComputeInput<C> xc(&x), dyc(&dy);
    ComputeOutput<C> dwc(dw);
    conv_backward_filter_impl(p, xc.data(), dyc.data(), dwc.data());
    dwc.store();
  });
}

}  // namespace fusebox::cpu
