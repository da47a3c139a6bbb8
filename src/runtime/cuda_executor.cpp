// Runs a graph on the CUDA backend: inputs and constants are uploaded once at the
// graph boundary, every node is recorded on the device's command encoder (one CUDA
// graph per run, replayed from the encoder's cache on the next run of the same
// graph), outputs are downloaded at the end. Intermediates return to the caching
// allocator after their last reader is recorded (the encoder keeps them alive until
// the GPU is done with them).
#include "runtime/cuda_executor.h"

#include <algorithm>

#include "backends/cuda/error_flags.h"
#include "backends/cuda/kernels.h"

namespace fusebox {

namespace {

cuda::DeviceTensor upload(cuda::Context& ctx, const Tensor& t) {
  cuda::DeviceTensor d = cuda::DeviceTensor::empty(ctx.allocator, t.dtype(), t.shape());
  if (t.nbytes() > 0) ctx.encoder.copy_to_device(d.buffer, t.raw());
  return d;
}

Tensor download(cuda::Context& ctx, const cuda::DeviceTensor& d) {
  Tensor t = Tensor::empty(d.dtype, d.shape);
  if (t.nbytes() == 0) return t;
  if (d.is_contiguous()) {
    ctx.encoder.copy_to_host(
        t.raw(), cuda::BufferRange(d.buffer, size_t(d.offset) * dtype_size(d.dtype), t.nbytes()));
    return t;
  }
  cuda::DeviceTensor c = cuda::DeviceTensor::empty(ctx.allocator, d.dtype, d.shape);
  cuda::copy_strided(ctx, d, c);
  ctx.encoder.copy_to_host(t.raw(), c.buffer);
  return t;
}

}  // namespace

NamedTensors run_graph_cuda(const Graph& g, const NamedTensors& feeds, const RunOptions& opts) {
  cuda::Device& device = cuda::Device::get(0);
  cuda::Context ctx{device, cuda::CommandEncoder::for_device(0),
                    cuda::CachingAllocator::for_device(0)};

  std::vector<cuda::DeviceTensor> slots(g.values().size());
  std::vector<int> remaining_reads = count_reads(g);
  for (const auto& [v, t] : g.constants()) {
    if (remaining_reads[size_t(v)] > 0) slots[size_t(v)] = upload(ctx, t);
  }
  for (ValueId v : g.inputs()) slots[size_t(v)] = upload(ctx, feeds.at(g.value(v).name));

  std::vector<const cuda::DeviceTensor*> in_ptrs;
  std::vector<cuda::DeviceTensor> outs;
  for (const Node& n : g.nodes()) {
    in_ptrs.clear();
    for (ValueId v : n.inputs) in_ptrs.push_back(v == kNoValue ? nullptr : &slots[size_t(v)]);
    outs.clear();
    for (ValueId v : n.outputs) {
      const TensorType& t = g.value(v).type;
      outs.push_back(cuda::DeviceTensor::empty(ctx.allocator, t.dtype, t.shape));
      if (opts.poison_outputs) ctx.encoder.memset(outs.back().range(), 0xff);
    }
    cuda::run_node(ctx, n, in_ptrs, outs);
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      ValueId v = n.outputs[i];
      if (remaining_reads[size_t(v)] > 0) slots[size_t(v)] = std::move(outs[i]);
    }
    for (ValueId v : n.inputs)
      if (v != kNoValue && --remaining_reads[size_t(v)] == 0) slots[size_t(v)] = {};
  }
  ctx.encoder.synchronize();
  cuda::check_error_flags(ctx);  // throws an Error naming the node whose kernel flagged bad data

  NamedTensors result;
  for (ValueId v : g.outputs()) result[g.value(v).name] = download(ctx, slots[size_t(v)]);
  return result;
}

}  // namespace fusebox
