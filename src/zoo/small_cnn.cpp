// A small CNN for tests and quick training runs at tiny resolution (e.g. 8x8 to
// 32x32): two conv-bn-relu-maxpool stages (16 then 32 channels), then the same
// global-average-pool + fc head as the ResNets.
#include "zoo/layers.h"

namespace fusebox::zoo {

Graph build_small_cnn(const ZooOptions& opts) {
  Graph g("small_cnn");
  Layers L(g, opts);
  ValueId x = L.input();
  const int64_t widths[] = {16, 32};
  for (int stage = 1; stage <= 2; ++stage) {
    x = L.conv(x, cat("conv", stage), widths[stage - 1], 3, 1, 1);
    x = L.relu(L.batch_norm(x, cat("bn", stage)), cat("relu", stage));
    x = L.max_pool(x, cat("pool", stage), 2, 2, 0);
  }
  L.classifier(x, opts.num_classes);
  return g;
}

}  // namespace fusebox::zoo
