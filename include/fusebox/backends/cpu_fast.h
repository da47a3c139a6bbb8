// The fast CPU kernels (issue 43): oneDNN's primitives for the nodes it has, and the project's
// block interpreter for generated pointwise programs, each made once when an executable is
// compiled (the primitive chosen for the problem, constant weights reordered into the layout
// it reads), then only executed. A node no fast kernel takes runs on the reference kernels
// (fusebox/backends/cpu.h); plan() says why it was not taken. oneDNN's nodes are within a
// documented tolerance of the reference (its sums run in another order; docs/cpu_fast.md);
// the pointwise programs are the reference's bits.
//
// Taken now: convolutions (1-3 spatial dims, groups, dilation, padding; bias, the fused
// activations and residual add of ConvAttrs as post-ops), gemm (a bias vector, alpha 1,
// the fused activation), matmul (rank 2-4, batch broadcast), max/average/global average
// pooling (no indices), softmax and log-softmax, layer norm (inference: statistics unread),
// in f32; fused_pointwise programs of f32, bf16 and f16 values.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "fusebox/ir/graph.h"

namespace fusebox::cpu_fast {

// Whether this build has oneDNN (scripts/setup.sh puts it in .deps-cpu/); without it every
// node runs on the reference kernels.
bool built_with_onednn();

class Kernel {
 public:
  virtual ~Kernel() = default;
  // Runs the node: inputs as the executable holds them (host, dense, the graph's types),
  // outputs allocated dense with the node's types.
  virtual void run(std::span<const Tensor* const> inputs, std::span<Tensor> outputs) = 0;
  // "oneDNN conv brgconv:avx2 (weights reordered once)": for --report.
  virtual std::string describe() const = 0;
};

struct Planned {
  std::unique_ptr<Kernel> kernel;  // null: the reference kernels run the node
  std::string why_not;             // then: why no fast kernel takes it
};

// The kernel for node `n` of `g`, made now: its constant inputs (weights) are read from
// `g` and prepared once.
Planned plan(const Graph& g, const Node& n);

}  // namespace fusebox::cpu_fast
