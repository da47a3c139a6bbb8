// ResNet-18/34/50/101 in torchvision's layout (He et al. 2015; torchvision v1.5
// puts a bottleneck's stride on its 3x3 conv). Node and constant names follow
// torchvision's module and state_dict names, so weights can be matched one to one.
#include <array>

#include "zoo/layers.h"

namespace fusebox::zoo {
namespace {

struct ResNetSpec {
  const char* name;
  bool bottleneck;  // BasicBlock (two 3x3 convs) or Bottleneck (1x1, 3x3, 1x1; expansion 4)
  std::array<int, 4> blocks;
};

constexpr ResNetSpec kSpecs[] = {
    {"resnet18", false, {2, 2, 2, 2}},
    {"resnet34", false, {3, 4, 6, 3}},
    {"resnet50", true, {3, 4, 6, 3}},
    {"resnet101", true, {3, 4, 23, 3}},
};

// The shortcut: the input itself, or a strided 1x1 conv + batch norm when the
// block changes the resolution or the channel count.
ValueId shortcut(Layers& L, ValueId x, const std::string& p, int64_t out_channels, int64_t stride) {
  if (stride == 1 && L.channels(x) == out_channels) return x;
  ValueId y = L.conv(x, p + ".downsample.0", out_channels, 1, stride, 0);
  return L.batch_norm(y, p + ".downsample.1");
}

ValueId basic_block(Layers& L, ValueId x, const std::string& p, int64_t planes, int64_t stride) {
  ValueId y = L.conv(x, p + ".conv1", planes, 3, stride, 1);
  y = L.relu(L.batch_norm(y, p + ".bn1"), p + ".relu");
  y = L.batch_norm(L.conv(y, p + ".conv2", planes, 3, 1, 1), p + ".bn2");
  ValueId identity = shortcut(L, x, p, planes, stride);
  return L.relu(L.add(y, identity, p + ".add"), p + ".relu_1");
}

ValueId bottleneck_block(Layers& L, ValueId x, const std::string& p, int64_t planes,
                         int64_t stride) {
  ValueId y = L.conv(x, p + ".conv1", planes, 1, 1, 0);
  y = L.relu(L.batch_norm(y, p + ".bn1"), p + ".relu");
  y = L.conv(y, p + ".conv2", planes, 3, stride, 1);
  y = L.relu(L.batch_norm(y, p + ".bn2"), p + ".relu_1");
  y = L.batch_norm(L.conv(y, p + ".conv3", planes * 4, 1, 1, 0), p + ".bn3");
  ValueId identity = shortcut(L, x, p, planes * 4, stride);
  return L.relu(L.add(y, identity, p + ".add"), p + ".relu_2");
}

}  // namespace

Graph build_resnet(const std::string& name, const ZooOptions& opts) {
  const ResNetSpec* spec = nullptr;
  for (const ResNetSpec& s : kSpecs)
    if (name == s.name) spec = &s;
  FUSEBOX_CHECK(spec, "zoo", "'", name, "' is not a ResNet");

  Graph g(name);
  Layers L(g, opts);
  ValueId x = L.input();
  x = L.relu(L.batch_norm(L.conv(x, "conv1", 64, 7, 2, 3), "bn1"), "relu");
  x = L.max_pool(x, "maxpool", 3, 2, 1);
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t planes = int64_t(64) << stage;
    for (int block = 0; block < spec->blocks[size_t(stage)]; ++block) {
      const int64_t stride = (stage > 0 && block == 0) ? 2 : 1;
      const std::string prefix = cat("layer", stage + 1, ".", block);
      x = spec->bottleneck ? bottleneck_block(L, x, prefix, planes, stride)
                           : basic_block(L, x, prefix, planes, stride);
    }
  }
  L.classifier(x, opts.num_classes);
  return g;
}

}  // namespace fusebox::zoo
