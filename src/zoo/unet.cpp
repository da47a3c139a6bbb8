// U-Net for segmentation, in the layout and names of the widely used PyTorch U-Net
// (milesial/Pytorch-UNet): unet (widths 64 .. 1024, transposed-convolution upsampling: 31M
// parameters) and unet_test (widths 8, 16, 32, bilinear upsampling with align_corners, the
// repository's bilinear=True form: tests and CPU runs).
//
//   inc: DoubleConv(3 -> w0); down_i: 2x2 max pool + DoubleConv(w_i-1 -> w_i)
//   up_i: upsample the deeper map (ConvTranspose 2x2 stride 2 halving its channels, or a
//         bilinear resize by 2 keeping them), concat [skip, upsampled] on channels,
//         DoubleConv; outc: 1x1 conv (bias) to the classes
//   DoubleConv: (3x3 conv without bias, BN, ReLU) twice (double_conv.0 .. .5)
//
// With bilinear upsampling the deepest width and each up's output are halved (the
// repository's `factor`), so the concatenated channels match. Output "logits" [N, classes,
// H, W]: cross_entropy takes per-pixel labels [N, H, W]. Weights as Layers::he_conv and
// initial_batch_norm (PyTorch's BatchNorm2d: eps 1e-5, momentum 0.1).
#include <cmath>

#include "zoo/layers.h"

namespace fusebox::zoo {
namespace {

struct UnetConfig {
  std::vector<int64_t> widths;
  bool bilinear;
};

UnetConfig config_of(const std::string& name) {
  if (name == "unet") return {{64, 128, 256, 512, 1024}, false};
  return {{8, 16, 32}, true};  // unet_test
}

class Unet {
 public:
  Unet(Graph& g, const ZooOptions& opts) : g_(g), l_(g, opts), b_(l_.builder()), opts_(opts) {}

  int64_t width(ValueId x) const { return g_.value(x).type.shape[1]; }

  ValueId double_conv(ValueId x, const std::string& name, int64_t out, int64_t mid) {
    const std::string p = name + ".double_conv.";
    ValueId h = l_.he_conv(x, p + "0", mid, 3, 1, 1, false);
    h = b_.name(p + "2").relu(l_.initial_batch_norm(h, p + "1", 1e-5, 0.9));
    h = l_.he_conv(h, p + "3", out, 3, 1, 1, false);
    return b_.name(p + "5").relu(l_.initial_batch_norm(h, p + "4", 1e-5, 0.9));
  }

  ValueId down(ValueId x, const std::string& name, int64_t out) {
    PoolAttrs a;
    a.kernel = a.strides = {2, 2};
    const ValueId pooled = b_.name(name + ".maxpool_conv.0").max_pool(x, a);
    return double_conv(pooled, name + ".maxpool_conv.1", out, out);
  }

  ValueId up(ValueId deep, ValueId skip, const std::string& name, int64_t out, bool bilinear) {
    const Shape s = g_.value(deep).type.shape;
    ValueId upsampled;
    if (bilinear) {
      const ResizeAttrs r{.sizes = {s[0], s[1], 2 * s[2], 2 * s[3]},
                          .mode = ResizeMode::linear,
                          .coordinates = ResizeCoordinates::align_corners};
      upsampled = g_.add_node(OpKind::resize, r, {deep}, name + ".up").at(0);
    } else {
      const int64_t c = width(deep), half = c / 2;
      // nn.ConvTranspose2d(c, c / 2, 2, stride 2): weight [c, c / 2, 2, 2], bias [c / 2].
      const ValueId w =
          l_.normal_parameter(name + ".up.weight", {c, half, 2, 2}, std::sqrt(2.0 / double(c)));
      const ValueId bias = l_.filled_parameter(name + ".up.bias", {half}, 0.0);
      ConvBackwardDataAttrs a;
      a.conv.strides = {2, 2};
      a.input_spatial = {2 * s[2], 2 * s[3]};
      upsampled = b_.name(name + ".up").conv_backward_data(deep, w, a, bias);
    }
    const ValueId joined = b_.name(name + ".cat").concat({skip, upsampled}, 1);
    return double_conv(joined, name + ".conv", out, bilinear ? width(joined) / 2 : out);
  }

  void build(const UnetConfig& c) {
    const std::vector<int64_t>& w = c.widths;
    const size_t depth = w.size() - 1;
    const int64_t factor = c.bilinear ? 2 : 1;
    std::vector<ValueId> skips{double_conv(l_.input(), "inc", w[0], w[0])};
    for (size_t i = 1; i <= depth; ++i)
      skips.push_back(
          down(skips.back(), "down" + std::to_string(i), i == depth ? w[i] / factor : w[i]));
    ValueId h = skips.back();
    for (size_t i = 1; i <= depth; ++i) {
      const size_t level = depth - i;  // the skip's
      const int64_t out = level == 0 ? w[0] : w[level] / factor;
      h = up(h, skips[level], "up" + std::to_string(i), out, c.bilinear);
    }
    l_.mark_logits(l_.he_conv(h, "outc.conv", opts_.num_classes, 1, 1, 1, true));
  }

 private:
  Graph& g_;
  Layers l_;
  Builder& b_;
  ZooOptions opts_;
};

}  // namespace

Graph build_unet(const std::string& name, const ZooOptions& opts) {
  const UnetConfig c = config_of(name);
  const int64_t reduction = int64_t(1) << (c.widths.size() - 1);
  FUSEBOX_CHECK(opts.image_size % reduction == 0, "zoo " + name, "image size ", opts.image_size,
                " is not a multiple of ", reduction, " (one halving per level)");
  Graph g(name);
  Unet(g, opts).build(c);
  return g;
}

}  // namespace fusebox::zoo
