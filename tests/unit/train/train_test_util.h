// Shared pieces of the training tests: small models, batches, bitwise comparisons.
#pragma once

#include <cstring>
#include <string>

#include "fusebox/ir/builder.h"
#include "fusebox/train/data.h"
#include "fusebox/train/session.h"
#include "fusebox/zoo.h"
#include "testing.h"

namespace fusebox::testing {

// logits = x W^T + b: x [batch, features] ("x"), fc.weight [classes, features], fc.bias.
inline Graph linear_model(int64_t batch, int64_t features, int64_t classes, uint64_t seed) {
  Graph g("linear");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {batch, features});
  ValueId w = g.add_constant("fc.weight", random_tensor(DType::f32, {classes, features}, seed));
  ValueId bias = g.add_constant("fc.bias", random_tensor(DType::f32, {classes}, seed + 1));
  ValueId logits = b.name("fc").gemm(x, w, bias, GemmAttrs{.trans_b = true});
  g.rename_value(logits, "logits");
  g.mark_output(logits);
  return g;
}

// small_cnn in training form, 10 classes.
inline Graph small_cnn(int64_t batch, int64_t image_size, uint64_t seed = 3) {
  return build_zoo_model("small_cnn", {.batch = batch,
                                       .image_size = image_size,
                                       .num_classes = 10,
                                       .seed = seed,
                                       .training = true});
}

// Batch `i` of the synthetic set as a zoo model's feeds ("input", "labels").
inline NamedTensors zoo_batch(const BatchSampler& sampler, int64_t i) {
  auto [x, y] = sampler.batch(i);
  return {{"input", x}, {"labels", y}};
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

inline bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// Every tensor of both maps has the same name, dtype, shape and bytes.
inline ::testing::AssertionResult same_tensors(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << a.size() << " tensors vs " << b.size();
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end()) return ::testing::AssertionFailure() << "'" << name << "' missing";
    if (!same_bits(t, it->second))
      return ::testing::AssertionFailure() << "'" << name << "' differs";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace fusebox::testing
