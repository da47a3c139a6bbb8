// What the oneDNN kernels share: the process's CPU engine, plain memory descriptors of dense
// tensors, the fused activations as eltwise post-ops, and running a primitive on a stream.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <optional>
#include <string>
#include <unordered_map>

#include "fusebox/backends/cpu_fast.h"
#include "fusebox/ir/graph.h"

namespace fusebox::cpu_fast {

dnnl::engine& cpu_engine();

// A value a oneDNN kernel left in its primitive's layout (fusebox/backends/cpu_fast.h).
struct OnednnValue final : OwnLayout {
  explicit OnednnValue(dnnl::memory m) : memory(std::move(m)) {}
  dnnl::memory memory;
};

// Executes `p` with `args` on a stream of the engine and waits for it.
void execute(const dnnl::primitive& p, const std::unordered_map<int, dnnl::memory>& args);

// oneDNN's data type for f32, bf16 and f16; none for the others.
std::optional<dnnl::memory::data_type> data_type_of(DType t);

// A dense row-major tensor of `dims` (f32 unless said).
dnnl::memory::desc plain_desc(const dnnl::memory::dims& dims, DType dtype = DType::f32);
dnnl::memory::dims dims_of(const Shape& s);

// Wraps host bytes (not owned) as a memory of `desc`.
dnnl::memory wrap(const dnnl::memory::desc& desc, const void* data);

// oneDNN's eltwise for activation `a`: its algorithm and parameters; none (with `why` said)
// where oneDNN has no such eltwise, or for no activation.
struct Eltwise {
  dnnl::algorithm algorithm;
  float alpha, beta;
};
std::optional<Eltwise> eltwise_of(const FusedActivation& a, std::string* why);

// Appends `a` as an eltwise post-op; false (nothing appended) where oneDNN has no such
// eltwise, with `why` said.
bool append_activation(dnnl::post_ops& ops, const FusedActivation& a, std::string* why);

// `data` (plain, `plain`) in `want`'s layout: the same memory where they agree, else a
// reordered copy (allocated by oneDNN).
dnnl::memory in_layout(const dnnl::memory& data, const dnnl::memory::desc& want);

// A copy of constant `t` (dense, described by `given`) in `want`'s layout, in memory of its own
// (so the kernel outlives the graph's tensor): prepared weights.
dnnl::memory prepared_copy(const Tensor& t, const dnnl::memory::desc& given,
                           const dnnl::memory::desc& want);

// The implementation oneDNN chose, for --report ("brg:avx2", "jit:avx2", "gemm:jit").
template <class PrimitiveDesc>
std::string implementation(const PrimitiveDesc& pd) {
  return pd.impl_info_str();
}

}  // namespace fusebox::cpu_fast
