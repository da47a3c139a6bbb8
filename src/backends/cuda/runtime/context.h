// What every kernel entry records its work with: the device, the command encoder of the
// step being recorded, the allocator its outputs and temporaries come from, and the
// data-parallel world its collectives reduce over (null: a world of one).
#pragma once

#include "backends/cuda/runtime/allocator.h"
#include "backends/cuda/runtime/device.h"
#include "backends/cuda/runtime/encoder.h"
#include "backends/cuda/runtime/tensor.h"

namespace fusebox::cuda {

class NcclCommunicator;  // runtime/nccl.h

struct Context {
  Device& device;
  CommandEncoder& encoder;
  CachingAllocator& allocator;
  NcclCommunicator* world = nullptr;
};

// A temporary of the operation being recorded (CommandEncoder::temporary): bytes of the
// compiled executable's arena when it lends a region, else a buffer held with the recording.
inline DeviceTensor temporary_tensor(Context& ctx, DType dtype, Shape shape,
                                     MemoryFormat format = MemoryFormat::contiguous) {
  const size_t bytes = size_t(numel(shape)) * dtype_size(dtype);
  return DeviceTensor::over(ctx.encoder.temporary(ctx.allocator, bytes), dtype, std::move(shape),
                            format);
}

}  // namespace fusebox::cuda
