// What every kernel entry records its work with: the device, the command encoder of the
// step being recorded, and the allocator its outputs and temporaries come from.
#pragma once

#include "backends/cuda/runtime/allocator.h"
#include "backends/cuda/runtime/device.h"
#include "backends/cuda/runtime/encoder.h"

namespace fusebox::cuda {

struct Context {
  Device& device;
  CommandEncoder& encoder;
  CachingAllocator& allocator;
};

}  // namespace fusebox::cuda
