// Internals shared by the layer_norm / rms_norm backward files: norm_backward.cu (the
// register and long-row paths, the planner, the launch), norm_backward_staged.cu (the
// staged path) and norm_backward_op.cu (the IR ops and the direct-call entry points).
// Include from .cu files only.
#pragma once

#include <string>

#include "backends/cuda/kernels.h"
#include "backends/cuda/norm_rows.cuh"

namespace fusebox::cuda::norm {

// The arguments of every backward kernel; S is the statistics' type (stats_t<T>).
template <class T, class S>
struct BackwardArgs {
  const T* x;
  const T* dy;
  const T* scale;  // [cols] or null
  const S* mean;   // [rows] (layer_norm) or null (rms_norm)
  const S* rstd;   // [rows]
  T* dx;
  S* partial_scale;  // [parts, cols] or null (dscale not wanted)
  S* partial_bias;   // [parts, cols] or null (dbias not wanted, or rms_norm)
  int64_t rows;
  int64_t cols;
  int threads_per_row;  // register and staged paths only
};

template <class T>
using BackwardKernel = BoundKernel<void (*)(BackwardArgs<T, float>)>;

// Register spills up to this many bytes per thread are accepted (a word or two saved once);
// more are not: such a layout is skipped.
constexpr size_t kMaxSpillBytes = 16;

// Whether the loaded kernel keeps (nearly) everything in registers: local memory of at
// most kMaxSpillBytes per thread.
template <class T>
bool spill_free(const BackwardKernel<T>& k, const DeviceProperties& props) {
  const DeviceGuard guard(props.id);
  const void* fn = reinterpret_cast<const void*>(k.fn);
  return kernel_limits(fn, props.id).local_bytes <= kMaxSpillBytes;
}

// The staged path's layout for aligned rows of `cols` elements (cols % W == 0), when the
// variant asks for it and one fits; plan.fast == false otherwise (norm_backward_staged.cu;
// instantiated for f32, f16 and bf16).
template <class T, bool kCentre>
RowPlan plan_backward_staged(Context& ctx, int64_t rows, int64_t cols, BackwardKernel<T>* kernel);

// The tensors of one layer_norm / rms_norm backward call (kernels.h describes them).
struct BackwardTensors {
  const DeviceTensor& x;
  const DeviceTensor& dy;
  const DeviceTensor* scale;
  const DeviceTensor* mean;
  const DeviceTensor& rstd;
  DeviceTensor& dx;
  DeviceTensor* dscale;
  DeviceTensor* dbias;
};

// Checks the tensors and runs the backward (dscale / dbias [cols], or null).
void norm_backward(Context& ctx, const std::string& where, const BackwardTensors& b, bool centre);

// The partial rows of the column sums (parts x cols each, in the statistics' type; an
// empty buffer for a gradient not wanted): one per block of the register and staged paths,
// one per chunk of rows on the long-row path.
struct PartialRows {
  DeviceBuffer scale, bias;
  int64_t parts = 0;
};

// Allocates the partial rows of the wanted gradients (temporaries of the encoder) and
// points `args` at them.
template <class T, class S>
PartialRows make_partial_rows(Context& ctx, const BackwardTensors& b, int64_t parts,
                              BackwardArgs<T, S>& args) {
  PartialRows p;
  p.parts = parts;
  const size_t bytes = size_t(parts * args.cols) * sizeof(S);
  auto make = [&](DeviceBuffer& buffer, S*& pointer) {
    buffer = ctx.allocator.allocate(bytes);
    ctx.encoder.add_temporary(buffer);
    pointer = buffer.as<S>();
  };
  if (b.dscale) make(p.scale, args.partial_scale);
  if (b.dbias) make(p.bias, args.partial_bias);
  return p;
}

// The byte ranges of the partial rows (what a kernel that writes them declares).
template <class S>
BufferList partial_ranges(const PartialRows& p, int64_t cols) {
  BufferList list;
  const size_t bytes = size_t(p.parts * cols) * sizeof(S);
  for (const DeviceBuffer* buffer : {&p.scale, &p.bias})
    if (*buffer) list.push_back(BufferRange(*buffer, 0, bytes));
  return list;
}

// Sums the partial rows into dscale and dbias ([cols]; either may be null), in a fixed
// order (norm_backward_partials.cu). S is float or double.
template <class S>
void finish_partials(Context& ctx, const PartialRows& p, int64_t cols, DeviceTensor* dscale,
                     DeviceTensor* dbias);

// The long-row path (norm_backward.cu's file comment): dx, then the column sums by chunks
// of rows, then finish_partials. Instantiated for f64, f32, f16 and bf16.
template <class T, bool kCentre>
void launch_long_backward(Context& ctx, const BackwardTensors& b, BackwardArgs<T, stats_t<T>> args,
                          const BufferList& reads);

}  // namespace fusebox::cuda::norm
