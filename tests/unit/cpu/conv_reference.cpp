#include "conv_reference.h"

#include <cmath>
#include <filesystem>
#include <sstream>

#include "fusebox/io/tensor_file.h"

namespace fusebox::cpu::test {
namespace {

// Every problem as a 3-D one: leading spatial extents of 1.
struct Geometry {
  int64_t batch = 0, in_channels = 0, out_channels = 0, groups = 1;
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, filter{1, 1, 1};
  std::array<int64_t, 3> stride{1, 1, 1}, dilation{1, 1, 1}, pad{0, 0, 0};
};

Geometry geometry_of(const ConvCase& c) {
  Geometry g;
  const Shape y = c.y();
  g.batch = c.x[0];
  g.in_channels = c.x[1];
  g.out_channels = c.w[0];
  g.groups = c.attrs.groups;
  const int64_t lead = 3 - c.rank();
  for (int64_t d = 0; d < c.rank(); ++d) {
    g.in[lead + d] = c.x[2 + d];
    g.out[lead + d] = y[2 + d];
    g.filter[lead + d] = c.w[2 + d];
    g.stride[lead + d] = c.attrs.strides[d];
    g.dilation[lead + d] = c.attrs.dilations[d];
    g.pad[lead + d] = c.attrs.pads_begin[d];
  }
  return g;
}

// Calls term(x_index, w_index, y_index) for every product x * w that the
// convolution sums into y (flat row-major indices).
template <class F>
void for_each_conv_term(const Geometry& g, F&& term) {
  const int64_t cg = g.in_channels / g.groups, kg = g.out_channels / g.groups;
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t k = 0; k < g.out_channels; ++k)
      for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
        for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
          for (int64_t o2 = 0; o2 < g.out[2]; ++o2)
            for (int64_t c = 0; c < cg; ++c)
              for (int64_t r0 = 0; r0 < g.filter[0]; ++r0)
                for (int64_t r1 = 0; r1 < g.filter[1]; ++r1)
                  for (int64_t r2 = 0; r2 < g.filter[2]; ++r2) {
                    const int64_t i0 = o0 * g.stride[0] - g.pad[0] + r0 * g.dilation[0];
                    const int64_t i1 = o1 * g.stride[1] - g.pad[1] + r1 * g.dilation[1];
                    const int64_t i2 = o2 * g.stride[2] - g.pad[2] + r2 * g.dilation[2];
                    if (i0 < 0 || i0 >= g.in[0] || i1 < 0 || i1 >= g.in[1] || i2 < 0 ||
                        i2 >= g.in[2])
                      continue;
                    const int64_t channel = (k / kg) * cg + c;
                    const int64_t x_index =
                        (((n * g.in_channels + channel) * g.in[0] + i0) * g.in[1] + i1) * g.in[2] +
                        i2;
                    const int64_t w_index =
                        (((k * cg + c) * g.filter[0] + r0) * g.filter[1] + r1) * g.filter[2] + r2;
                    const int64_t y_index =
                        (((n * g.out_channels + k) * g.out[0] + o0) * g.out[1] + o1) * g.out[2] +
                        o2;
                    term(x_index, w_index, y_index);
                  }
}

Reference zeros(const Shape& shape) {
  return {shape, std::vector<double>(size_t(numel(shape)), 0.0),
          std::vector<double>(size_t(numel(shape)), 0.0)};
}

// Adds bias[c] to every element of channel c of a [N, C, ...] reference.
void add_bias(Reference& r, const Tensor* bias) {
  if (!bias) return;
  const int64_t channels = r.shape[1];
  const int64_t plane = numel(r.shape) / std::max<int64_t>(1, r.shape[0] * channels);
  for (int64_t i = 0; i < numel(r.shape); ++i) {
    const double b = bias->get(i / plane % channels);
    r.value[size_t(i)] += b;
    r.magnitude[size_t(i)] += std::fabs(b);
  }
}

int64_t pick(std::mt19937_64& rng, std::initializer_list<int64_t> choices) {
  return *(choices.begin() + rng() % choices.size());
}

}  // namespace

Shape ConvCase::y() const {
  Shape y = {x[0], w[0]};
  for (int64_t d = 0; d < rank(); ++d) {
    const int64_t padded = x[2 + d] + attrs.pads_begin[d] + attrs.pads_end[d];
    const int64_t reach = attrs.dilations[d] * (w[2 + d] - 1) + 1;
    y.push_back((padded - reach) / attrs.strides[d] + 1);
  }
  return y;
}

std::string ConvCase::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype) << " x " << shape_str(x) << " w " << shape_str(w) << " groups "
     << attrs.groups << " strides " << shape_str(attrs.strides) << " dilations "
     << shape_str(attrs.dilations) << " pads " << shape_str(attrs.pads_begin) << "/"
     << shape_str(attrs.pads_end) << (bias ? " bias" : "");
  return os.str();
}

ConvCase random_conv_case(std::mt19937_64& rng, int64_t rank, DType dtype) {
  ConvCase c;
  c.dtype = dtype;
  int64_t channels = 1, groups = 1, per_group_out = pick(rng, {1, 2, 3, 5});
  switch (rng() % 4) {
    case 0:
      channels = pick(rng, {1, 3, 4, 7});
      break;
    case 1:
      groups = pick(rng, {2, 3});
      channels = groups * pick(rng, {1, 2, 3});
      break;
    case 2:  // depthwise
      channels = pick(rng, {3, 4, 7});
      groups = channels;
      per_group_out = pick(rng, {1, 2});
      break;
    default:
      channels = pick(rng, {3, 7});
      per_group_out = pick(rng, {4, 7});
  }
  c.attrs.groups = groups;
  c.x = {pick(rng, {1, 2}), channels};
  c.w = {groups * per_group_out, channels / groups};
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t filter = rank == 3 ? pick(rng, {1, 2, 3}) : pick(rng, {1, 2, 3, 3});
    const int64_t stride = rank == 3 ? pick(rng, {1, 2}) : pick(rng, {1, 1, 2, 3});
    const int64_t dilation = pick(rng, {1, 1, 2});
    const int64_t pad_begin = pick(rng, {0, 0, 1, 2}), pad_end = pick(rng, {0, 0, 1, 2});
    const int64_t reach = dilation * (filter - 1) + 1;
    const int64_t extra = int64_t(rng() % (rank == 1 ? 12 : rank == 2 ? 7 : 4));
    c.x.push_back(std::max<int64_t>(1, reach - pad_begin - pad_end + extra));
    c.w.push_back(filter);
    c.attrs.strides.push_back(stride);
    c.attrs.dilations.push_back(dilation);
    c.attrs.pads_begin.push_back(pad_begin);
    c.attrs.pads_end.push_back(pad_end);
  }
  c.bias = rng() % 2 == 0;
  return c;
}

Reference conv_reference(const ConvCase& c, const Tensor& x, const Tensor& w, const Tensor* bias) {
  Reference r = zeros(c.y());
  const std::vector<double> xs = x.to_doubles(), ws = w.to_doubles();
  for_each_conv_term(geometry_of(c), [&](int64_t xi, int64_t wi, int64_t yi) {
    const double term = xs[size_t(xi)] * ws[size_t(wi)];
    r.value[size_t(yi)] += term;
    r.magnitude[size_t(yi)] += std::fabs(term);
  });
  add_bias(r, bias);
  return r;
}

Reference conv_backward_data_reference(const ConvCase& c, const Tensor& dy, const Tensor& w,
                                       const Tensor* bias) {
  Reference r = zeros(c.x);
  const std::vector<double> dys = dy.to_doubles(), ws = w.to_doubles();
  for_each_conv_term(geometry_of(c), [&](int64_t xi, int64_t wi, int64_t yi) {
    const double term = dys[size_t(yi)] * ws[size_t(wi)];
    r.value[size_t(xi)] += term;
    r.magnitude[size_t(xi)] += std::fabs(term);
  });
  add_bias(r, bias);
  return r;
}

Reference conv_backward_filter_reference(const ConvCase& c, const Tensor& x, const Tensor& dy) {
  Reference r = zeros(c.w);
  const std::vector<double> xs = x.to_doubles(), dys = dy.to_doubles();
  for_each_conv_term(geometry_of(c), [&](int64_t xi, int64_t wi, int64_t yi) {
    const double term = xs[size_t(xi)] * dys[size_t(yi)];
    r.value[size_t(wi)] += term;
    r.magnitude[size_t(wi)] += std::fabs(term);
  });
  return r;
}

::testing::AssertionResult matches_reference(const Tensor& got, const Reference& ref,
                                             const std::string& what) {
  if (got.shape() != ref.shape)
    return ::testing::AssertionFailure()
           << what << ": shape " << shape_str(got.shape()) << ", expected " << shape_str(ref.shape);
  // f16 results below 2^-14 are subnormal: their rounding error is absolute, 2^-25.
  double rounding = 0, rounding_floor = 0, eps = std::ldexp(1.0, -23);
  switch (got.dtype()) {
    case DType::f64:
      eps = std::ldexp(1.0, -52);
      break;
    case DType::bf16:
      rounding = std::ldexp(1.0, -8);
      break;
    case DType::f16:
      rounding = std::ldexp(1.0, -11);
      rounding_floor = std::ldexp(1.0, -25);
      break;
    default:
      break;
  }
  int64_t bad = 0, first_bad = -1;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double want = ref.value[size_t(i)];
    const double tol =
        rounding * std::fabs(want) + rounding_floor + 16 * eps * ref.magnitude[size_t(i)];
    if (!(std::fabs(got.get(i) - want) <= tol)) {
      if (first_bad < 0) first_bad = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << bad << " of " << got.numel() << " elements differ; first at flat "
         << first_bad << ": got " << got.get(first_bad) << ", expected "
         << ref.value[size_t(first_bad)] << " (term magnitude " << ref.magnitude[size_t(first_bad)]
         << ")";
}

double dot(const Tensor& a, const Tensor& b) {
  double sum = 0;
  for (int64_t i = 0; i < a.numel(); ++i) sum += a.get(i) * b.get(i);
  return sum;
}

bool load_onnx_node_test(const std::string& name, std::vector<Tensor>* inputs,
                         std::vector<Tensor>* outputs) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path("/usr/include/onnx/backend/test/data/node") / name / "test_data_set_0";
  if (!fs::exists(dir)) return false;
  for (auto [prefix, list] : {std::pair{"input_", inputs}, std::pair{"output_", outputs}}) {
    list->clear();
    for (int i = 0; fs::exists(dir / cat(prefix, i, ".pb")); ++i)
      list->push_back(read_tensor_pb((dir / cat(prefix, i, ".pb")).string()));
  }
  return true;
}

}  // namespace fusebox::cpu::test
