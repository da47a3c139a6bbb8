// Small kernels for the CUDA backend's tests, defined in test_kernels.cu. Host code gets
// their launch handles (host stubs) through these functions.
#pragma once

#include <cstdint>

namespace fusebox::cuda::testing {

// Test kernels. Each thread first spins for spin_ns nanoseconds of GPU time (to keep a
// kernel running long enough that a missing dependency edge shows in the result), then
// works through a grid-stride loop.
using FillKernel = void (*)(float* y, float value, int n, uint64_t spin_ns);  // y[i] = value
using AddKernel = void (*)(const float* x, float* y, float addend, int n,
                           uint64_t spin_ns);  // y[i] = x[i] + addend
// One block: stages x in dynamic shared memory (n floats), then writes it reversed to y.
using ReverseKernel = void (*)(const float* x, float* y, int n);
FillKernel fill_kernel();
AddKernel add_kernel();
ReverseKernel reverse_through_shared_kernel();

}  // namespace fusebox::cuda::testing
