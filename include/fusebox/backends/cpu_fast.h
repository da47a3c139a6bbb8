// The fast CPU kernels (issue 43): oneDNN's primitives for the nodes it has, and the project's
// block interpreter for generated pointwise programs, each made once when an executable is
// compiled (the primitive chosen for the problem, constant weights reordered into the layout
// it reads), then only executed. A node no fast kernel takes runs on the reference kernels
// (fusebox/backends/cpu.h); plan() says why it was not taken. oneDNN's nodes are within a
// documented tolerance of the reference (its sums run in another order; docs/cpu_fast.md);
// the pointwise programs are the reference's bits.
//
// Taken now: convolutions (1-3 spatial dims, groups, dilation, padding; bias, the fused
// activations and residual add of ConvAttrs as post-ops), their backward data (no bias) and
// filter gradients (training steps), gemm (a bias vector, alpha 1,
// the fused activation), matmul (rank 2-4, batch broadcast), max/average/global average
// pooling (no indices), unary activations (relu, gelu, sigmoid, tanh, silu), add / sub / mul /
// div (a broadcast second operand, or first for add and mul), layer norm
// (inference: statistics unread), attention (inference, causal or not), in f32 or, where
// the CPU computes in them, bf16 / f16; softmax and log-softmax in f32; fused_pointwise
// programs of f32, bf16 and f16 values.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "fusebox/ir/graph.h"

namespace fusebox::cpu_fast {

// Whether this build has oneDNN (scripts/setup.sh puts it in .deps-cpu/); without it every
// node runs on the reference kernels.
bool built_with_onednn();

// A value a fast kernel left in its own layout (oneDNN's blocked formats) for readers that
// take it: opaque to the executable, which holds it between the writer and its last reader
// instead of the dense tensor. Why: ResNet-50's convolutions at batch 8 on 2 cores spent 40%
// of their time reordering activations between the dense layout and oneDNN's.
class OwnLayout {
 public:
  virtual ~OwnLayout() = default;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  // Runs the node: inputs as the executable holds them (host, dense, the graph's types),
  // outputs allocated dense with the node's types.
  virtual void run(std::span<const Tensor* const> inputs, std::span<Tensor> outputs) = 0;
  // "oneDNN conv brgconv:avx2 (weights reordered once)": for --report.
  virtual std::string describe() const = 0;

  // Own layouts, asked once at compile: whether the kernel can leave output 0 in its own
  // layout, and read input `i` in the layout another kernel left it in. The executable keeps
  // a value in its writer's layout only where every reader takes it (and it is no graph output).
  virtual bool writes_own_layout() const { return false; }
  virtual bool reads_own_layout(size_t /*input*/) const { return false; }
  // run() with own layouts: `own_inputs` empty, or one per input, non-null where that input
  // is held in its writer's layout (its tensor is then undefined); with `own_output` the
  // kernel leaves output 0 in its own layout there (outputs[0] is then undefined and unwritten).
  // Bit i of `consumable`: this node is own input i's last reader (and reads it once), so the
  // kernel may write its output into that memory (a residual summed in place).
  virtual void run_own(std::span<const Tensor* const> inputs,
                       std::span<const OwnLayout* const> /*own_inputs*/, uint32_t /*consumable*/,
                       std::span<Tensor> outputs, std::shared_ptr<OwnLayout>* /*own_output*/) {
    run(inputs, outputs);
  }
};

struct Planned {
  std::unique_ptr<Kernel> kernel;  // null: the reference kernels run the node
  std::string why_not;             // then: why no fast kernel takes it
};

// The kernel for node `n` of `g`, made now: its constant inputs (weights) are read from
// `g` and prepared once.
Planned plan(const Graph& g, const Node& n);

}  // namespace fusebox::cpu_fast
