// Whether a usable GPU is present: the runtime's entry point into the CUDA backend
// (executable/run_graph.cpp declares it by hand, so it stays a plain function).
#include "backends/cuda/runtime/device.h"

namespace fusebox::cuda {

// True when the CUDA runtime loads and reports at least one device. Never throws:
// a machine without a driver (CI) simply has no GPU.
bool device_present() {
  return device_count() > 0;
}

}  // namespace fusebox::cuda
