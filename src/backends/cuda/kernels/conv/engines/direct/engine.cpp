// The direct engine: the direct kernels (direct.h), the test oracle and the last resort for
// what no other engine takes (f64, ...). They read contiguous operands (strided views are
// copied first, a strided output written through a contiguous temporary) and add the bias
// themselves; the rest of the epilogue is kernels/conv/conv.cpp's pass over y.
#include <algorithm>
#include <vector>

#include "backends/cuda/kernels/conv/direct.h"
#include "backends/cuda/kernels/conv/engines/engine_list.h"

namespace fusebox::cuda {
namespace {

using DirectEntry = void (*)(Context&, const Node&, Inputs, Outputs);

DirectEntry direct_entry(ConvOp op) {
  switch (op) {
    case ConvOp::fprop:
      return &conv_forward_direct;
    case ConvOp::dgrad:
      return &conv_backward_data_direct;
    default:
      return &conv_backward_filter_direct;
  }
}

class DirectEngine final : public ConvEngine {
 public:
  const char* name() const override { return "direct"; }
  bool implements(ConvOp) const override { return true; }

  std::optional<std::string> cannot_implement(const ConvCall& call) const override {
    return variant_refusal(call.variant);
  }

  ConvEnginePlan plan(const ConvCall& call) const override {
    return {call.variant, call.epilogue.bias != nullptr ? ConvFusion::bias : ConvFusion::none};
  }

  ConvRecorded record(Context& ctx, const ConvCall& call,
                      const ConvEnginePlan& plan) const override {
    // x, w and (where the plan adds it) the bias: the node's first inputs.
    const size_t taken = plan.fused == ConvFusion::bias ? 3 : 2;
    std::vector<DeviceTensor> copies;
    copies.reserve(taken + 1);
    std::vector<const DeviceTensor*> inputs(call.in.begin(),
                                            call.in.begin() + std::min(call.in.size(), taken));
    for (const DeviceTensor*& t : inputs) {
      if (t != nullptr && !t->is_contiguous()) {
        copies.push_back(temporary_tensor(ctx, t->dtype, t->shape));
        copy_strided(ctx, *t, copies.back());
        t = &copies.back();
      }
    }
    const DirectEntry entry = direct_entry(call.op());
    DeviceTensor& y = call.out[0];
    if (y.is_contiguous()) {
      entry(ctx, *call.node, inputs, call.out);
    } else {
      DeviceTensor tmp = temporary_tensor(ctx, y.dtype, y.shape);
      entry(ctx, *call.node, inputs, std::span<DeviceTensor>(&tmp, 1));
      copy_strided(ctx, tmp, y);
    }
    return {.ran = true, .fused = plan.fused, .plan = "direct"};
  }
};

}  // namespace

const ConvEngine& direct_engine() {
  static const DirectEngine engine;
  return engine;
}

}  // namespace fusebox::cuda
