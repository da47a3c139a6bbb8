// Small kernels for the encoder tests (see cuda_test_util.h).
#include <cstdint>

#include "test_kernels.h"

namespace fusebox::cuda::testing {
namespace {

__device__ uint64_t global_time_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ void spin(uint64_t ns) {
  if (ns == 0) return;
  uint64_t start = global_time_ns();
  while (global_time_ns() - start < ns) {
  }
}

__global__ void fill(float* y, float value, int n, uint64_t spin_ns) {
  spin(spin_ns);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    y[i] = value;
  }
}

__global__ void add(const float* x, float* y, float addend, int n, uint64_t spin_ns) {
  spin(spin_ns);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    y[i] = x[i] + addend;
  }
}

__global__ void reverse_through_shared(const float* x, float* y, int n) {
  extern __shared__ float staged[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) staged[i] = x[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = staged[n - 1 - i];
}

}  // namespace

FillKernel fill_kernel() {
  return fill;
}
AddKernel add_kernel() {
  return add;
}
ReverseKernel reverse_through_shared_kernel() {
  return reverse_through_shared;
}

}  // namespace fusebox::cuda::testing
