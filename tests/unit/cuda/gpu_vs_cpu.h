// Helpers for testing CUDA op kernels against the CPU backend: a kernel Context on device 0,
// one-node graphs for normalised Nodes, host <-> device tensors (and strided views of them),
// and running one kernel entry with poisoned outputs.
//
//   FUSEBOX_REQUIRE_GPU();
//   OpHarness h;
//   Tensor x = random_tensor(DType::f32, {7, 5}, 1);
//   std::vector<Tensor> want = fusebox::testing::run_op(OpKind::relu, {}, {x});
//   std::vector<Tensor> got = h.run(unary, OpKind::relu, {}, {x});
//   EXPECT_TRUE(all_close(got[0], want[0], 0, 0));
//
// Views: h.view(base, shape, strides, offset) uploads `base` and returns a DeviceTensor
// viewing it; gather(base, ...) is the same view's contents as a contiguous host tensor
// (what the CPU reference gets).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/runtime/error_flags.h"
#include "cuda_test_util.h"
#include "testing.h"

namespace fusebox::cuda::testing {

using KernelEntry = void (*)(Context&, const Node&, Inputs, Outputs);

// The normalised node of a one-node graph over inputs of these types (an undefined tensor
// is an absent optional input), and its output types.
struct BuiltNode {
  Node node;
  std::vector<TensorType> outputs;
};
inline BuiltNode build_node(OpKind op, Attrs attrs, const std::vector<Tensor>& inputs) {
  Graph g("gpu_vs_cpu");
  std::vector<ValueId> ids;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ids.push_back(inputs[i].defined()
                      ? g.add_input(cat("in", i), inputs[i].dtype(), inputs[i].shape())
                      : kNoValue);
  }
  std::vector<ValueId> outs = g.add_node(op, std::move(attrs), ids, "node");
  BuiltNode built{g.nodes().back(), {}};
  for (ValueId v : outs) built.outputs.push_back(g.value(v).type);
  return built;
}

// Contiguous host copy of a view of `base` (offset and strides in elements).
inline Tensor gather(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset) {
  Tensor out = Tensor::empty(base.dtype(), shape);
  const size_t elem = dtype_size(base.dtype());
  Shape coord(shape.size(), 0);
  for (int64_t i = 0; i < out.numel(); ++i) {
    int64_t src = offset, rem = i;
    for (size_t d = shape.size(); d-- > 0;) {
      coord[d] = rem % shape[d];
      rem /= shape[d];
      src += coord[d] * strides[d];
    }
    std::memcpy(static_cast<char*>(out.raw()) + size_t(i) * elem,
                static_cast<const char*>(base.raw()) + size_t(src) * elem, elem);
  }
  return out;
}

class OpHarness {
 public:
  OpHarness()
      : device_(Device::get(0)),
        encoder_(CommandEncoder::for_device(0)),
        allocator_(CachingAllocator::for_device(0)),
        ctx_{device_, encoder_, allocator_} {}

  Context& ctx() { return ctx_; }
  CommandEncoder& encoder() { return encoder_; }

  DeviceTensor upload(const Tensor& t) {
    DeviceTensor d = DeviceTensor::empty(allocator_, t.dtype(), t.shape());
    encoder_.copy_to_device(d.range(), t.raw());
    return d;
  }
  Tensor download(const DeviceTensor& d) {
    EXPECT_TRUE(d.is_contiguous());
    Tensor t = Tensor::empty(d.dtype, d.shape);
    encoder_.copy_to_host(t.raw(), d.range());
    return t;
  }
  // `base` uploaded, viewed with shape/strides/offset.
  DeviceTensor view(const Tensor& base, Shape shape, Shape strides, int64_t offset = 0) {
    DeviceTensor d = upload(base);
    d.shape = std::move(shape);
    d.strides = std::move(strides);
    d.offset = offset;
    return d;
  }
  // A fresh output with every byte 0xFF (NaN for floats), written by a recorded memset.
  DeviceTensor poisoned(const TensorType& type) {
    DeviceTensor d = DeviceTensor::empty(allocator_, type.dtype, type.shape);
    encoder_.memset(d.range(), 0xFF);
    return d;
  }

  // Runs `entry` for `node` on device inputs (nullptr: absent), outputs poisoned first;
  // synchronises, checks the error flags (throws the node's Error), downloads.
  std::vector<Tensor> run_device(KernelEntry entry, const BuiltNode& built,
                                 const std::vector<const DeviceTensor*>& inputs) {
    std::vector<DeviceTensor> outputs;
    for (const TensorType& type : built.outputs) outputs.push_back(poisoned(type));
    entry(ctx_, built.node, inputs, outputs);
    encoder_.synchronize();
    check_error_flags(ctx_);
    std::vector<Tensor> result;
    for (const DeviceTensor& d : outputs) result.push_back(download(d));
    return result;
  }

  // The same from host tensors (uploaded contiguous; undefined: absent).
  std::vector<Tensor> run(KernelEntry entry, OpKind op, Attrs attrs,
                          const std::vector<Tensor>& inputs) {
    const BuiltNode built = build_node(op, std::move(attrs), inputs);
    std::vector<DeviceTensor> device(inputs.size());
    std::vector<const DeviceTensor*> pointers;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined()) device[i] = upload(inputs[i]);
      pointers.push_back(inputs[i].defined() ? &device[i] : nullptr);
    }
    return run_device(entry, built, pointers);
  }

 private:
  Device& device_;
  CommandEncoder& encoder_;
  CachingAllocator& allocator_;
  Context ctx_;
};

// Tolerances for comparing against the CPU reference (which computes in f64 where the
// GPU uses f32): a few ulps of the output dtype, f32 arithmetic error for f32.
struct Tolerance {
  double rtol, atol;
};
inline Tolerance tolerance_for(DType t) {
  switch (t) {
    case DType::f64:
      return {1e-12, 1e-12};
    case DType::f32:
      return {2e-5, 2e-6};
    case DType::f16:
      return {2e-3, 2e-3};
    case DType::bf16:
      return {1.6e-2, 1.6e-2};
    default:
      return {0, 0};
  }
}

inline const DType kFloatTypes[] = {DType::f32, DType::f16, DType::bf16, DType::f64};

}  // namespace fusebox::cuda::testing
