// Standard architectures built with the C++ builder, with seeded random weights.
#pragma once

#include <string>
#include <vector>

#include "fusebox/ir/graph.h"

namespace fusebox {

struct ZooOptions {
  int64_t batch = 1;
  int64_t image_size = 224;  // square input, 3 channels
  int64_t num_classes = 1000;
  uint64_t seed = 0;
  DType dtype = DType::f32;
  // Batch norm in training form (5 outputs, batch statistics): for training graphs.
  bool training = false;
  // Decoders (gpt2*): tokens per sequence; 0 is the model's own context (1024, gpt2_test 32).
  // image_size and num_classes do not apply to them (their vocabulary is the model's).
  int64_t sequence_length = 0;
};

// Names the zoo knows: "resnet18", "resnet34", "resnet50", "resnet101", "small_cnn",
// "vit_b_16", "vit_test" (a 2-layer ViT of width 64, patch 8, for tests and CPU runs),
// "convnext_tiny", "convnext_test" (two stages of one block, widths 16 and 32),
// "mobilenet_v3_small" (hardswish, squeeze-excitation, depthwise convs), "unet" and
// "unet_test" (segmentation: logits [batch, num_classes, H, W]; zoo/unet.cpp), "gpt2" and
// "gpt2_test" (decoders: token ids in, logits [batch, vocab, tokens] out; zoo/gpt2.cpp).
std::vector<std::string> zoo_models();
// Throws an Error listing the known names for an unknown one. Input "input"
// [batch, 3, image_size, image_size], output "logits" [batch, num_classes] (decoders: input
// i64 [batch, sequence_length], logits [batch, vocab, sequence_length]).
// Weights and layer names follow torchvision's layout (conv1, bn1, layer1.0.conv1, ... fc;
// ViTs: conv_proj, class_token, encoder.layers.encoder_layer_i..., heads.head; ConvNeXts:
// features.i.j.block.k, layer_scale, classifier.2).
Graph build_zoo_model(const std::string& name, const ZooOptions& opts = {});

}  // namespace fusebox
