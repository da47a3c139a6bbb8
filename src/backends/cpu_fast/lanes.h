// The fast CPU kernels' own vector loops (Winograd transforms, training batch norms, optimizer
// updates): 16 floats a step as GCC's vector extension, compiled as clones for AVX-512, AVX2
// and the baseline, chosen at load time. One AVX-512 register in the AVX-512 clone, two AVX2 or
// four SSE registers in the others.
//
// Vectors go by reference only, never by value through a function that is not inlined: a
// vector argument or result has another ABI in each clone's target (-Wpsabi).
#pragma once

#include <cstdint>
#include <cstring>

namespace fusebox::cpu_fast {

constexpr int64_t kLanes = 16;
using Lanes = float __attribute__((vector_size(kLanes * sizeof(float))));

// On a function whose loops use Lanes: one clone per target.
#define FUSEBOX_LANES_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

// 16 floats at p (unaligned) into v, and back.
inline void load_lanes(const float* p, Lanes& v) {
  std::memcpy(&v, p, sizeof(v));
}
inline void store_lanes(float* p, const Lanes& v) {
  std::memcpy(p, &v, sizeof(v));
}

}  // namespace fusebox::cpu_fast
