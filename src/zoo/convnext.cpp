// ConvNeXt (torchvision's layout and names): convnext_tiny (depths 3, 3, 9, 3; widths 96, 192,
// 384, 768) and convnext_test (depths 1, 1; widths 16, 32: for tests and CPU runs).
//
//   features.0: 4x4 stride-4 conv (bias) + LayerNorm2d
//   stage i: blocks, each  x + layer_scale * mlp(LayerNorm(dwconv7x7(x)))  (the MLP on
//            channels-last pixels: Linear(C, 4C), GELU, Linear(4C, C)); between stages
//            LayerNorm2d + 2x2 stride-2 conv (features.2, .4, .6)
//   classifier: global average pool, LayerNorm2d, Linear
// LayerNorm2d is LayerNorm over channels: NCHW -> NHWC, layer_norm, -> NCHW, as torchvision.
// Stochastic depth is the identity at inference and is left out. Weights ~N(0, 0.02^2),
// biases 0, LayerNorm scale 1, layer_scale 1e-6 (torchvision's initial values).
#include "zoo/layers.h"

namespace fusebox::zoo {
namespace {

struct ConvNextConfig {
  std::vector<int64_t> depths, widths;
};

ConvNextConfig config_of(const std::string& name) {
  if (name == "convnext_tiny") return {{3, 3, 9, 3}, {96, 192, 384, 768}};
  return {{1, 1}, {16, 32}};  // convnext_test
}

class ConvNext {
 public:
  ConvNext(Graph& g, const ZooOptions& opts) : g_(g), l_(g, opts), b_(l_.builder()), opts_(opts) {}

  ValueId conv(ValueId x, const std::string& name, int64_t out, int64_t kernel, int64_t stride,
               int64_t pad, int64_t groups) {
    const int64_t in = g_.value(x).type.shape[1];
    const ValueId w =
        l_.normal_parameter(name + ".weight", {out, in / groups, kernel, kernel}, 0.02);
    const ValueId bias = l_.filled_parameter(name + ".bias", {out}, 0.0);
    ConvAttrs a;
    a.strides = {stride, stride};
    a.pads_begin = a.pads_end = {pad, pad};
    a.groups = groups;
    return b_.name(name).conv(x, w, bias, a);
  }

  // LayerNorm over the channels of NCHW x.
  ValueId layer_norm_2d(ValueId x, const std::string& name) {
    const ValueId nhwc = b_.name(name + ".to_nhwc").transpose(x, {0, 2, 3, 1});
    const ValueId y = l_.layer_norm(nhwc, name, 1e-6);
    return b_.name(name + ".to_nchw").transpose(y, {0, 3, 1, 2});
  }

  ValueId block(ValueId x, const std::string& name, int64_t width) {
    const ValueId dw = conv(x, name + ".block.0", width, 7, 1, 3, width);
    const ValueId nhwc = b_.name(name + ".block.1").transpose(dw, {0, 2, 3, 1});
    ValueId y = l_.layer_norm(nhwc, name + ".block.2", 1e-6);
    y = l_.linear(y, name + ".block.3", 4 * width);
    y = b_.name(name + ".block.4").gelu(y);
    y = l_.linear(y, name + ".block.5", width);
    const ValueId nchw = b_.name(name + ".block.6").transpose(y, {0, 3, 1, 2});
    const ValueId scale = l_.filled_parameter(name + ".layer_scale", {width, 1, 1}, 1e-6);
    const ValueId scaled = b_.name(name + ".scaled").mul(nchw, scale);
    return b_.name(name + ".add").add(x, scaled);
  }

  void build(const ConvNextConfig& c) {
    ValueId h = l_.input();
    h = conv(h, "features.0.0", c.widths[0], 4, 4, 0, 1);
    h = layer_norm_2d(h, "features.0.1");
    for (size_t stage = 0; stage < c.depths.size(); ++stage) {
      const std::string prefix = "features." + std::to_string(2 * stage + 1);
      if (stage > 0) {
        const std::string down = "features." + std::to_string(2 * stage);
        h = layer_norm_2d(h, down + ".0");
        h = conv(h, down + ".1", c.widths[stage], 2, 2, 0, 1);
      }
      for (int64_t i = 0; i < c.depths[stage]; ++i)
        h = block(h, prefix + "." + std::to_string(i), c.widths[stage]);
    }
    const ValueId pooled = b_.name("avgpool").global_avg_pool(h);
    const ValueId normed = layer_norm_2d(pooled, "classifier.0");
    const ValueId flat = b_.name("classifier.1").flatten(normed, 1);
    l_.logits(flat, "classifier.2", opts_.num_classes);
  }

 private:
  Graph& g_;
  Layers l_;
  Builder& b_;
  ZooOptions opts_;
};

}  // namespace

Graph build_convnext(const std::string& name, const ZooOptions& opts) {
  const ConvNextConfig c = config_of(name);
  const int64_t reduction = int64_t(4) << (c.depths.size() - 1);
  FUSEBOX_CHECK(opts.image_size % reduction == 0, "zoo " + name, "image size ", opts.image_size,
                " is not a multiple of ", reduction);
  Graph g(name);
  ConvNext(g, opts).build(c);
  return g;
}

}  // namespace fusebox::zoo
