// cudnn_fusions probe: which fused cuDNN graphs (through cudnn-frontend) a ResNet-style
// training step could use on this GPU, what each costs, and whether it computes the right thing.
//
// For every case (table in make_cases(), each in bf16 and f16 io, f32 compute and intermediate,
// per-channel statistics in f32, NHWC strides, dims given as logical N,C,H,W) it builds the
// graph, queries heuristics modes A+FALLBACK (bn_finalize: FALLBACK, as cudnn-frontend's
// sample does), deselects DOWN_CONVERT_INPUTS (as fusebox does), builds the first plan that
// builds (HEURISTICS_CHOICE, then candidates by index), executes it on random non-zero data,
// times it and checks it against a host f64 reference on a small-batch variant (N=2) of the
// same graph (inputs rounded to the io dtype first; outputs poisoned with NaN bytes first).
//
// Cases: plain convolutions (the reference times); conv+bias+act (relu, gelu, gelu_tanh, silu,
// sigmoid, tanh, relu6); conv+bias+residual+relu (both orders, four ResNet-50 1x1 shapes);
// conv+genstats; SBRCS (scale-bias-relu-conv-genstats); bn_finalize; DSBAR (pure pointwise block
// end); dgrad+drelu; dgrad+drelu+dbn_weight; dbn_weight alone; scale-bias-relu-wgrad;
// batchnorm training (+add+relu); batchnorm backward (+drelu / +boolean mask, with dAdd).
//
// Build and run (bench/CMakeLists.txt does not: it is built by the script alone):
//   bench/probes/cudnn_fusions.sh [--build-only] [--filter a,b] [--dtype bf16|f16|both]
//                                [--iters N] [--warmup N] [--check-n N] [--no-check] [--list]
// (CUDA_HOME, CUDNN_FE_INCLUDE, CUDNN_INCLUDE_DIR, CUDNN_LIB_DIR: see the script.)
//
// Output: '#' lines (device, cuDNN runtime and header versions, cudnn-frontend version,
// policy), then one line per case and dtype:
//   CASE name.dtype | supported=0 stage=<validate|build_operation_graph|heuristics|check_support|
//                     build_plans|execute> msg=<cuDNN's message, one line>
//   CASE name.dtype | supported=1 engines=<candidate configs of the heuristics> plan=<engine
//                     config built> build_ms=<validate+op graph+heuristics+check+plan build>
//                     ws=<workspace bytes> native_cg=<SUPPORTS_CUDA_GRAPH_NATIVE_API 0/1>
//                     us=<median of --iters executes, CUDA events, after --warmup>
//                     plain_us=<the same convolution alone, '-' where none> ok=<1/0, '-' not
//                     checked> err=<max|got-ref| / max|ref|, worst output> worst=<that output>
//                     [check=<stage: message> when the check graph itself failed]
// Tolerance: 2e-2 (bf16), 1e-2 (f16) of max|ref| per output tensor.
//
// Expressed differently from the brief / samples (see the case builders):
// - dgrad_drelu_dbnweight: the relu input is recomputed as (x - mean) * inv_var * scale + bias
//   (".sub"); cudnn-frontend's sample adds the mean tensor instead (".add_as_sample": same graph
//   shape, the reference follows what the graph says).
// - dbn_mask_dadd: cuDNN's BOOLEAN mask is bit-packed; the reference assumes bit i of byte i/8
//   (LSB first) is element i in memory order. The dadd output checks that assumption directly.
// - scale/bias of SBRCS and wgrad_sbr are in the io dtype (as the samples); ".f32sb" repeats
//   SBRCS 3x3 with f32 scale/bias (what bn_finalize produces). BN tensors are f32 elsewhere.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;
using VariantPack = std::unordered_map<TensorPtr, void*>;
using PwMode = fe::PointwiseMode_t;
constexpr fe::DataType_t F32 = fe::DataType_t::FLOAT;
constexpr double kEps = 1e-5, kMomentum = 0.1;

// ---------------------------------------------------------------------------------------------
// Errors: every CUDA / cuDNN / cudnn-frontend failure becomes an exception with one message.

std::string one_line(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '\n' || ch == '\r' || ch == '\t' || ch == '|') ch = ' ';
    if (ch == ' ' && (out.empty() || out.back() == ' ')) continue;
    out += ch;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  if (out.size() > 600) out = out.substr(0, 600) + "...";
  return out.empty() ? "(no message)" : out;
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA error ") + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ") in " + what);
  }
}
#define CK(call) check_cuda((call), #call)

void warn_cuda(cudaError_t e, const char* what) {  // for destructors, which must not throw
  if (e != cudaSuccess) std::fprintf(stderr, "# warning: %s: %s\n", what, cudaGetErrorString(e));
}

void check_cudnn(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuDNN error ") + cudnnGetErrorString(s) + " in " + what);
  }
}

void check_fe(fe::error_t status) {
  if (status.is_bad()) throw std::runtime_error(status.get_message());
}

struct DevMem {
  void* p = nullptr;
  explicit DevMem(size_t bytes) { CK(cudaMalloc(&p, std::max<size_t>(bytes, 256))); }
  ~DevMem() { warn_cuda(cudaFree(p), "cudaFree"); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
};

// ---------------------------------------------------------------------------------------------
// Host values: doubles, converted to/from the tensor's dtype (BOOLEAN: bit-packed, LSB first).

const char* dt_name(fe::DataType_t dt) {
  switch (dt) {
    case fe::DataType_t::BFLOAT16:
      return "bf16";
    case fe::DataType_t::HALF:
      return "f16";
    case fe::DataType_t::FLOAT:
      return "f32";
    case fe::DataType_t::BOOLEAN:
      return "bool";
    default:
      return "?";
  }
}

size_t bytes_of(fe::DataType_t dt, int64_t count) {
  switch (dt) {
    case fe::DataType_t::BOOLEAN:
      return size_t(count + 7) / 8;
    case fe::DataType_t::FLOAT:
      return size_t(count) * 4;
    case fe::DataType_t::HALF:
    case fe::DataType_t::BFLOAT16:
      return size_t(count) * 2;
    default:
      throw std::runtime_error("probe: unsupported dtype");
  }
}

// One element to / from its bytes; BOOLEAN is bit-packed (bit i of byte i / 8, LSB first).
std::vector<uint8_t> pack(fe::DataType_t dt, const std::vector<double>& v) {
  std::vector<uint8_t> out(bytes_of(dt, int64_t(v.size())), 0);
  for (size_t i = 0; i < v.size(); ++i) {
    const float f = float(v[i]);
    if (dt == fe::DataType_t::BOOLEAN) {
      out[i / 8] |= uint8_t(v[i] != 0 ? 1u << (i % 8) : 0u);
    } else if (dt == fe::DataType_t::FLOAT) {
      std::memcpy(&out[4 * i], &f, 4);
    } else if (dt == fe::DataType_t::HALF) {
      const __half h = __float2half_rn(f);
      std::memcpy(&out[2 * i], &h, 2);
    } else {
      const __nv_bfloat16 b = __float2bfloat16(f);
      std::memcpy(&out[2 * i], &b, 2);
    }
  }
  return out;
}

std::vector<double> unpack(fe::DataType_t dt, const std::vector<uint8_t>& bytes, int64_t count) {
  std::vector<double> v(static_cast<size_t>(count));
  for (size_t i = 0; i < v.size(); ++i) {
    float f = 0;
    __half h;
    __nv_bfloat16 b;
    if (dt == fe::DataType_t::BOOLEAN) {
      f = float((bytes[i / 8] >> (i % 8)) & 1);
    } else if (dt == fe::DataType_t::FLOAT) {
      std::memcpy(&f, &bytes[4 * i], 4);
    } else if (dt == fe::DataType_t::HALF) {
      std::memcpy(&h, &bytes[2 * i], 2);
      f = __half2float(h);
    } else {
      std::memcpy(&b, &bytes[2 * i], 2);
      f = __bfloat162float(b);
    }
    v[i] = f;
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// A graph under construction, with its user tensors (inputs and outputs) and host reference.

std::vector<int64_t> nhwc_strides(const std::vector<int64_t>& d) {  // d = {N, C, H, W}
  return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
}

struct Fill {
  double lo = -1, hi = 1;
};

struct Buffer {
  std::string name;
  TensorPtr t;
  fe::DataType_t dt;
  int64_t count;
  bool output;
  Fill fill;
  std::unique_ptr<DevMem> dev;
  std::vector<double> host;    // input values as uploaded (check run)
  std::vector<double> expect;  // reference of an output (check run)
};

struct Net {
  fe::graph::Graph g;
  fe::DataType_t io;
  std::vector<std::unique_ptr<Buffer>> bufs;
  std::function<void(Net&)> reference;  // fills expect of every output from host of the inputs

  explicit Net(fe::DataType_t io_) : io(io_) {
    g.set_io_data_type(io).set_intermediate_data_type(F32).set_compute_data_type(F32);
  }

  Buffer& add(const std::string& name, TensorPtr t, fe::DataType_t dt,
              const std::vector<int64_t>& dims, bool output, Fill fill) {
    int64_t count = 1;
    for (int64_t d : dims) count *= d;
    bufs.push_back(std::make_unique<Buffer>(Buffer{name, std::move(t), dt, count, output, fill}));
    return *bufs.back();
  }
  TensorPtr in(const std::string& name, const std::vector<int64_t>& dims, fe::DataType_t dt,
               Fill fill = {}) {
    auto t = g.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_dim(dims)
                          .set_stride(nhwc_strides(dims))
                          .set_data_type(dt));
    add(name, t, dt, dims, false, fill);
    return t;
  }
  void out(const TensorPtr& t, const std::string& name, const std::vector<int64_t>& dims,
           fe::DataType_t dt) {
    t->set_name(name)
        .set_dim(dims)
        .set_stride(nhwc_strides(dims))
        .set_data_type(dt)
        .set_output(true);
    add(name, t, dt, dims, true, {});
  }
  TensorPtr virt(const TensorPtr& t, const std::vector<int64_t>& dims) {  // shape a virtual one
    t->set_dim(dims).set_stride(nhwc_strides(dims));
    return t;
  }
  Buffer& find(const std::string& name) {
    for (auto& b : bufs)
      if (b->name == name) return *b;
    throw std::runtime_error("probe: no tensor " + name);
  }
  const std::vector<double>& h(const std::string& name) { return find(name).host; }
  std::vector<double>& e(const std::string& name) {
    Buffer& b = find(name);
    b.expect.assign(size_t(b.count), 0.0);
    return b.expect;
  }
};

TensorPtr pw(Net& net, const TensorPtr& a, PwMode mode) {
  return net.g.pointwise(
      a, fe::graph::Pointwise_attributes().set_mode(mode).set_compute_data_type(F32));
}
TensorPtr pw(Net& net, const TensorPtr& a, const TensorPtr& b, PwMode mode) {
  return net.g.pointwise(
      a, b, fe::graph::Pointwise_attributes().set_mode(mode).set_compute_data_type(F32));
}

// ---------------------------------------------------------------------------------------------
// Convolution geometry and host references (NHWC activations, KRSC filters, in memory order).

struct Geo {
  int64_t n, c, h, w, k = 0, r = 1, s = 1, pad = 0, stride = 1;
  int64_t p() const { return (h + 2 * pad - r) / stride + 1; }
  int64_t q() const { return (w + 2 * pad - s) / stride + 1; }
  std::vector<int64_t> x() const { return {n, c, h, w}; }
  std::vector<int64_t> wt() const { return {k, c, r, s}; }
  std::vector<int64_t> y() const { return {n, k, p(), q()}; }
  std::vector<int64_t> cx() const { return {1, c, 1, 1}; }
  std::vector<int64_t> cy() const { return {1, k, 1, 1}; }
  Geo with_n(int64_t batch) const {
    Geo g = *this;
    g.n = batch;
    return g;
  }
  std::string tag() const {
    std::string t = k ? std::to_string(r) + "x" + std::to_string(s) + "_c" + std::to_string(c) +
                            "k" + std::to_string(k) + "_" + std::to_string(h)
                      : "c" + std::to_string(c) + "_" + std::to_string(h);
    return n == 256 ? t : t + "_n" + std::to_string(n);
  }
};

template <class A>
A conv_attrs(const Geo& g) {
  A a;
  a.set_pre_padding({g.pad, g.pad})
      .set_post_padding({g.pad, g.pad})
      .set_stride({g.stride, g.stride})
      .set_dilation({1, 1})
      .set_compute_data_type(F32);
  return a;
}

enum class ConvOp { fprop, dgrad, wgrad };

// fprop: y = conv(a = x, b = w); dgrad: dx = conv_dgrad(a = dy, b = w); wgrad: dw = (a = dy, b =
// x).
std::vector<double> conv_ref(ConvOp op, const Geo& g, const std::vector<double>& a,
                             const std::vector<double>& b) {
  const int64_t P = g.p(), Q = g.q(), C = g.c, K = g.k, RSC = g.r * g.s * g.c;
  const size_t count = op == ConvOp::fprop   ? size_t(g.n * P * Q * K)
                       : op == ConvOp::dgrad ? size_t(g.n * g.h * g.w * C)
                                             : size_t(K * RSC);
  std::vector<double> out(count, 0.0);
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q) {
        const int64_t yo = ((n * P + p) * Q + q) * K;
        for (int64_t r = 0; r < g.r; ++r) {
          const int64_t ih = p * g.stride - g.pad + r;
          if (ih < 0 || ih >= g.h) continue;
          for (int64_t s = 0; s < g.s; ++s) {
            const int64_t iw = q * g.stride - g.pad + s;
            if (iw < 0 || iw >= g.w) continue;
            const int64_t xo = ((n * g.h + ih) * g.w + iw) * C, wo = (r * g.s + s) * C;
            for (int64_t k = 0; k < K; ++k) {
              if (op == ConvOp::fprop) {
                const double* xp = &a[xo];
                const double* wp = &b[k * RSC + wo];
                double acc = 0;
                for (int64_t c = 0; c < C; ++c) acc += xp[c] * wp[c];
                out[yo + k] += acc;
              } else if (op == ConvOp::dgrad) {
                const double d = a[yo + k];
                const double* wp = &b[k * RSC + wo];
                for (int64_t c = 0; c < C; ++c) out[xo + c] += d * wp[c];
              } else {
                const double d = a[yo + k];
                const double* xp = &b[xo];
                double* dw = &out[k * RSC + wo];
                for (int64_t c = 0; c < C; ++c) dw[c] += d * xp[c];
              }
            }
          }
        }
      }
  return out;
}

// Per-channel sums over N, H, W of f(i) (channel = i % C in NHWC order).
template <class F>
std::vector<double> chan_sum(size_t count, int64_t C, F f) {
  std::vector<double> s(size_t(C), 0.0);
  for (size_t i = 0; i < count; ++i) s[i % size_t(C)] += f(i);
  return s;
}

double relu(double v) {
  return v > 0 ? v : 0;
}

struct Act {
  const char* name;
  PwMode mode;
  double (*f)(double);
  float upper_clip;  // > 0: RELU_FWD with lower clip 0 and this upper clip
};
enum ActId { kRelu, kGelu, kGeluTanh, kSilu, kSigmoid, kTanh, kRelu6 };
const Act kActs[] = {
    {"relu", PwMode::RELU_FWD, relu, 0},
    {"gelu", PwMode::GELU_FWD,
     [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }, 0},
    {"gelu_tanh", PwMode::GELU_APPROX_TANH_FWD,
     [](double v) {
       return 0.5 * v *
              (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
     },
     0},
    {"silu", PwMode::SWISH_FWD, [](double v) { return v / (1 + std::exp(-v)); }, 0},
    {"sigmoid", PwMode::SIGMOID_FWD, [](double v) { return 1 / (1 + std::exp(-v)); }, 0},
    {"tanh", PwMode::TANH_FWD, [](double v) { return std::tanh(v); }, 0},
    {"relu6", PwMode::RELU_FWD, [](double v) { return std::min(relu(v), 6.0); }, 6},
};

TensorPtr act_op(Net& net, const TensorPtr& a, const Act& act) {
  auto attrs = fe::graph::Pointwise_attributes().set_mode(act.mode).set_compute_data_type(F32);
  if (act.upper_clip > 0) attrs.set_relu_lower_clip(0.f).set_relu_upper_clip(act.upper_clip);
  return net.g.pointwise(a, attrs);
}

// ---------------------------------------------------------------------------------------------
// The cases: one builder per graph; each sets net.reference.

struct Case;
using Builder = void (*)(Net&, const Case&, int64_t batch);
struct Case {
  std::string name;
  Builder build;
  Geo geo;            // batch geo.n for timing
  int variant = 0;    // builder-specific (ConvOp, ActId, order, ...)
  std::string plain;  // the plain-convolution case whose time is plain_us ("" = none)
  bool fallback_only = false;
  double wscale = 5;  // weights uniform in +-wscale / sqrt(fan-in)
};

Fill weights(const Case& c, int64_t fan_in) {
  const double a = c.wscale / std::sqrt(double(fan_in));
  return {-a, a};
}

void build_conv(Net& net, const Case& c, int64_t batch) {
  const Geo g = c.geo.with_n(batch);
  const auto io = net.io;
  switch (ConvOp(c.variant)) {
    case ConvOp::fprop: {
      auto x = net.in("x", g.x(), io);
      auto w = net.in("w", g.wt(), io, weights(c, g.c * g.r * g.s));
      net.out(net.g.conv_fprop(x, w, conv_attrs<fe::graph::Conv_fprop_attributes>(g)), "y", g.y(),
              io);
      net.reference = [g](Net& h) { h.e("y") = conv_ref(ConvOp::fprop, g, h.h("x"), h.h("w")); };
      break;
    }
    case ConvOp::dgrad: {
      auto dy = net.in("dy", g.y(), io);
      auto w = net.in("w", g.wt(), io, weights(c, g.k * g.r * g.s));
      net.out(net.g.conv_dgrad(dy, w, conv_attrs<fe::graph::Conv_dgrad_attributes>(g)), "dx", g.x(),
              io);
      net.reference = [g](Net& h) { h.e("dx") = conv_ref(ConvOp::dgrad, g, h.h("dy"), h.h("w")); };
      break;
    }
    case ConvOp::wgrad: {
      auto x = net.in("x", g.x(), io);
      auto dy = net.in("dy", g.y(), io);
      net.out(net.g.conv_wgrad(dy, x, conv_attrs<fe::graph::Conv_wgrad_attributes>(g)), "dw",
              g.wt(), io);
      net.reference = [g](Net& h) { h.e("dw") = conv_ref(ConvOp::wgrad, g, h.h("dy"), h.h("x")); };
      break;
    }
  }
}

// y = act(conv(x, w) + bias[1,K,1,1])
void build_conv_bias_act(Net& net, const Case& c, int64_t batch) {
  const Geo g = c.geo.with_n(batch);
  const Act* act = &kActs[c.variant];
  auto x = net.in("x", g.x(), net.io);
  auto w = net.in("w", g.wt(), net.io, weights(c, g.c * g.r * g.s));
  auto b = net.in("b", g.cy(), net.io);
  auto conv =
      net.virt(net.g.conv_fprop(x, w, conv_attrs<fe::graph::Conv_fprop_attributes>(g)), g.y());
  net.out(act_op(net, pw(net, conv, b, PwMode::ADD), *act), "y", g.y(), net.io);
  net.reference = [g, act](Net& h) {
    auto y = conv_ref(ConvOp::fprop, g, h.h("x"), h.h("w"));
    const auto& b = h.h("b");
    for (size_t i = 0; i < y.size(); ++i) y[i] = act->f(y[i] + b[i % size_t(g.k)]);
    h.e("y") = std::move(y);
  };
}

// y = relu((conv + bias) + z) (variant 0) or relu((conv + z) + bias) (variant 1)
void build_conv_bias_add_relu(Net& net, const Case& c, int64_t batch) {
  const Geo g = c.geo.with_n(batch);
  auto x = net.in("x", g.x(), net.io);
  auto w = net.in("w", g.wt(), net.io, weights(c, g.c * g.r * g.s));
  auto b = net.in("b", g.cy(), net.io);
  auto z = net.in("z", g.y(), net.io);
  auto conv =
      net.virt(net.g.conv_fprop(x, w, conv_attrs<fe::graph::Conv_fprop_attributes>(g)), g.y());
  auto t = c.variant == 0 ? pw(net, pw(net, conv, b, PwMode::ADD), z, PwMode::ADD)
                          : pw(net, pw(net, conv, z, PwMode::ADD), b, PwMode::ADD);
  net.out(pw(net, t, PwMode::RELU_FWD), "y", g.y(), net.io);
  net.reference = [g](Net& h) {
    auto y = conv_ref(ConvOp::fprop, g, h.h("x"), h.h("w"));
    const auto &b = h.h("b"), &z = h.h("z");
    for (size_t i = 0; i < y.size(); ++i) y[i] = relu(y[i] + b[i % size_t(g.k)] + z[i]);
    h.e("y") = std::move(y);
  };
}

void genstats_out(Net& net, const TensorPtr& y, const std::vector<int64_t>& cdims) {
  auto [sum, sq_sum] =
      net.g.genstats(y, fe::graph::Genstats_attributes().set_compute_data_type(F32));
  net.out(sum, "sum", cdims, F32);
  net.out(sq_sum, "sq_sum", cdims, F32);
}
void genstats_ref(Net& h, const std::vector<double>& y, int64_t C) {
  h.e("sum") = chan_sum(y.size(), C, [&](size_t i) { return y[i]; });
  h.e("sq_sum") = chan_sum(y.size(), C, [&](size_t i) { return y[i] * y[i]; });
}

// y = conv(x, w) written, and its per-channel sum and sum of squares
void build_conv_genstats(Net& net, const Case& c, int64_t batch) {
  const Geo g = c.geo.with_n(batch);
  auto x = net.in("x", g.x(), net.io);
  auto w = net.in("w", g.wt(), net.io, weights(c, g.c * g.r * g.s));
  auto y = net.g.conv_fprop(x, w, conv_attrs<fe::graph::Conv_fprop_attributes>(g));
  net.out(y, "y", g.y(), net.io);
  genstats_out(net, y, g.cy());
  net.reference = [g](Net& h) {
    auto y = conv_ref(ConvOp::fprop, g, h.h("x"), h.h("w"));
    genstats_ref(h, y, g.k);
    h.e("y") = std::move(y);
  };
}

// a = relu(x * scale + bias) (per channel of x), on the host
std::vector<double> sbr_ref(Net& h, const Geo& g, const char* x, const char* s, const char* b) {
  const auto &xv = h.h(x), &sv = h.h(s), &bv = h.h(b);
  std::vector<double> a(xv.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const size_t ch = i % size_t(g.c);
    a[i] = relu(xv[i] * sv[ch] + bv[ch]);
  }
  return a;
}

// SBRCS: y = conv(relu(x * scale + bias), w) written, genstats(y). variant 1: f32 scale/bias.
void build_sbrcs(Net& net, const Case& c, int64_t batch) {
  const Geo g = c.geo.with_n(batch);
  const auto sdt = c.variant == 1 ? F32 : net.io;
  auto x = net.in("x", g.x(), net.io);
  auto s = net.in("scale", g.cx(), sdt, {0.5, 1.5});
  auto b = net.in("bias", g.cx(), sdt, {-0.5, 0.5});
  auto a = pw(net, pw(net, pw(net, x, s, PwMode::MUL), b, PwMode::ADD), PwMode::RELU_FWD);
  auto w = net.in("w", g.wt(), net.io, weights(c, g.c * g.r * g.s));
  auto y = net.g.conv_fprop(a, w, conv_attrs<fe::graph::Conv_fprop_attributes>(g));
  net.out(y, "y", g.y(), net.io);
  genstats_out(net, y, g.cy());
  net.reference = [g](Net& h) {
    auto y = conv_ref(ConvOp::fprop, g, sbr_ref(h, g, "x", "scale", "bias"), h.h("w"));
    genstats_ref(h, y, g.k);
    h.e("y") = std::move(y);
  };
}

// bn_finalize: sum, sq_sum over N*H*W -> eq_scale, eq_bias, mean, inv_var, running stats.
void build_bn_finalize(Net& net, const Case& c, int64_t batch) {
  const Geo g = c.geo.with_n(batch);
  const int64_t cnt = g.n * g.h * g.w;
  const double cn = double(cnt);
  auto in = [&](const char* name, Fill f) { return net.in(name, g.cx(), F32, f); };
  auto sum = in("sum", {-0.5 * cn, 0.5 * cn});       // mean in [-0.5, 0.5]
  auto sq_sum = in("sq_sum", {0.5 * cn, 1.5 * cn});  // E[x^2] in [0.5, 1.5] > mean^2
  auto scale = in("scale", {0.5, 1.5});
  auto bias = in("bias", {-1, 1});
  auto prev_mean = in("prev_mean", {-1, 1});
  auto prev_var = in("prev_var", {0.5, 1.5});
  auto eps = net.g.tensor(fe::graph::Tensor_attributes(float(kEps)));
  auto momentum = net.g.tensor(fe::graph::Tensor_attributes(float(kMomentum)));
  auto count = net.g.tensor(fe::graph::Tensor_attributes(int64_t(cnt)));
  auto attrs =
      fe::graph::BN_finalize_attributes().set_previous_running_stats(prev_mean, prev_var, momentum);
  auto outs = net.g.bn_finalize(sum, sq_sum, scale, bias, eps, count, attrs);
  const char* names[] = {"eq_scale", "eq_bias", "mean", "inv_var", "next_mean", "next_var"};
  for (int i = 0; i < 6; ++i) net.out(outs[i], names[i], g.cx(), F32);
  net.reference = [cn](Net& h) {
    const auto &sum = h.h("sum"), &sq = h.h("sq_sum"), &scale = h.h("scale"), &bias = h.h("bias"),
               &pm = h.h("prev_mean"), &pv = h.h("prev_var");
    auto &es = h.e("eq_scale"), &eb = h.e("eq_bias"), &m = h.e("mean"), &iv = h.e("inv_var"),
         &nm = h.e("next_mean"), &nv = h.e("next_var");
    for (size_t i = 0; i < sum.size(); ++i) {
      m[i] = sum[i] / cn;
      const double var = sq[i] / cn - m[i] * m[i];
      iv[i] = 1 / std::sqrt(var + kEps);
      es[i] = scale[i] * iv[i];
      eb[i] = bias[i] - m[i] * es[i];
      nm[i] = (1 - kMomentum) * pm[i] + kMomentum * m[i];
      nv[i] = (1 - kMomentum) * pv[i] + kMomentum * var * cn / (cn - 1);
    }
  };
}

// DSBAR: y = relu(x * s1 + b1 + (z * s2 + b2)) (variant 0) or relu(x * s1 + b1 + z) (variant 1)
void build_dsbar(Net& net, const Case& c, int64_t batch) {
  const Geo g = c.geo.with_n(batch);
  const bool two = c.variant == 0;
  auto x = net.in("x", g.x(), net.io);
  auto z = net.in("z", g.x(), net.io);
  auto s1 = net.in("s1", g.cx(), F32, {0.5, 1.5});
  auto b1 = net.in("b1", g.cx(), F32, {-0.5, 0.5});
  auto t = pw(net, pw(net, x, s1, PwMode::MUL), b1, PwMode::ADD);
  if (two) {
    auto s2 = net.in("s2", g.cx(), F32, {0.5, 1.5});
    auto b2 = net.in("b2", g.cx(), F32, {-0.5, 0.5});
    t = pw(net, t, pw(net, pw(net, z, s2, PwMode::MUL), b2, PwMode::ADD), PwMode::ADD);
  } else {
    t = pw(net, t, z, PwMode::ADD);
  }
  net.out(pw(net, t, PwMode::RELU_FWD), "y", g.x(), net.io);
  net.reference = [g, two](Net& h) {
    const auto &x = h.h("x"), &z = h.h("z"), &s1 = h.h("s1"), &b1 = h.h("b1");
    auto& y = h.e("y");
    for (size_t i = 0; i < y.size(); ++i) {
      const size_t ch = i % size_t(g.c);
      const double zz = two ? z[i] * h.find("s2").host[ch] + h.find("b2").host[ch] : z[i];
      y[i] = relu(x[i] * s1[ch] + b1[ch] + zz);
    }
  };
}

// dx = RELU_BWD(conv_dgrad(dy, w), act): dgrad where the forward relu input act > 0, else 0
void build_dgrad_drelu(Net& net, const Case& c, int64_t batch) {
  const Geo g = c.geo.with_n(batch);
  auto dy = net.in("dy", g.y(), net.io);
  auto w = net.in("w", g.wt(), net.io, weights(c, g.k * g.r * g.s));
  auto dg =
      net.virt(net.g.conv_dgrad(dy, w, conv_attrs<fe::graph::Conv_dgrad_attributes>(g)), g.x());
  auto act = net.in("act", g.x(), net.io);
  net.out(pw(net, dg, act, PwMode::RELU_BWD), "dx", g.x(), net.io);
  net.reference = [g](Net& h) {
    auto d = conv_ref(ConvOp::dgrad, g, h.h("dy"), h.h("w"));
    const auto& act = h.h("act");
    for (size_t i = 0; i < d.size(); ++i) d[i] = act[i] > 0 ? d[i] : 0;
    h.e("dx") = std::move(d);
  };
}

// dbn_weight on the host: the per-channel outputs for dx = eq_scale_dy*dy + eq_scale_x*x + eq_bias.
void dbn_weight_ref(Net& h, const std::vector<double>& dy, int64_t C) {
  const auto &x = h.h("x"), &mean = h.h("mean"), &inv = h.h("inv_var"), &scale = h.h("scale");
  const double cnt = double(dy.size() / size_t(C));
  auto db = chan_sum(dy.size(), C, [&](size_t i) { return dy[i]; });
  auto ds = chan_sum(dy.size(), C, [&](size_t i) {
    const size_t ch = i % size_t(C);
    return dy[i] * (x[i] - mean[ch]) * inv[ch];
  });
  auto &eq_dy = h.e("eq_scale_dy"), &eq_x = h.e("eq_scale_x"), &eq_b = h.e("eq_bias");
  for (int64_t ch = 0; ch < C; ++ch) {
    const double a = scale[ch] * inv[ch], b = -a * inv[ch] * ds[ch] / cnt;
    eq_dy[ch] = a;
    eq_x[ch] = b;
    eq_b[ch] = -a * db[ch] / cnt - b * mean[ch];
  }
  h.e("dscale") = std::move(ds);
  h.e("dbias") = std::move(db);
}

void dbn_weight_out(Net& net, const TensorPtr& dy, const TensorPtr& x, const TensorPtr& mean,
                    const TensorPtr& inv, const TensorPtr& scale,
                    const std::vector<int64_t>& cdims) {
  auto outs = net.g.dbn_weight(dy, x, mean, inv, scale, fe::graph::DBN_weight_attributes());
  const char* names[] = {"dscale", "dbias", "eq_scale_dy", "eq_scale_x", "eq_bias"};
  for (int i = 0; i < 5; ++i) net.out(outs[i], names[i], cdims, F32);
}

// dgrad -> RELU_BWD against the recomputed BN output (x -/+ mean) * inv_var * scale + bias
// (written: drelu) -> dbn_weight(drelu, x, mean, inv_var, scale). variant 0: SUB, 1: ADD (sample)
void build_dgrad_drelu_dbnw(Net& net, const Case& c, int64_t batch) {
  const Geo g = c.geo.with_n(batch);
  const double sign = c.variant == 0 ? -1 : 1;
  auto dy = net.in("dy", g.y(), net.io);
  auto w = net.in("w", g.wt(), net.io, weights(c, g.k * g.r * g.s));
  auto dg =
      net.virt(net.g.conv_dgrad(dy, w, conv_attrs<fe::graph::Conv_dgrad_attributes>(g)), g.x());
  auto x = net.in("x", g.x(), net.io);
  auto mean = net.in("mean", g.cx(), F32, {-0.5, 0.5});
  auto inv = net.in("inv_var", g.cx(), F32, {0.5, 1.5});
  auto scale = net.in("scale", g.cx(), F32, {0.5, 1.5});
  auto bias = net.in("bias", g.cx(), F32, {-0.5, 0.5});
  auto t = pw(net, x, mean, c.variant == 0 ? PwMode::SUB : PwMode::ADD);
  t = pw(net, pw(net, pw(net, t, inv, PwMode::MUL), scale, PwMode::MUL), bias, PwMode::ADD);
  auto drelu = pw(net, dg, t, PwMode::RELU_BWD);
  net.out(drelu, "drelu", g.x(), net.io);
  dbn_weight_out(net, drelu, x, mean, inv, scale, g.cx());
  net.reference = [g, sign](Net& h) {
    auto d = conv_ref(ConvOp::dgrad, g, h.h("dy"), h.h("w"));
    const auto &x = h.h("x"), &mean = h.h("mean"), &inv = h.h("inv_var"), &scale = h.h("scale"),
               &bias = h.h("bias");
    for (size_t i = 0; i < d.size(); ++i) {
      const size_t ch = i % size_t(g.c);
      const double a = (x[i] + sign * mean[ch]) * inv[ch] * scale[ch] + bias[ch];
      d[i] = a > 0 ? d[i] : 0;
    }
    dbn_weight_ref(h, d, g.c);
    h.e("drelu") = std::move(d);
  };
}

void build_dbn_weight(Net& net, const Case& c, int64_t batch) {
  const Geo g = c.geo.with_n(batch);
  auto dy = net.in("dy", g.x(), net.io);
  auto x = net.in("x", g.x(), net.io);
  auto mean = net.in("mean", g.cx(), F32, {-0.5, 0.5});
  auto inv = net.in("inv_var", g.cx(), F32, {0.5, 1.5});
  auto scale = net.in("scale", g.cx(), F32, {0.5, 1.5});
  dbn_weight_out(net, dy, x, mean, inv, scale, g.cx());
  net.reference = [g](Net& h) { dbn_weight_ref(h, h.h("dy"), g.c); };
}

// dw = conv_wgrad(dy, relu(x * scale + bias))
void build_wgrad_sbr(Net& net, const Case& c, int64_t batch) {
  const Geo g = c.geo.with_n(batch);
  auto x = net.in("x", g.x(), net.io);
  auto s = net.in("scale", g.cx(), net.io, {0.5, 1.5});
  auto b = net.in("bias", g.cx(), net.io, {-0.5, 0.5});
  auto a = pw(net, pw(net, pw(net, x, s, PwMode::MUL), b, PwMode::ADD), PwMode::RELU_FWD);
  auto dy = net.in("dy", g.y(), net.io);
  net.out(net.g.conv_wgrad(dy, a, conv_attrs<fe::graph::Conv_wgrad_attributes>(g)), "dw", g.wt(),
          net.io);
  net.reference = [g](Net& h) {
    h.e("dw") = conv_ref(ConvOp::wgrad, g, h.h("dy"), sbr_ref(h, g, "x", "scale", "bias"));
  };
}

// batchnorm (training, running stats): y = bn(x) (variant 0) or relu(bn(x) + z) (variant 1)
void build_bn_train(Net& net, const Case& c, int64_t batch) {
  const Geo g = c.geo.with_n(batch);
  const bool add_relu = c.variant == 1;
  auto x = net.in("x", g.x(), net.io, {-0.5, 1.5});
  auto scale = net.in("scale", g.cx(), F32, {0.5, 1.5});
  auto bias = net.in("bias", g.cx(), F32, {-0.5, 0.5});
  auto prev_mean = net.in("prev_mean", g.cx(), F32, {-1, 1});
  auto prev_var = net.in("prev_var", g.cx(), F32, {0.5, 1.5});
  auto eps = net.g.tensor(fe::graph::Tensor_attributes(float(kEps)));
  auto momentum = net.g.tensor(fe::graph::Tensor_attributes(float(kMomentum)));
  auto attrs = fe::graph::Batchnorm_attributes().set_epsilon(eps).set_previous_running_stats(
      prev_mean, prev_var, momentum);
  auto [y, mean, inv, next_mean, next_var] = net.g.batchnorm(x, scale, bias, attrs);
  net.out(mean, "mean", g.cx(), F32);
  net.out(inv, "inv_var", g.cx(), F32);
  net.out(next_mean, "next_mean", g.cx(), F32);
  net.out(next_var, "next_var", g.cx(), F32);
  if (add_relu) {
    auto z = net.in("z", g.x(), net.io);
    net.out(pw(net, pw(net, y, z, PwMode::ADD), PwMode::RELU_FWD), "y", g.x(), net.io);
  } else {
    net.out(y, "y", g.x(), net.io);
  }
  net.reference = [g, add_relu](Net& h) {
    const auto &x = h.h("x"), &scale = h.h("scale"), &bias = h.h("bias"), &pm = h.h("prev_mean"),
               &pv = h.h("prev_var");
    const size_t C = size_t(g.c);
    const double cnt = double(x.size() / C);
    auto m = chan_sum(x.size(), g.c, [&](size_t i) { return x[i] / cnt; });
    auto var = chan_sum(x.size(), g.c, [&](size_t i) {
      const double d = x[i] - m[i % C];
      return d * d / cnt;
    });
    auto &iv = h.e("inv_var"), &nm = h.e("next_mean"), &nv = h.e("next_var");
    for (size_t ch = 0; ch < C; ++ch) {
      iv[ch] = 1 / std::sqrt(var[ch] + kEps);
      nm[ch] = (1 - kMomentum) * pm[ch] + kMomentum * m[ch];
      nv[ch] = (1 - kMomentum) * pv[ch] + kMomentum * var[ch] * cnt / (cnt - 1);
    }
    auto& y = h.e("y");
    for (size_t i = 0; i < y.size(); ++i) {
      const size_t ch = i % C;
      y[i] = (x[i] - m[ch]) * iv[ch] * scale[ch] + bias[ch];
      if (add_relu) y[i] = relu(y[i] + h.find("z").host[i]);
    }
    h.e("mean") = std::move(m);
  };
}

// batchnorm_backward with saved mean / inv_var. variant 1: dy masked by RELU_BWD against a
// saved activation, variant 2: dy * BOOLEAN mask (the sample); both write the masked dy (dAdd).
void build_bn_bwd(Net& net, const Case& c, int64_t batch) {
  const Geo g = c.geo.with_n(batch);
  const int variant = c.variant;
  auto dy = net.in("dy", g.x(), net.io);
  auto x = net.in("x", g.x(), net.io, {-0.5, 1.5});
  auto scale = net.in("scale", g.cx(), F32, {0.5, 1.5});
  auto mean = net.in("mean", g.cx(), F32, {0, 1});
  auto inv = net.in("inv_var", g.cx(), F32, {0.5, 1.5});
  TensorPtr grad = dy;
  if (variant == 1) {
    grad = pw(net, dy, net.in("act", g.x(), net.io), PwMode::RELU_BWD);
    net.out(grad, "dadd", g.x(), net.io);
  } else if (variant == 2) {
    grad = pw(net, dy, net.in("mask", g.x(), fe::DataType_t::BOOLEAN), PwMode::MUL);
    net.out(grad, "dadd", g.x(), net.io);
  }
  auto attrs =
      fe::graph::Batchnorm_backward_attributes().set_saved_mean_and_inv_variance(mean, inv);
  auto [dx, dscale, dbias] = net.g.batchnorm_backward(grad, x, scale, attrs);
  net.out(dx, "dx", g.x(), net.io);
  net.out(dscale, "dscale", g.cx(), F32);
  net.out(dbias, "dbias", g.cx(), F32);
  net.reference = [g, variant](Net& h) {
    std::vector<double> d = h.h("dy");
    if (variant != 0) {
      const auto& m = h.h(variant == 1 ? "act" : "mask");
      for (size_t i = 0; i < d.size(); ++i) d[i] = m[i] > 0 ? d[i] : 0;
      h.e("dadd") = d;
    }
    const auto &x = h.h("x"), &scale = h.h("scale"), &mean = h.h("mean"), &inv = h.h("inv_var");
    const size_t C = size_t(g.c);
    const double cnt = double(d.size() / C);
    auto xhat = [&](size_t i) { return (x[i] - mean[i % C]) * inv[i % C]; };
    auto db = chan_sum(d.size(), g.c, [&](size_t i) { return d[i]; });
    auto ds = chan_sum(d.size(), g.c, [&](size_t i) { return d[i] * xhat(i); });
    auto& dx = h.e("dx");
    for (size_t i = 0; i < dx.size(); ++i) {
      const size_t ch = i % C;
      dx[i] = scale[ch] * inv[ch] * (d[i] - db[ch] / cnt - xhat(i) * ds[ch] / cnt);
    }
    h.e("dscale") = std::move(ds);
    h.e("dbias") = std::move(db);
  };
}

std::vector<Case> make_cases() {
  const Geo anchor{64, 64, 56, 56, 256};
  const Geo c64k256{256, 64, 56, 56, 256}, c512k2048{256, 512, 7, 7, 2048},
      c128k512{256, 128, 28, 28, 512}, c256k1024{256, 256, 14, 14, 1024},
      c256k64{256, 256, 56, 56, 64}, k3x3{256, 64, 56, 56, 64, 3, 3, 1};
  const Geo bn256{256, 256, 56, 56}, bn64{256, 64, 56, 56};
  std::vector<Case> cs;
  // 13. Plain convolutions (first: the fused cases take their plain_us from these).
  auto plain = [&](const char* op, ConvOp o, const Geo& g) {
    cs.push_back({std::string("plain_conv_") + op + "." + g.tag(), build_conv, g, int(o)});
    return cs.back().name;
  };
  const std::string p_anchor = plain("fprop", ConvOp::fprop, anchor);
  const std::string p_64_256 = plain("fprop", ConvOp::fprop, c64k256);
  const std::string p_512 = plain("fprop", ConvOp::fprop, c512k2048);
  const std::string p_128 = plain("fprop", ConvOp::fprop, c128k512);
  const std::string p_256 = plain("fprop", ConvOp::fprop, c256k1024);
  const std::string p_3x3 = plain("fprop", ConvOp::fprop, k3x3);
  const std::string p_256_64 = plain("fprop", ConvOp::fprop, c256k64);
  const std::string p_dgrad = plain("dgrad", ConvOp::dgrad, c64k256);
  const std::string p_wgrad = plain("wgrad", ConvOp::wgrad, k3x3);
  // 1. The anchor.
  cs.push_back({"conv_bias_relu." + anchor.tag(), build_conv_bias_act, anchor, kRelu, p_anchor});
  // 2. ResNet-50 block end, both orders.
  const std::pair<Geo, std::string> block_ends[] = {
      {c64k256, p_64_256}, {c512k2048, p_512}, {c128k512, p_128}, {c256k1024, p_256}};
  for (const auto& [g, p] : block_ends) {
    cs.push_back(
        {"conv_bias_add_relu." + g.tag() + ".bias_then_z", build_conv_bias_add_relu, g, 0, p});
    cs.push_back(
        {"conv_bias_add_relu." + g.tag() + ".z_then_bias", build_conv_bias_add_relu, g, 1, p});
  }
  // 3. conv + bias + activation.
  for (int a : {kGelu, kGeluTanh, kSilu, kSigmoid, kTanh, kRelu6}) {
    Case c{"conv_bias_act." + k3x3.tag() + "." + kActs[a].name, build_conv_bias_act, k3x3, a,
           p_3x3};
    if (a == kRelu6) c.wscale = 15;  // outputs of std ~5, so that the clip at 6 is reached
    cs.push_back(c);
  }
  // 4.-5. Statistics in the convolution's epilogue.
  cs.push_back({"conv_genstats." + k3x3.tag(), build_conv_genstats, k3x3, 0, p_3x3});
  cs.push_back({"sbrcs." + c256k64.tag(), build_sbrcs, c256k64, 0, p_256_64});
  cs.push_back({"sbrcs." + k3x3.tag(), build_sbrcs, k3x3, 0, p_3x3});
  cs.push_back({"sbrcs." + k3x3.tag() + ".f32sb", build_sbrcs, k3x3, 1, p_3x3});
  // 6.-7. BN finalize, DSBAR.
  cs.push_back({"bn_finalize.c256", build_bn_finalize, bn256, 0, "", true});
  cs.push_back({"dsbar." + bn256.tag() + ".two_branch", build_dsbar, bn256, 0});
  cs.push_back({"dsbar." + bn256.tag() + ".one_branch", build_dsbar, bn256, 1});
  // 8.-10. Backward convolutions with fused pointwise / dbn_weight.
  cs.push_back({"dgrad_drelu.1x1_k256c64_56", build_dgrad_drelu, c64k256, 0, p_dgrad});
  cs.push_back(
      {"dgrad_drelu_dbnweight.1x1_k256c64_56.sub", build_dgrad_drelu_dbnw, c64k256, 0, p_dgrad});
  cs.push_back({"dgrad_drelu_dbnweight.1x1_k256c64_56.add_as_sample", build_dgrad_drelu_dbnw,
                c64k256, 1, p_dgrad});
  cs.push_back({"dbn_weight." + bn64.tag(), build_dbn_weight, bn64, 0});
  cs.push_back({"wgrad_sbr." + k3x3.tag(), build_wgrad_sbr, k3x3, 0, p_wgrad});
  // 11.-12. Batch norm forward (training) and backward.
  cs.push_back({"batchnorm_fwd_train." + bn256.tag(), build_bn_train, bn256, 0});
  cs.push_back({"batchnorm_add_relu." + bn256.tag(), build_bn_train, bn256, 1});
  cs.push_back({"batchnorm_bwd." + bn256.tag(), build_bn_bwd, bn256, 0});
  cs.push_back({"dbn_drelu_dadd." + bn256.tag(), build_bn_bwd, bn256, 1});
  cs.push_back({"dbn_mask_dadd." + bn256.tag(), build_bn_bwd, bn256, 2});
  return cs;
}

// ---------------------------------------------------------------------------------------------
// The runner.

struct Options {
  std::vector<std::string> filters;  // substrings; a case runs when it contains one
  std::vector<fe::DataType_t> dtypes{fe::DataType_t::BFLOAT16, fe::DataType_t::HALF};
  int iters = 25, warmup = 5;
  int64_t check_n = 2;
  bool check = true, list = false;
};

struct Ctx {
  Options opt;
  const std::vector<Case>* cases = nullptr;
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  std::mt19937_64 rng{20261124};
  std::string stage;
  std::map<std::string, double> plain_us;  // "case.dtype" -> us (< 0: unsupported)
};

struct Result {
  bool supported = false;
  std::string stage, msg;
  int64_t engines = 0, ws = 0;
  std::string plan = "?";
  double build_ms = 0, us = -1, err = 0;
  bool native = false;
  int ok = -1;  // -1: not checked
  std::string worst = "-", check_msg;
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// validate, operation graph, heuristics, support check, first plan that builds.
void make_plan(Ctx& ctx, Net& net, const Case& c, Result& r) {
  const auto t0 = std::chrono::steady_clock::now();
  ctx.stage = "validate";
  check_fe(net.g.validate());
  ctx.stage = "build_operation_graph";
  check_fe(net.g.build_operation_graph(ctx.handle));
  ctx.stage = "heuristics";
  std::vector<fe::HeurMode_t> modes{fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK};
  if (c.fallback_only) modes = {fe::HeurMode_t::FALLBACK};
  check_fe(net.g.create_execution_plans(modes));
  r.engines = net.g.get_execution_plan_count();
  net.g.deselect_numeric_notes({fe::NumericalNote_t::DOWN_CONVERT_INPUTS});
  ctx.stage = "check_support";
  check_fe(net.g.check_support());
  ctx.stage = "build_plans";
  const fe::error_t status = net.g.build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
  if (status.is_bad()) {
    bool built = false;
    for (int64_t i = 0; i < r.engines && !built; ++i)
      built = net.g.build_plan_at_index(i).is_good();
    if (!built) check_fe(status);
  }
  r.build_ms = ms_since(t0);
  if (net.g.get_plan_name(r.plan).is_bad()) r.plan = "?";
  check_fe(net.g.get_workspace_size(r.ws));
  std::vector<fe::BehaviorNote_t> notes;
  r.native = net.g.get_behavior_notes(notes).is_good() &&
             std::find(notes.begin(), notes.end(),
                       fe::BehaviorNote_t::SUPPORTS_CUDA_GRAPH_NATIVE_API) != notes.end();
}

// Allocates every user tensor; outputs get NaN bytes, inputs random values in their range
// (all of them when keep_host, kept on the host; else a random tile repeated on the device).
void upload(Ctx& ctx, Net& net, bool keep_host) {
  constexpr int64_t kTile = (1 << 20) - 8;  // elements; a multiple of 8 (packed booleans)
  for (auto& bp : net.bufs) {
    Buffer& b = *bp;
    const size_t bytes = bytes_of(b.dt, b.count);
    b.dev = std::make_unique<DevMem>(bytes);
    if (b.output) {
      CK(cudaMemset(b.dev->p, 0xFF, bytes));
      continue;
    }
    std::vector<double> v(size_t(keep_host ? b.count : std::min(b.count, kTile)));
    std::uniform_real_distribution<double> u(b.fill.lo, b.fill.hi);
    for (double& x : v) x = b.dt == fe::DataType_t::BOOLEAN ? double(ctx.rng() & 1) : u(ctx.rng);
    const std::vector<uint8_t> packed = pack(b.dt, v);
    CK(cudaMemcpy(b.dev->p, packed.data(), packed.size(), cudaMemcpyHostToDevice));
    auto* d = static_cast<uint8_t*>(b.dev->p);
    for (size_t filled = packed.size(); filled < bytes;) {
      const size_t n = std::min(filled, bytes - filled);
      CK(cudaMemcpy(d + filled, d, n, cudaMemcpyDeviceToDevice));
      filled += n;
    }
    if (keep_host) b.host = unpack(b.dt, packed, b.count);
  }
  CK(cudaDeviceSynchronize());
}

VariantPack variant_pack(Net& net) {
  VariantPack pack;
  for (auto& b : net.bufs) pack[b->t] = b->dev->p;
  return pack;
}

struct Events {  // create() after construction, so that a failure still destroys the rest
  std::vector<cudaEvent_t> ev;
  explicit Events(size_t n) : ev(n, nullptr) {}
  void create() {
    for (auto& e : ev) CK(cudaEventCreate(&e));
  }
  ~Events() {
    for (auto e : ev)
      if (e != nullptr) warn_cuda(cudaEventDestroy(e), "cudaEventDestroy");
  }
};

// Median GPU time of one execute (us), each run between its own pair of events.
double time_plan(Ctx& ctx, Net& net, VariantPack& pack, void* ws) {
  for (int i = 0; i < ctx.opt.warmup; ++i) check_fe(net.g.execute(ctx.handle, pack, ws));
  const int iters = std::max(ctx.opt.iters, 1);
  Events events(2 * size_t(iters));
  events.create();
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(events.ev[2 * i], ctx.stream));
    check_fe(net.g.execute(ctx.handle, pack, ws));
    CK(cudaEventRecord(events.ev[2 * i + 1], ctx.stream));
  }
  CK(cudaStreamSynchronize(ctx.stream));
  std::vector<double> us(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, events.ev[2 * i], events.ev[2 * i + 1]));
    us[size_t(i)] = 1000.0 * ms;
  }
  std::sort(us.begin(), us.end());
  return iters % 2 ? us[iters / 2] : 0.5 * (us[iters / 2 - 1] + us[iters / 2]);
}

// The same graph at batch check_n, run once, every output against the host reference.
void check_numerics(Ctx& ctx, const Case& c, fe::DataType_t io, Result& r) {
  auto net = std::make_unique<Net>(io);
  ctx.stage = "validate";
  c.build(*net, c, ctx.opt.check_n);
  Result plan;
  make_plan(ctx, *net, c, plan);
  ctx.stage = "execute";
  upload(ctx, *net, true);
  DevMem ws(size_t(plan.ws));
  VariantPack pack = variant_pack(*net);
  check_fe(net->g.execute(ctx.handle, pack, ws.p));
  CK(cudaStreamSynchronize(ctx.stream));
  ctx.stage = "reference";
  net->reference(*net);
  r.err = 0;
  for (auto& bp : net->bufs) {
    const Buffer& b = *bp;
    if (!b.output) continue;
    std::vector<uint8_t> bytes(bytes_of(b.dt, b.count));
    CK(cudaMemcpy(bytes.data(), b.dev->p, bytes.size(), cudaMemcpyDeviceToHost));
    const std::vector<double> got = unpack(b.dt, bytes, b.count);
    double err = std::numeric_limits<double>::infinity();
    if (b.expect.size() == got.size()) {
      double max_ref = 0, max_diff = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        max_ref = std::max(max_ref, std::abs(b.expect[i]));
        const double diff = std::abs(got[i] - b.expect[i]);
        max_diff = std::isfinite(diff) ? std::max(max_diff, diff)
                                       : std::numeric_limits<double>::infinity();
      }
      err = max_diff / std::max(max_ref, 1e-30);
    }
    if (r.worst == "-" || err > r.err) r.err = err, r.worst = b.name;
  }
  const double tol = io == fe::DataType_t::BFLOAT16 ? 2e-2 : 1e-2;
  r.ok = r.err <= tol ? 1 : 0;
}

Result run_case(Ctx& ctx, const Case& c, fe::DataType_t io, bool check) {
  Result r;
  const cudaError_t pending = cudaGetLastError();  // clears an earlier non-sticky error
  if (pending != cudaSuccess) {
    std::fprintf(stderr, "# note: CUDA error pending before %s: %s\n", c.name.c_str(),
                 cudaGetErrorString(pending));
  }
  try {
    auto net = std::make_unique<Net>(io);
    ctx.stage = "validate";  // graph construction counts as validation
    c.build(*net, c, c.geo.n);
    make_plan(ctx, *net, c, r);
    ctx.stage = "execute";
    upload(ctx, *net, false);
    DevMem ws(size_t(r.ws));
    VariantPack pack = variant_pack(*net);
    check_fe(net->g.execute(ctx.handle, pack, ws.p));
    CK(cudaStreamSynchronize(ctx.stream));
    r.us = time_plan(ctx, *net, pack, ws.p);
    r.supported = true;
  } catch (const std::exception& e) {
    r.stage = ctx.stage, r.msg = one_line(e.what());
    return r;
  } catch (...) {
    r.stage = ctx.stage, r.msg = "unknown exception";
    return r;
  }
  if (check) {
    try {
      check_numerics(ctx, c, io, r);
    } catch (const std::exception& e) {
      r.ok = -1, r.check_msg = ctx.stage + ": " + one_line(e.what());
    } catch (...) {
      r.ok = -1, r.check_msg = ctx.stage + ": unknown exception";
    }
  }
  return r;
}

// plain_us of a fused case: its plain convolution's time, timed now if it was filtered out.
std::string plain_time(Ctx& ctx, const Case& c, fe::DataType_t io) {
  if (c.plain.empty()) return "-";
  const std::string key = c.plain + "." + dt_name(io);
  auto it = ctx.plain_us.find(key);
  if (it == ctx.plain_us.end()) {
    for (const Case& p : *ctx.cases) {
      if (p.name != c.plain) continue;
      const Result r = run_case(ctx, p, io, false);
      it = ctx.plain_us.emplace(key, r.supported ? r.us : -1).first;
    }
    if (it == ctx.plain_us.end()) return "?";
  }
  if (it->second < 0) return "unsupported";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", it->second);
  return buf;
}

void print(const std::string& name, const Result& r, const std::string& plain) {
  if (!r.supported) {
    std::printf("CASE %s | supported=0 stage=%s msg=%s\n", name.c_str(), r.stage.c_str(),
                r.msg.c_str());
  } else {
    char err[32] = "-";
    if (r.ok >= 0) std::snprintf(err, sizeof err, "%.2e", r.err);
    std::printf(
        "CASE %s | supported=1 engines=%lld plan=%s build_ms=%.1f ws=%lld native_cg=%d us=%.2f "
        "plain_us=%s ok=%s err=%s worst=%s%s%s\n",
        name.c_str(), (long long)r.engines, r.plan.c_str(), r.build_ms, (long long)r.ws,
        r.native ? 1 : 0, r.us, plain.c_str(), r.ok < 0 ? "-" : std::to_string(r.ok).c_str(), err,
        r.ok < 0 ? "-" : r.worst.c_str(),
        r.check_msg.empty() ? "" : " check=", r.check_msg.c_str());
  }
  std::fflush(stdout);
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--filter a,b] [--dtype bf16|f16|both] [--iters N] [--warmup N] "
               "[--check-n N] [--no-check] [--list]\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--filter" && has_value) {
      std::string s = argv[++i];
      for (size_t pos = 0; pos <= s.size();) {
        const size_t comma = std::min(s.find(',', pos), s.size());
        if (comma > pos) opt.filters.push_back(s.substr(pos, comma - pos));
        pos = comma + 1;
      }
    } else if (a == "--dtype" && has_value) {
      const std::string d = argv[++i];
      if (d == "bf16")
        opt.dtypes = {fe::DataType_t::BFLOAT16};
      else if (d == "f16")
        opt.dtypes = {fe::DataType_t::HALF};
      else if (d != "both")
        return usage(argv[0]);
    } else if (a == "--iters" && has_value) {
      opt.iters = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--warmup" && has_value) {
      opt.warmup = std::max(0, std::atoi(argv[++i]));
    } else if (a == "--check-n" && has_value) {
      opt.check_n = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--no-check") {
      opt.check = false;
    } else if (a == "--list") {
      opt.list = true;
    } else {
      return usage(argv[0]);
    }
  }
  const std::vector<Case> cases = make_cases();
  auto selected = [&](const Case& c) {
    if (opt.filters.empty()) return true;
    for (const auto& f : opt.filters)
      if (c.name.find(f) != std::string::npos) return true;
    return false;
  };
  if (opt.list) {
    for (const Case& c : cases)
      if (selected(c)) std::printf("%s\n", c.name.c_str());
    return 0;
  }
  Ctx ctx;
  ctx.opt = opt;
  ctx.cases = &cases;
  try {
    int devices = 0;
    CK(cudaGetDeviceCount(&devices));
    CK(cudaSetDevice(0));
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    int runtime = 0, driver = 0;
    CK(cudaRuntimeGetVersion(&runtime));
    CK(cudaDriverGetVersion(&driver));
    std::printf("# device: %s (sm_%d%d, %d SMs, %.1f GiB), CUDA runtime %d, driver %d\n", prop.name,
                prop.major, prop.minor, prop.multiProcessorCount,
                double(prop.totalGlobalMem) / (1 << 30), runtime, driver);
    std::printf("# cudnn: runtime %zu (cudnnGetVersion), headers %d\n", cudnnGetVersion(),
                CUDNN_VERSION);
    std::printf("# cudnn-frontend: %d.%d.%d\n", CUDNN_FRONTEND_MAJOR_VERSION,
                CUDNN_FRONTEND_MINOR_VERSION, CUDNN_FRONTEND_PATCH_VERSION);
    std::printf(
        "# policy: heuristics A+FALLBACK (bn_finalize: FALLBACK), DOWN_CONVERT_INPUTS deselected, "
        "first "
        "plan that builds; us = median of %d executes after %d warm-ups (CUDA events); check at "
        "N=%lld "
        "against a host f64 reference, tol bf16 2e-2 / f16 1e-2 of max|ref|\n",
        opt.iters, opt.warmup, (long long)opt.check_n);
    std::fflush(stdout);
    check_cudnn(cudnnCreate(&ctx.handle), "cudnnCreate");
    CK(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
    check_cudnn(cudnnSetStream(ctx.handle, ctx.stream), "cudnnSetStream");
  } catch (const std::exception& e) {
    std::printf("# fatal: %s\n", one_line(e.what()).c_str());
    return 1;
  }
  for (const Case& c : cases) {
    if (!selected(c)) continue;
    for (fe::DataType_t io : opt.dtypes) {
      const std::string name = c.name + "." + dt_name(io);
      std::fprintf(stderr, "# running %s\n", name.c_str());  // names the case if cuDNN crashes
      const Result r = run_case(ctx, c, io, opt.check);
      if (c.build == build_conv && c.plain.empty()) ctx.plain_us[name] = r.supported ? r.us : -1;
      print(name, r, plain_time(ctx, c, io));
    }
  }
  const cudnnStatus_t s = cudnnDestroy(ctx.handle);
  if (s != CUDNN_STATUS_SUCCESS)
    std::fprintf(stderr, "# warning: cudnnDestroy: %s\n", cudnnGetErrorString(s));
  warn_cuda(cudaStreamDestroy(ctx.stream), "cudaStreamDestroy");
  return 0;
}
