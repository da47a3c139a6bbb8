// layer_norm_backward and rms_norm_backward: the IR ops (parameter gradients summed down
// to a broadcast scale's shape) and the direct-call entry points of kernels.h. The
// kernels are in kernels/norm/backward.cu (norm::norm_backward).
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/norm/backward_impl.cuh"
#include "backends/cuda/kernels/norm/common.h"

namespace fusebox::cuda {

namespace {

constexpr int kMaxParamRank = 8;

// A parameter gradient reduced from the normalised dims to the parameter's shape: the
// dims where the parameter has 1 (or is missing, leading) are summed.
struct SumToShape {
  int rank;                      // of the normalised dims
  int64_t full[kMaxParamRank];   // the normalised dims
  int64_t param[kMaxParamRank];  // the parameter's dims, right-aligned, 1-padded
};

// out[o] = sum of full[i] over the elements i of the normalised dims that broadcast from
// element o of the parameter; one thread per output element, in row-major order of i
// (deterministic).
template <class O>
__global__ void sum_to_param_shape(const float* full, SumToShape s, int64_t count, O* out) {
  const int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= count) return;
  // Coordinates of o in the parameter; the summed dims run over all their values.
  int64_t coord[kMaxParamRank];
  int64_t rest = o;
  for (int d = s.rank - 1; d >= 0; --d) {
    coord[d] = rest % s.param[d];
    rest /= s.param[d];
  }
  int64_t inner = 1;
  for (int d = 0; d < s.rank; ++d)
    if (s.param[d] == 1) inner *= s.full[d];
  float total = 0.0f;
  for (int64_t k = 0; k < inner; ++k) {
    int64_t kk = k, index = 0, stride = 1;
    int64_t c[kMaxParamRank];
    for (int d = s.rank - 1; d >= 0; --d) {
      if (s.param[d] == 1) {
        c[d] = kk % s.full[d];
        kk /= s.full[d];
      } else {
        c[d] = coord[d];
      }
    }
    for (int d = s.rank - 1; d >= 0; --d) {
      index += c[d] * stride;
      stride *= s.full[d];
    }
    total += full[index];
  }
  out[o] = convert<O>(total);
}

// (dy, x, scale?, mean, inv_std_dev) -> (dx, dscale, dbias) for layer_norm (centre),
// (dy, x, scale?, inv_rms) -> (dx, dscale) for rms_norm; ops.h. The parameter gradients
// have scale's shape (summed over the dims scale broadcasts along), else the normalised
// dims', in x's dtype.
void norm_backward_op(Context& ctx, const Node& n, Inputs in, Outputs out, bool centre) {
  const std::string where = node_label(n);
  const size_t inputs = centre ? 5 : 4, outputs = centre ? 3 : 2;
  FUSEBOX_CHECK(
      in.size() == inputs && in[0] && in[1] && in[3] && (!centre || in[4]) && out.size() == outputs,
      where, "expects ", inputs, " inputs and ", outputs, " outputs");
  const DeviceTensor &dy = *in[0], &x = *in[1];
  const norm::RowsView view = norm::rows_view(where, x.shape, std::get<NormAttrs>(n.attrs).axis);
  DeviceTensor scale_storage;
  const DeviceTensor* scale = norm::expand_param(ctx, where, in[2], view, scale_storage);
  const DeviceTensor* mean = centre ? in[3] : nullptr;
  const DeviceTensor& rstd = *in[centre ? 4 : 3];
  FUSEBOX_CHECK(rstd.numel() == view.rows && (!mean || mean->numel() == view.rows), where,
                "the saved statistics must have ", view.rows, " elements (one per row of x ",
                shape_str(x.shape), ")");
  const Shape param_shape = in[2] ? in[2]->shape : view.norm_shape;
  for (size_t o = 1; o < outputs; ++o) {
    FUSEBOX_CHECK(out[o].dtype == x.dtype && out[o].shape == param_shape, where, "output ", o,
                  " must be ", dtype_name(x.dtype), " ", shape_str(param_shape));
  }
  DeviceTensor* dscale = &out[1];
  DeviceTensor* dbias = centre ? &out[2] : nullptr;
  if (numel(param_shape) == view.cols) {
    norm::norm_backward(ctx, where, {x, dy, scale, mean, rstd, out[0], dscale, dbias}, centre);
    return;
  }
  // scale broadcasts: the column sums go to f32 [cols] temporaries, then summed down.
  FUSEBOX_CHECK(view.norm_shape.size() <= size_t(kMaxParamRank), where, "at most ", kMaxParamRank,
                " normalised dims are supported, got ", shape_str(view.norm_shape));
  DeviceTensor full_scale = temporary_tensor(ctx, DType::f32, {view.cols});
  DeviceTensor full_bias = centre ? temporary_tensor(ctx, DType::f32, {view.cols}) : DeviceTensor();
  norm::norm_backward(
      ctx, where, {x, dy, scale, mean, rstd, out[0], &full_scale, centre ? &full_bias : nullptr},
      centre);
  SumToShape s{};
  s.rank = int(view.norm_shape.size());
  const size_t lead = view.norm_shape.size() - param_shape.size();
  for (int d = 0; d < s.rank; ++d) {
    s.full[d] = view.norm_shape[size_t(d)];
    s.param[d] = size_t(d) < lead ? 1 : param_shape[size_t(d) - lead];
  }
  const int64_t count = numel(param_shape);
  for (size_t o = 1; o < outputs; ++o) {
    const DeviceTensor& full = o == 1 ? full_scale : full_bias;
    visit_device_float(n, x.dtype, [&](auto tag) {
      using O = decltype(tag);
      ctx.encoder.launch(&sum_to_param_shape<O>, dim3(unsigned((count + 255) / 256)), dim3(256), 0,
                         {full.range()}, {out[o].range()}, full.as<const float>(), s, count,
                         out[o].as<O>());
    });
  }
}

}  // namespace

void layer_norm_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  norm_backward_op(ctx, n, in, out, true);
}

void rms_norm_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  norm_backward_op(ctx, n, in, out, false);
}

void layer_norm_backward(Context& ctx, const DeviceTensor& x, const DeviceTensor& dy,
                         const DeviceTensor* scale, const DeviceTensor& mean,
                         const DeviceTensor& rstd, DeviceTensor& dx, DeviceTensor* dscale,
                         DeviceTensor* dbias) {
  norm::norm_backward(ctx, "layer_norm_backward", {x, dy, scale, &mean, rstd, dx, dscale, dbias},
                      true);
}

void rms_norm_backward(Context& ctx, const DeviceTensor& x, const DeviceTensor& dy,
                       const DeviceTensor* scale, const DeviceTensor& rstd, DeviceTensor& dx,
                       DeviceTensor* dscale) {
  norm::norm_backward(ctx, "rms_norm_backward", {x, dy, scale, nullptr, rstd, dx, dscale, nullptr},
                      false);
}

}  // namespace fusebox::cuda
