// Building blocks shared by the zoo's architectures: layers that create their own
// seeded weights and name their nodes and constants as torchvision does
// ("layer1.0.conv1" reads the constant "layer1.0.conv1.weight").
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fusebox/ir/builder.h"
#include "fusebox/zoo.h"

namespace fusebox::zoo {

// A small, portable random stream (splitmix64). std:: distributions differ between
// standard libraries, so the zoo draws every number from this and plain arithmetic:
// the same seed gives the same weights on every platform.
class Rng {
 public:
  explicit Rng(uint64_t state) : state_(state) {}
  uint64_t next();
  double uniform(double lo, double hi);  // [lo, hi), 53-bit resolution
  // Mean 0, standard deviation 1: the sum of four 16-bit uniforms, centred and scaled
  // (Irwin-Hall). Bounded by +-2*sqrt(3); close enough to a normal for initialisation.
  double normal_like();

 private:
  uint64_t state_;
};

// Each tensor gets its own stream, derived from the seed and the tensor's name, so
// a layer's weights do not depend on what was built before it.
Rng tensor_rng(uint64_t seed, const std::string& tensor_name);

// Per-channel mean and variance of an activation, estimated while building (see
// Layers::batch_norm).
struct ChannelStats {
  std::vector<double> mean, var;
};

class Layers {
 public:
  Layers(Graph& g, const ZooOptions& opts) : g_(g), b_(g), opts_(opts) {}
  Graph& graph() { return g_; }

  // The graph input "input" [batch, 3, size, size], assumed to hold independent
  // elements of mean 0 and variance 1/3 (U(-1, 1), as `fusebox run` feeds it).
  ValueId input();
  // Square kernel, no bias (every zoo conv is followed by batch norm). Weights are
  // kaiming-normal-like with std = sqrt(2 / fan_out), fan_out = out_channels * k * k,
  // as torchvision initialises its ResNets.
  ValueId conv(ValueId x, const std::string& name, int64_t out_channels, int64_t kernel,
               int64_t stride, int64_t pad);
  // Inference or training form per ZooOptions::training; scale U(0.5, 1.5), bias
  // U(-0.1, 0.1). The running statistics are what a calibration pass would have
  // found, give or take: each channel's mean and variance are estimated from the
  // weights built so far, then perturbed (mean + U(-0.1, 0.1) std, var * U(0.5, 1.5)).
  // Why: torchvision starts from mean 0, var 1, which makes an inference batch norm
  // a near identity; with kaiming init each residual block then triples the variance
  // (ResNet-101's logits reach ~1e7, past f16's range). Normalising by estimated
  // statistics keeps activations O(1) at any depth, and the graph non-trivial.
  // The estimate uses only + - * / and sqrt, so it is as portable as the weights. It
  // tracks per-channel mean and variance through conv (exact for independent inputs),
  // relu, add and max_pool (approximations), from inputs of independent elements
  // (see input()). On such inputs every batch norm of ResNet-50 at 224x224 outputs
  // std 1.0-1.4 with channel means within 0.45 of 0, and the logits have rms ~0.8
  // (ResNet-101: ~8). Smooth inputs (images) pool differently and activations then
  // grow with depth (ResNet-50 logits rms ~20, ResNet-101 ~400 on a smooth pattern).
  ValueId batch_norm(ValueId x, const std::string& name);
  ValueId relu(ValueId x, const std::string& name);
  ValueId add(ValueId a, ValueId b, const std::string& name);
  // 2x2 or 3x3 windows, after a relu (the statistics estimate assumes both).
  ValueId max_pool(ValueId x, const std::string& name, int64_t kernel, int64_t stride, int64_t pad);
  // avgpool (global average) -> flatten -> fc (gemm with trans_b, as nn.Linear);
  // fc weight and bias U(-1/sqrt(in), 1/sqrt(in)). Marks the result as the output "logits".
  ValueId classifier(ValueId features, int64_t num_classes);

  int64_t channels(ValueId x) const { return g_.value(x).type.shape.at(1); }

  // For architectures without batch norm (vit.cpp): the builder, and parameters drawn as
  // N(0, stddev^2)-like or filled with a value, in the zoo's dtype.
  Builder& builder() { return b_; }
  ValueId normal_parameter(const std::string& name, const Shape& shape, double stddev);
  ValueId filled_parameter(const std::string& name, const Shape& shape, double value);
  // nn.Linear on [..., in] as one gemm over the flattened leading dims (its bias fused by
  // the gemm-epilogue pass): weight [out, in] ~N(0, 0.02^2), bias 0; named name.weight and
  // name.bias unless `weight` / `bias` name them (torchvision's in_proj_weight).
  ValueId linear(ValueId x, const std::string& name, int64_t out, const std::string& weight = "",
                 const std::string& bias = "");
  // The classifier of a transformer-era model: nn.Linear `name` on [batch, features] (weight
  // ~N(0, 0.02^2), bias 0) whose result is the output "logits".
  ValueId logits(ValueId features, const std::string& name, int64_t num_classes);
  // nn.LayerNorm over the last dim: scale 1, bias 0.
  ValueId layer_norm(ValueId x, const std::string& name, double epsilon);
  // A scalar constant node in the zoo's dtype.
  ValueId scalar(double value);
  // Names `y` "logits" and makes it the graph's output.
  void mark_logits(ValueId y);
  // Multi-head attention's pieces, as PyTorch writes them (fuse_attention recognises the
  // chain): packed [B, T, 3 W] (torchvision's in_proj, HF's c_attn) -> q, k, v [B, heads, T,
  // W / heads]; the scores q k^T / sqrt(d) [B, H, T, T]; softmax(scores) v merged back to
  // [B, T, W].
  std::array<ValueId, 3> split_heads(ValueId qkv, const std::string& name, int64_t heads);
  ValueId scaled_scores(ValueId q, ValueId k, const std::string& name);
  ValueId attend(ValueId scores, ValueId v, const std::string& name);
  // For architectures built without the statistics estimate (mobilenet.cpp, unet.cpp): a
  // kxk conv padded (k-1)/2 with weights ~N(0, 2 / fan_in) (He: activations keep their scale
  // through batch norms in their initial state), an optional zero bias; and a batch norm in
  // PyTorch's initial state (scale 1, bias 0, mean 0, var 1), training form per ZooOptions.
  // `momentum` is ONNX's (PyTorch's 0.1 is 0.9).
  ValueId he_conv(ValueId x, const std::string& name, int64_t out, int64_t kernel, int64_t stride,
                  int64_t groups, bool bias);
  ValueId initial_batch_norm(ValueId x, const std::string& name, double epsilon, double momentum);

 private:
  // A constant named `name` whose element i is draw(rng, i), drawn in order.
  template <class Draw>
  Tensor parameter(const std::string& name, const Shape& shape, Draw draw);
  ValueId add_parameter(const std::string& name, const Tensor& f32_values);
  const ChannelStats& stats(ValueId v) const;

  Graph& g_;
  Builder b_;
  ZooOptions opts_;
  std::map<ValueId, ChannelStats> stats_;
};

// zoo.cpp dispatches to these; options are already validated.
Graph build_resnet(const std::string& name, const ZooOptions& opts);
Graph build_small_cnn(const ZooOptions& opts);
Graph build_vit(const std::string& name, const ZooOptions& opts);
Graph build_convnext(const std::string& name, const ZooOptions& opts);
Graph build_gpt2(const std::string& name, const ZooOptions& opts);
Graph build_mobilenet_v3(const std::string& name, const ZooOptions& opts);
Graph build_unet(const std::string& name, const ZooOptions& opts);

}  // namespace fusebox::zoo
