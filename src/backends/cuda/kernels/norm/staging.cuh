// Asynchronous global -> shared copies of the staged norm kernels (kernels/norm/forward_staged.cu,
// kernels/norm/backward_staged.cu): each thread copies its own 16-byte vectors of a row into its
// own slots of a stage, rows ahead of use, and reads back only what it copied, so the
// data needs no barrier (cp.async.wait_group orders a thread's own copies). Include from
// .cu files only.
#pragma once

#include <cuda_runtime.h>

#include "backends/cuda/kernels/norm/rows.cuh"

namespace fusebox::cuda::norm {

constexpr int kStagedBlock = 1024;  // threads per block of a staged kernel, at most

// 16 bytes global -> shared (a shared-window address), asynchronously, evict-first in L2
// (rows are read once, as the register paths' __ldcs); complete after a later
// wait_copies. The policy is made at each use: cheaper than a register pair held throughout.
__device__ __forceinline__ void copy_async16(unsigned shared, const void* global) {
  asm volatile(
      "{\n .reg .b64 policy;\n"
      " createpolicy.fractional.L2::evict_first.b64 policy, 1.0;\n"
      " cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, policy;\n}" ::"r"(shared),
      "l"(global)
      : "memory");
}
// Stores 16 bytes at a shared-window address.
__device__ __forceinline__ void store_shared16(unsigned shared, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(shared), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
// The 16 bytes at a shared-window address.
__device__ __forceinline__ uint4 load_shared16(unsigned shared) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(shared)
               : "memory");
  return v;
}
// Closes the group of copies issued since the last commit.
__device__ __forceinline__ void commit_copies() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
template <class T>
__device__ __forceinline__ Packed packed(const uint4& u) {
  return {{u.x, u.y, u.z, u.w}};
}

}  // namespace fusebox::cuda::norm
