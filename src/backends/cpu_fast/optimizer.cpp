// The SGD update on the fast CPU path (a training step's one node per parameter tensor): the
// reference kernel's formula (backends/cpu/optimizer.cpp, PyTorch's SGD),
//   g = grad + weight_decay * param; buf = momentum * buf + (1 - dampening) * g
//   g = nesterov ? g + momentum * buf : buf (momentum != 0); param -= lr * g
// 16 lanes a step in f32 over the threads. The reference's element loop does not vectorise in
// the baseline build (its pointers may alias: the updates write in place), and was a fifth of
// ResNet-18's CPU training step. The values may differ from the reference's by the fused
// multiply-adds the vector clones contract (within the tests' tolerance). The plain form
// only: f32 state, no loss scale, skip or low copy (those run on the reference kernel).
#include <algorithm>
#include <cstring>

#include "backends/cpu_fast/kernels.h"
#include "backends/cpu_fast/threads.h"

namespace fusebox::cpu_fast {
namespace {

constexpr int64_t kLanes = 16;
using Lanes = float __attribute__((vector_size(kLanes * sizeof(float))));

struct SgdArgs {
  const float *param, *grad, *buf;
  float *new_param, *new_buf;
  float rate, momentum, keep, decay;
  bool use_momentum, nesterov;
};

// Elements [first, last): each read before its outputs are written (they may be its inputs'
// bytes: the step updates its state in place).
__attribute__((target_clones("avx512f", "avx2", "default"))) void sgd_range(const SgdArgs& a,
                                                                            int64_t first,
                                                                            int64_t last) {
  int64_t i = first;
  for (; i + kLanes <= last; i += kLanes) {
    Lanes p, g, b;
    std::memcpy(&p, a.param + i, sizeof(p));
    std::memcpy(&g, a.grad + i, sizeof(g));
    std::memcpy(&b, a.buf + i, sizeof(b));
    g += a.decay * p;
    b = a.momentum * b + a.keep * g;
    if (a.use_momentum) g = a.nesterov ? g + a.momentum * b : b;
    p -= a.rate * g;
    std::memcpy(a.new_param + i, &p, sizeof(p));
    std::memcpy(a.new_buf + i, &b, sizeof(b));
  }
  for (; i < last; ++i) {
    const float p = a.param[i];
    float g = a.grad[i] + a.decay * p;
    const float b = a.momentum * a.buf[i] + a.keep * g;
    if (a.use_momentum) g = a.nesterov ? g + a.momentum * b : b;
    a.new_param[i] = p - a.rate * g;
    a.new_buf[i] = b;
  }
}

class SgdKernel final : public Kernel {
 public:
  explicit SgdKernel(SgdAttrs attrs) : attrs_(attrs) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    const Tensor& lr = *in[3];
    FUSEBOX_CHECK(lr.numel() == 1, "sgd_update", "lr must be a scalar but is ",
                  shape_str(lr.shape()));
    const SgdArgs a{in[0]->data<float>(),
                    in[1]->data<float>(),
                    in[2]->data<float>(),
                    out[0].data<float>(),
                    out[1].data<float>(),
                    float(lr.get(0)),
                    float(attrs_.momentum),
                    float(1.0 - attrs_.dampening),
                    float(attrs_.weight_decay),
                    attrs_.momentum != 0.0,
                    attrs_.nesterov};
    // Chunks of whole vector steps, so that only the last one has a remainder.
    const int64_t steps = (in[0]->numel() + kLanes - 1) / kLanes, total = in[0]->numel();
    split_over_threads(steps, 4096, [&](int64_t s0, int64_t s1) {
      sgd_range(a, s0 * kLanes, std::min(total, s1 * kLanes));
    });
  }

  std::string describe() const override { return "own sgd_update (16 lanes a step)"; }

 private:
  SgdAttrs attrs_;
};

}  // namespace

Planned plan_sgd(const Graph& g, const Node& n) {
  auto refuse = [](std::string why) { return Planned{nullptr, std::move(why)}; };
  if (n.inputs.size() > 4)
    for (size_t i = 4; i < n.inputs.size(); ++i)
      if (n.inputs[i] != kNoValue)
        return refuse("a loss scale, skip or low copy (the plain form only)");
  for (size_t i = 0; i < 3; ++i)
    if (g.value(n.inputs[i]).type.dtype != DType::f32) return refuse("not f32 state");
  return {std::make_unique<SgdKernel>(std::get<SgdAttrs>(n.attrs)), ""};
}

}  // namespace fusebox::cpu_fast
