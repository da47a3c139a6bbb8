// Programmatic dependent launch, the device side (runtime/encoder.h: "Early launches").
//
// A kernel recorded with CommandEncoder::launch_early calls wait_for_prior_grids() first, in
// every thread, before it reads or writes memory: its blocks may have been scheduled while the
// kernels it depends on were still running, and the wait returns once those have completed
// and their writes are visible. Every block waits, even one with no work, so that the
// kernel's completion still implies its predecessors' (what the encoder's implied edges rest
// on). Launched any other way (a full edge, a direct launch, FUSEBOX_CUDA_PDL=0) the wait is
// a no-op; before sm_90 it compiles to nothing.
#pragma once

namespace fusebox::cuda {

__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace fusebox::cuda
