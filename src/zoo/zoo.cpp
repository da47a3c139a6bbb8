// The zoo's registry: known names, option checks, dispatch.
#include "fusebox/zoo.h"

#include "zoo/layers.h"

namespace fusebox {

std::vector<std::string> zoo_models() {
  return {"resnet18", "resnet34",  "resnet50",      "resnet101",     "small_cnn",
          "vit_b_16", "vit_test",  "convnext_tiny", "convnext_test", "mobilenet_v3_small",
          "unet",     "unet_test", "gpt2",          "gpt2_test"};
}

Graph build_zoo_model(const std::string& name, const ZooOptions& opts) {
  std::vector<std::string> known = zoo_models();
  bool found = false;
  std::string list;
  for (const std::string& k : known) {
    found = found || k == name;
    list += (list.empty() ? "" : ", ") + k;
  }
  FUSEBOX_CHECK(found, "zoo", "unknown model '", name, "'; known models: ", list);

  const std::string where = "zoo " + name;
  // small_cnn halves the resolution twice with 2x2 pools; a ResNet's strided convs and
  // pools are padded and shrink any size >= 1 to at least 1.
  const int64_t min_size = name == "small_cnn" ? 4 : 1;
  FUSEBOX_CHECK(opts.batch >= 1, where, "batch must be >= 1, got ", opts.batch);
  FUSEBOX_CHECK(opts.image_size >= min_size, where, "image size must be >= ", min_size, ", got ",
                opts.image_size);
  FUSEBOX_CHECK(opts.num_classes >= 1, where, "num_classes must be >= 1, got ", opts.num_classes);
  FUSEBOX_CHECK(is_floating(opts.dtype), where, "dtype must be a float type, got ",
                dtype_name(opts.dtype));
  FUSEBOX_CHECK(opts.sequence_length >= 0, where,
                "sequence length must be >= 1 (0: the model's), got ", opts.sequence_length);

  Graph g = name == "small_cnn"               ? zoo::build_small_cnn(opts)
            : name.rfind("vit_", 0) == 0      ? zoo::build_vit(name, opts)
            : name.rfind("convnext_", 0) == 0 ? zoo::build_convnext(name, opts)
            : name.rfind("gpt2", 0) == 0      ? zoo::build_gpt2(name, opts)
            : name == "mobilenet_v3_small"    ? zoo::build_mobilenet_v3(name, opts)
            : name.rfind("unet", 0) == 0      ? zoo::build_unet(name, opts)
                                              : zoo::build_resnet(name, opts);
  g.verify();
  return g;
}

}  // namespace fusebox
