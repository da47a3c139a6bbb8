// 3x3 stride-1 convolutions as Winograd F(4x4, 3x3) (Lavin and Gray, 2015): each 4 x 4 block of
// outputs of a channel pair is the 6 x 6 tile of inputs under it, transformed, multiplied
// point by point with the transformed filter, and transformed back. Over C input and K output
// channels the 36 points are 36 independent products:
//
//   1. input transform   V[p][t][c] = (B^T d B)[p]   d: input tile t (6 x 6, zero outside x)
//   2. 36 products       M[p] = V[p] (T x C) * U[p] (C x K)     U[p] = (G g G^T)[p], at compile
//   3. output transform  y = A^T M[.][t][k] A (4 x 4), the epilogue, stored where inside y
//
// 4x fewer multiplications in the products than the direct convolution's (36 per 16 outputs
// against 9 x 16). oneDNN 3.2 has no x64 Winograd convolution (its primitive refuses the
// algorithm); its batched matmul runs the products, the transforms are the project's, 16
// channels a vector step, on the channels-last activations the neighbouring oneDNN
// convolutions read and write (brgconv's choice: no reorder between them). On the 2-core
// AVX-512 CI machine's ResNet-50 3x3 convolutions (batch 8) 1.4-1.75x the direct brgconv;
// slower where few tiles make short products (batch 1, 7 x 7), hence kMinTiles.
//
// Values: the transforms' constants are exact in f32 but the sums are reassociated; the error
// against the direct convolution is ~1e-5 of the outputs' magnitude (the tests' 1e-4 bound).
// FUSEBOX_CPU_WINOGRAD=0 turns it off (the direct convolution then runs), for comparisons.
#ifdef FUSEBOX_WITH_ONEDNN
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <vector>

#include "backends/cpu_fast/kernels.h"
#include "backends/cpu_fast/lanes.h"
#include "backends/cpu_fast/onednn.h"
#include "backends/cpu_fast/threads.h"

namespace fusebox::cpu_fast {
namespace {

using dnnl::memory;

constexpr int kTile = 4;           // outputs per tile side
constexpr int kAlpha = 6;          // inputs per tile side: kTile + 3 - 1
constexpr int kPoints = 36;        // kAlpha x kAlpha
constexpr int64_t kMinTiles = 16;  // fewer: the products are too short to win (batch 1, 7 x 7)

// B^T applied along one axis: out[i] = sum_j B^T[i][j] in[j], B^T of F(4x4, 3x3):
//   [4 0 -5 0 1 0] [0 -4 -4 1 1 0] [0 4 -4 -1 1 0]
//   [0 -2 -1 2 1 0] [0 2 -1 -2 1 0] [0 4 0 -5 0 1]
inline void input_rows(const Lanes (&d)[kAlpha], Lanes (&out)[kAlpha]) {
  out[0] = 4.f * d[0] - 5.f * d[2] + d[4];
  out[1] = -4.f * d[1] - 4.f * d[2] + d[3] + d[4];
  out[2] = 4.f * d[1] - 4.f * d[2] - d[3] + d[4];
  out[3] = -2.f * d[1] - d[2] + 2.f * d[3] + d[4];
  out[4] = 2.f * d[1] - d[2] - 2.f * d[3] + d[4];
  out[5] = 4.f * d[1] - 5.f * d[3] + d[5];
}

// A^T applied along one axis: [1 1 1 1 1 0] [0 1 -1 2 -2 0] [0 1 1 4 4 0] [0 1 -1 8 -8 1].
inline void output_rows(const Lanes (&m)[kAlpha], Lanes (&out)[kTile]) {
  out[0] = m[0] + m[1] + m[2] + m[3] + m[4];
  out[1] = m[1] - m[2] + 2.f * m[3] - 2.f * m[4];
  out[2] = m[1] + m[2] + 4.f * m[3] + 4.f * m[4];
  out[3] = m[1] - m[2] + 8.f * m[3] - 8.f * m[4] + m[5];
}

// The first pass of a 2-D transform: `along` (input_rows or output_rows) down each column of
// the 6 x 6 tile `in`, into the kOut rows of `out`.
template <int kOut, class Along>
inline void down_columns(const Lanes (&in)[kAlpha][kAlpha], Lanes (&out)[kOut][kAlpha],
                         Along along) {
  for (int j = 0; j < kAlpha; ++j) {
    Lanes column[kAlpha], transformed[kOut];
    for (int i = 0; i < kAlpha; ++i) column[i] = in[i][j];
    along(column, transformed);
    for (int i = 0; i < kOut; ++i) out[i][j] = transformed[i];
  }
}

// Where point (i, j) of tile t starts in V [36][tiles][C] or M [36][tiles][K] (`channels`).
inline int64_t point_at(int i, int j, int64_t tiles, int64_t t, int64_t channels) {
  return ((int64_t(i) * kAlpha + j) * tiles + t) * channels;
}

// The problem: x [N, H, W, C] and y [N, H, W, K] channels-last, tiles t = (n, ty, tx) of
// ceil(H/4) x ceil(W/4) per image.
struct Problem {
  int64_t n, h, w, c, k;
  int64_t tiles_y() const { return (h + kTile - 1) / kTile; }
  int64_t tiles_x() const { return (w + kTile - 1) / kTile; }
  int64_t tiles() const { return n * tiles_y() * tiles_x(); }
  // Tile t's image, and the row and column of its first output.
  void tile(int64_t t, int64_t& image, int64_t& row, int64_t& col) const {
    image = t / (tiles_y() * tiles_x());
    row = t / tiles_x() % tiles_y() * kTile;
    col = t % tiles_x() * kTile;
  }
};

// Step 1 for items [first, last) of (tile, block of 16 channels), the block fastest.
FUSEBOX_LANES_CLONES
void transform_input(const Problem& p, const float* x, float* v, int64_t first, int64_t last) {
  const int64_t blocks = p.c / kLanes, tiles = p.tiles();
  for (int64_t item = first; item < last; ++item) {
    const int64_t t = item / blocks, c0 = item % blocks * kLanes;
    int64_t n, row, col;
    p.tile(t, n, row, col);
    Lanes d[kAlpha][kAlpha], rows[kAlpha][kAlpha];
    for (int i = 0; i < kAlpha; ++i) {
      const int64_t hy = row - 1 + i;  // pad 1
      for (int j = 0; j < kAlpha; ++j) {
        const int64_t wx = col - 1 + j;
        if (hy < 0 || hy >= p.h || wx < 0 || wx >= p.w)
          d[i][j] = Lanes{};
        else
          load_lanes(x + ((n * p.h + hy) * p.w + wx) * p.c + c0, d[i][j]);
      }
    }
    // B^T d B: down each column, then along each row.
    down_columns(d, rows, input_rows);
    for (int i = 0; i < kAlpha; ++i) {
      Lanes out[kAlpha];
      input_rows(rows[i], out);
      for (int j = 0; j < kAlpha; ++j) store_lanes(v + point_at(i, j, tiles, t, p.c) + c0, out[j]);
    }
  }
}

// The epilogue ConvAttrs fuses: residual_relu?(relu?(conv + bias) + residual), relu as the
// direct convolution's (v < 0 ? 0 : v: NaN stays NaN); bias and residual null where absent.
struct Epilogue {
  const float* bias = nullptr;      // [K]
  bool relu = false;                // the activation
  const float* residual = nullptr;  // like y, channels-last
  bool residual_relu = false;       // the residual's activation
};

// By reference: a vector returned by value changes the ABI between the clones' targets.
inline void relu_in_place(Lanes& v) {
  v = v < 0.f ? Lanes{} : v;
}

// Step 3 for items [first, last) of (tile, block of 16 output channels), with the epilogue.
FUSEBOX_LANES_CLONES
void transform_output(const Problem& p, const float* m, const Epilogue& e, float* y, int64_t first,
                      int64_t last) {
  const int64_t blocks = p.k / kLanes, tiles = p.tiles();
  for (int64_t item = first; item < last; ++item) {
    const int64_t t = item / blocks, k0 = item % blocks * kLanes;
    int64_t n, row, col;
    p.tile(t, n, row, col);
    Lanes a[kAlpha][kAlpha], rows[kTile][kAlpha];
    for (int i = 0; i < kAlpha; ++i)
      for (int j = 0; j < kAlpha; ++j) load_lanes(m + point_at(i, j, tiles, t, p.k) + k0, a[i][j]);
    Lanes shift{};
    if (e.bias) load_lanes(e.bias + k0, shift);
    down_columns(a, rows, output_rows);  // A^T a A: down each column, then along each row
    for (int i = 0; i < kTile; ++i) {
      const int64_t hy = row + i;
      if (hy >= p.h) break;
      Lanes out[kTile];
      output_rows(rows[i], out);
      for (int j = 0; j < kTile; ++j) {
        const int64_t wx = col + j;
        if (wx >= p.w) break;
        const int64_t at = ((n * p.h + hy) * p.w + wx) * p.k + k0;
        Lanes value = out[j] + shift;
        if (e.relu) relu_in_place(value);
        if (e.residual) {
          Lanes r;
          load_lanes(e.residual + at, r);
          value += r;
        }
        if (e.residual_relu) relu_in_place(value);
        store_lanes(y + at, value);
      }
    }
  }
}

// U[p][c][k] = (G g G^T)[p] of w [K, C, 3, 3], in f64 rounded once. G of F(4x4, 3x3):
//   [1/4 0 0] [-1/6 -1/6 -1/6] [-1/6 1/6 -1/6] [1/24 1/12 1/6] [1/24 -1/12 1/6] [0 0 1]
std::vector<float> transform_weights(const Tensor& w, int64_t c, int64_t k) {
  static constexpr double G[kAlpha][3] = {{0.25, 0, 0},
                                          {-1. / 6, -1. / 6, -1. / 6},
                                          {-1. / 6, 1. / 6, -1. / 6},
                                          {1. / 24, 1. / 12, 1. / 6},
                                          {1. / 24, -1. / 12, 1. / 6},
                                          {0, 0, 1}};
  const float* g = w.data<float>();
  std::vector<float> u(size_t(kPoints * c * k));
  for (int64_t ko = 0; ko < k; ++ko) {
    for (int64_t ci = 0; ci < c; ++ci) {
      const float* f = g + (ko * c + ci) * 9;
      double gg[kAlpha][3];  // G g
      for (int i = 0; i < kAlpha; ++i)
        for (int j = 0; j < 3; ++j)
          gg[i][j] = G[i][0] * f[j] + G[i][1] * f[3 + j] + G[i][2] * f[6 + j];
      for (int i = 0; i < kAlpha; ++i)
        for (int j = 0; j < kAlpha; ++j)
          u[size_t(((i * kAlpha + j) * c + ci) * k + ko)] =
              float(gg[i][0] * G[j][0] + gg[i][1] * G[j][1] + gg[i][2] * G[j][2]);
    }
  }
  return u;
}

// The transformed inputs V and the products M of the Winograd convolution running now: one pair
// for the process, grown to the largest convolution's, so that a model's many Winograd nodes
// hold one pair between them (ResNet-50 b8: 29 MB, not 13 pairs), kept between runs (no page
// faults again). Convolutions of executables run at once on several threads take turns.
struct Scratch {
  std::mutex mutex;
  std::vector<float> v, m;
};

Scratch& scratch() {
  static Scratch s;
  return s;
}

class WinogradConvKernel final : public Kernel {
 public:
  WinogradConvKernel(Problem p, std::vector<float> u, std::vector<float> bias, bool relu,
                     bool residual, bool residual_relu)
      : p_(p),
        u_(std::move(u)),
        bias_(std::move(bias)),
        relu_(relu),
        residual_(residual),
        residual_relu_(residual_relu),
        x_plain_(plain_desc({p.n, p.c, p.h, p.w})),
        y_plain_(plain_desc({p.n, p.k, p.h, p.w})),
        x_nhwc_({p.n, p.c, p.h, p.w}, memory::data_type::f32, memory::format_tag::nhwc),
        y_nhwc_({p.n, p.k, p.h, p.w}, memory::data_type::f32, memory::format_tag::nhwc),
        products_(dnnl::matmul::primitive_desc(cpu_engine(), plain_desc({kPoints, p.tiles(), p.c}),
                                               plain_desc({kPoints, p.c, p.k}),
                                               plain_desc({kPoints, p.tiles(), p.k}))),
        matmul_(products_) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    run_own(in, {}, 0, out, nullptr);
  }

  bool writes_own_layout() const override { return true; }
  bool reads_own_layout(size_t input) const override { return input == 0 || input == 3; }

  void run_own(std::span<const Tensor* const> in, std::span<const OwnLayout* const> own_in,
               uint32_t /*consumable*/, std::span<Tensor> out,
               std::shared_ptr<OwnLayout>* own_out) override {
    Scratch& work = scratch();
    const std::lock_guard<std::mutex> lock(work.mutex);
    // Input i channels-last: as its writer left it, or the dense tensor reordered.
    auto channels_last = [&](size_t i, const memory::desc& plain, const memory::desc& want) {
      const OwnLayout* own = i < own_in.size() ? own_in[i] : nullptr;
      return in_layout(
          own ? static_cast<const OnednnValue*>(own)->memory : wrap(plain, in[i]->raw()), want);
    };
    const memory x = channels_last(0, x_plain_, x_nhwc_);
    const int64_t tiles = p_.tiles();
    work.v.resize(std::max(work.v.size(), size_t(kPoints * tiles * p_.c)));
    work.m.resize(std::max(work.m.size(), size_t(kPoints * tiles * p_.k)));
    const float* xs = static_cast<const float*>(x.get_data_handle());
    split_over_threads(tiles * (p_.c / kLanes), 8, [&](int64_t first, int64_t last) {
      transform_input(p_, xs, work.v.data(), first, last);
    });
    const memory v(products_.src_desc(), cpu_engine(), work.v.data());
    const memory u(products_.weights_desc(), cpu_engine(), u_.data());
    const memory m(products_.dst_desc(), cpu_engine(), work.m.data());
    execute(matmul_, {{DNNL_ARG_SRC, v}, {DNNL_ARG_WEIGHTS, u}, {DNNL_ARG_DST, m}});
    const memory y(y_nhwc_, cpu_engine());
    float* ys = static_cast<float*>(y.get_data_handle());
    std::optional<memory> residual;
    if (residual_) residual = channels_last(3, y_plain_, y_nhwc_);
    const Epilogue e{bias_.empty() ? nullptr : bias_.data(), relu_,
                     residual ? static_cast<const float*>(residual->get_data_handle()) : nullptr,
                     residual_relu_};
    split_over_threads(tiles * (p_.k / kLanes), 8, [&](int64_t first, int64_t last) {
      transform_output(p_, work.m.data(), e, ys, first, last);
    });
    if (own_out) {
      *own_out = std::make_shared<OnednnValue>(y);
      return;
    }
    const memory dense = wrap(y_plain_, out[0].raw());
    execute(dnnl::reorder(y, dense), {{DNNL_ARG_FROM, y}, {DNNL_ARG_TO, dense}});
  }

  std::string describe() const override {
    return cat("own Winograd F(4x4, 3x3) conv, products on oneDNN matmul ",
               implementation(products_), " (weights transformed once)");
  }

 private:
  Problem p_;
  std::vector<float> u_, bias_;
  bool relu_, residual_, residual_relu_;
  memory::desc x_plain_, y_plain_, x_nhwc_, y_nhwc_;
  dnnl::matmul::primitive_desc products_;
  dnnl::matmul matmul_;
};

bool winograd_enabled() {
  static const bool enabled = [] {
    const char* text = std::getenv("FUSEBOX_CPU_WINOGRAD");
    return text == nullptr || std::string(text) != "0";
  }();
  return enabled;
}

}  // namespace

Planned plan_winograd_conv(const Graph& g, const Node& n) {
  const auto& a = std::get<ConvAttrs>(n.attrs);
  auto input = [&](size_t i) { return i < n.inputs.size() ? n.inputs[i] : kNoValue; };
  const ValueId x = input(0), w = input(1), bias = input(2), residual = input(3);
  auto refuse = [](std::string why) { return Planned{nullptr, std::move(why)}; };
  if (!winograd_enabled()) return refuse("FUSEBOX_CPU_WINOGRAD=0");
  for (ValueId v : {x, w, n.outputs[0]})
    if (g.value(v).type.dtype != DType::f32) return refuse("not f32");
  const Shape& xs = g.value(x).type.shape;
  const Shape& ws = g.value(w).type.shape;
  if (xs.size() != 4 || ws[2] != 3 || ws[3] != 3 || a.groups != 1)
    return refuse("not a 2-D 3x3 convolution of one group");
  auto all = [](const std::vector<int64_t>& v, int64_t value) {
    for (int64_t e : v)
      if (e != value) return false;
    return true;
  };
  if (!all(a.strides, 1) || !all(a.dilations, 1) || a.pads_begin != std::vector<int64_t>{1, 1} ||
      a.pads_end != std::vector<int64_t>{1, 1})
    return refuse("not stride 1, dilation 1, padding 1");
  const Problem p{xs[0], xs[2], xs[3], xs[1], ws[0]};
  if (p.c % kLanes != 0 || p.k % kLanes != 0)
    return refuse(cat("channels not multiples of ", kLanes));
  if (p.tiles() < kMinTiles) return refuse(cat(p.tiles(), " tiles (fewer than ", kMinTiles, ")"));
  if (!g.is_constant(w)) return refuse("weights not constant");
  for (const FusedActivation& act : {a.activation, a.residual_activation})
    if (act && act.kind != Activation::relu) return refuse("an activation other than relu");
  if (residual != kNoValue && g.value(residual).type != g.value(n.outputs[0]).type)
    return refuse("a residual not of y's type");
  std::vector<float> shift;
  if (bias != kNoValue) {
    if (!g.is_constant(bias) || g.value(bias).type.dtype != DType::f32)
      return refuse("a bias not a constant f32");
    const Tensor& b = *g.constant(bias);
    shift.assign(b.data<float>(), b.data<float>() + p.k);
  }
  try {
    return {std::make_unique<WinogradConvKernel>(p, transform_weights(*g.constant(w), p.c, p.k),
                                                 std::move(shift), bool(a.activation),
                                                 residual != kNoValue, bool(a.residual_activation)),
            ""};
  } catch (const dnnl::error& e) {
    return refuse(cat("oneDNN has no matmul for its products (", e.what(), ")"));
  }
}

}  // namespace fusebox::cpu_fast
#endif  // FUSEBOX_WITH_ONEDNN
