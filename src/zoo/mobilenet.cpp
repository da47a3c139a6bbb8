// MobileNetV3-Small (torchvision's layout and names: 2,542,856 parameters at 1000 classes).
//
//   features.0: 3x3 stride-2 conv 3 -> 16, BN, hardswish
//   features.1-11: inverted residuals (the table below): [1x1 expand conv, BN, act] (left out
//     when the expansion is the input width), kxk depthwise conv (stride), BN, act,
//     [squeeze-excitation: avg pool, fc1 (1x1 conv + bias), relu, fc2, hardsigmoid, scale],
//     1x1 project conv, BN; + the input when the stride is 1 and the widths agree
//   features.12: 1x1 conv 96 -> 576, BN, hardswish
//   classifier: avg pool, Linear(576, 1024), hardswish, (dropout: identity), Linear(1024, classes)
//
// hardswish(x) = x * clip(x + 3, 0, 6) / 6 and hardsigmoid(x) = clip(x + 3, 0, 6) / 6, as
// PyTorch defines them (and ONNX's HardSwish / HardSigmoid with alpha 1/6). BatchNorm eps 1e-3
// as torchvision's, with its initial state (scale 1, bias 0, mean 0, var 1); conv weights
// ~N(0, 2 / fan_in) (He), so activations keep their scale through the identity-like batch
// norms; the classifier's Linear layers ~N(0, 0.01^2), biases 0.
#include <cmath>

#include "zoo/layers.h"

namespace fusebox::zoo {
namespace {

// torchvision's _make_divisible(v, 8): the nearest multiple of 8, at least 90% of v.
int64_t make_divisible(double v) {
  int64_t d = std::max<int64_t>(8, int64_t(v + 4) / 8 * 8);
  if (double(d) < 0.9 * v) d += 8;
  return d;
}

struct Block {
  int64_t kernel, expanded, out;
  bool se, hardswish;
  int64_t stride;
};

// torchvision's mobilenet_v3_small inverted residual settings (input widths follow).
constexpr Block kSmall[] = {
    {3, 16, 16, true, false, 2}, {3, 72, 24, false, false, 2}, {3, 88, 24, false, false, 1},
    {5, 96, 40, true, true, 2},  {5, 240, 40, true, true, 1},  {5, 240, 40, true, true, 1},
    {5, 120, 48, true, true, 1}, {5, 144, 48, true, true, 1},  {5, 288, 96, true, true, 2},
    {5, 576, 96, true, true, 1}, {5, 576, 96, true, true, 1},
};

class MobileNetV3 {
 public:
  MobileNetV3(Graph& g, const ZooOptions& opts)
      : g_(g), l_(g, opts), b_(l_.builder()), opts_(opts) {}

  int64_t width(ValueId x) const { return g_.value(x).type.shape[1]; }

  ValueId hardsigmoid(ValueId x, const std::string& name) {
    const ValueId shifted = b_.name(name + ".shift").add(x, l_.scalar(3.0));
    const ValueId clipped = b_.name(name + ".relu6").clip(shifted, 0.0, 6.0);
    return b_.name(name).div(clipped, l_.scalar(6.0));
  }
  ValueId hardswish(ValueId x, const std::string& name) {
    return b_.name(name).mul(x, hardsigmoid(x, name + ".gate"));
  }

  // torchvision's: eps 1e-3, momentum 0.01 (ONNX's 0.99).
  ValueId batch_norm(ValueId x, const std::string& name) {
    return l_.initial_batch_norm(x, name, 1e-3, 0.99);
  }

  // Conv2dNormActivation: conv (no bias), BN, then the activation (none, relu, hardswish).
  enum class Act { none, relu, hardswish };
  ValueId conv_bn(ValueId x, const std::string& name, int64_t out, int64_t kernel, int64_t stride,
                  int64_t groups, Act act) {
    ValueId y =
        batch_norm(l_.he_conv(x, name + ".0", out, kernel, stride, groups, false), name + ".1");
    if (act == Act::relu) return b_.name(name + ".2").relu(y);
    if (act == Act::hardswish) return hardswish(y, name + ".2");
    return y;
  }

  ValueId squeeze_excitation(ValueId x, const std::string& name) {
    const int64_t c = width(x), squeezed = make_divisible(double(c / 4));
    const ValueId pooled = b_.name(name + ".avgpool").global_avg_pool(x);
    ValueId s = l_.he_conv(pooled, name + ".fc1", squeezed, 1, 1, 1, true);
    s = b_.name(name + ".activation").relu(s);
    s = l_.he_conv(s, name + ".fc2", c, 1, 1, 1, true);
    return b_.name(name + ".scale").mul(x, hardsigmoid(s, name + ".scale_activation"));
  }

  ValueId inverted_residual(ValueId x, const std::string& name, const Block& blk) {
    const Act act = blk.hardswish ? Act::hardswish : Act::relu;
    const int64_t in = width(x);
    ValueId h = x;
    int layer = 0;
    auto next = [&] { return name + ".block." + std::to_string(layer++); };
    if (blk.expanded != in) h = conv_bn(h, next(), blk.expanded, 1, 1, 1, act);
    h = conv_bn(h, next(), blk.expanded, blk.kernel, blk.stride, blk.expanded, act);
    if (blk.se) h = squeeze_excitation(h, next());
    h = conv_bn(h, next(), blk.out, 1, 1, 1, Act::none);
    if (blk.stride == 1 && in == blk.out) h = b_.name(name + ".add").add(x, h);
    return h;
  }

  ValueId linear(ValueId x, const std::string& name, int64_t out) {
    const int64_t in = g_.value(x).type.shape[1];
    const ValueId w = l_.normal_parameter(name + ".weight", {out, in}, 0.01);
    const ValueId b = l_.filled_parameter(name + ".bias", {out}, 0.0);
    return b_.name(name).gemm(x, w, b, GemmAttrs{.trans_b = true});
  }

  void build() {
    ValueId h = conv_bn(l_.input(), "features.0", 16, 3, 2, 1, Act::hardswish);
    for (size_t i = 0; i < std::size(kSmall); ++i)
      h = inverted_residual(h, "features." + std::to_string(i + 1), kSmall[i]);
    h = conv_bn(h, "features.12", 576, 1, 1, 1, Act::hardswish);
    const ValueId pooled = b_.name("avgpool").global_avg_pool(h);
    const ValueId flat = b_.name("flatten").flatten(pooled, 1);
    ValueId y = hardswish(linear(flat, "classifier.0", 1024), "classifier.1");
    l_.mark_logits(linear(y, "classifier.3", opts_.num_classes));
  }

 private:
  Graph& g_;
  Layers l_;
  Builder& b_;
  ZooOptions opts_;
};

}  // namespace

Graph build_mobilenet_v3(const std::string& name, const ZooOptions& opts) {
  Graph g(name);
  MobileNetV3(g, opts).build();
  return g;
}

}  // namespace fusebox::zoo
