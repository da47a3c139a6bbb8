// The layout pass: which values a backend stores channels-last.
//
// The IR's dims are logical (N, C, spatial...) everywhere; a value's physical order is the
// backend's choice. The CUDA backend's convolutions are fastest channels-last (cuDNN's
// NHWC engines; NCHW plans are slower and need large workspaces), so the activations and
// filters around convolutions are stored channels-last, and so is everything that flows
// between convolutions through ops that can run in either order (pointwise ops, batch
// norm, pools and their backward ops). The conversions that remain are at the edges of
// such regions: a graph input or constant is converted once when it is loaded, a graph
// output when it is read back, and an op that needs contiguous data (reshape, matmul,
// softmax, ...) gets a contiguous copy of a channels-last input.
//
// How values are chosen:
//   1. Each op has a layout role (layout_role, from the op table in ir/op_info.h):
//      `convolution` ops prefer channels-last and read their activations and filters in
//      the output's order (an input written contiguous, by a pad, is converted: a
//      conversion); `elementwise` and `channelwise` ops (concat and slice among them) run in either
//      order, with all their operands of the output's shape (elementwise) or rank
//      (channelwise) in one order; `any_order` ops (transpose) read any strides and write
//      whichever order their output is given; `contiguous` ops need contiguous inputs and
//      write contiguous outputs.
//   2. Values are joined into groups through the elementwise and channelwise ops (the
//      operands that must share an order). A group that holds an operand of a convolution
//      is stored channels-last.
//   3. A value is channels-last only when its group is, its rank is at least 3, the two
//      orders differ for its shape (not C == 1 or all spatial extents 1), and its producer
//      can write it so (a convolution, an elementwise, channelwise or any_order op, a graph
//      input or a constant); otherwise contiguous. Every other value is contiguous.
// A transpose whose output's order is its input's bytes permuted copies nothing: the
// executable plans its output as a view of its input (cuda_executable.h). The permutes
// around a channels-last convolution's layer norm (ConvNeXt, Swin: NCHW channels-last ->
// NHWC contiguous, and back into a channels-last residual) are such views.
// The plan only says what is fast; the CUDA dispatcher gives every op what it needs
// whatever the layouts of its operands (cuda::run_node), so any plan computes the same.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "fusebox/core/shape.h"
#include "fusebox/ir/graph.h"
#include "fusebox/ir/op_info.h"

namespace fusebox {

const char* layout_role_name(LayoutRole r);
// The role of `n`: its op's (OpInfo::layout), except that a max_pool that also returns
// indices is `contiguous` (its indices count in NCHW order).
LayoutRole layout_role(const Node& n);

struct LayoutPlan {
  std::vector<MemoryFormat> format;  // per value id
  // Where a channels-last value meets an op that needs it contiguous (or the reverse: a
  // contiguous value read by a channels-last op): one copy each at run time.
  struct Conversion {
    NodeId node = -1;  // the reader; -1 for a graph output read back to the host
    ValueId value = kNoValue;
    MemoryFormat from = MemoryFormat::contiguous;
    MemoryFormat to = MemoryFormat::contiguous;
  };
  std::vector<Conversion> conversions;  // in node order, graph outputs last
  int64_t channels_last_values = 0;
  int64_t loads_converted = 0;  // graph inputs and constants stored channels-last
  int64_t transpose_views = 0;  // transposes whose output is their input's bytes

  MemoryFormat of(ValueId v) const { return format.at(size_t(v)); }
  // One line per conversion and a summary line: for `fusebox inspect` and --report.
  std::string describe(const Graph& g) const;
};

enum class LayoutPolicy : uint8_t {
  channels_last_convs,  // the rules above (CUDA's default)
  contiguous,           // every value contiguous (FUSEBOX_LAYOUT=contiguous)
};
// FUSEBOX_LAYOUT: "auto" (default: channels_last_convs) or "contiguous"; anything else is
// an Error naming the variable and its values. Read at the first call, then kept.
LayoutPolicy layout_policy_from_env();
// For tests and benchmarks that change FUSEBOX_LAYOUT in one process (testing::ScopedEnv,
// bench_resnet): the next call reads it again.
void reread_layout_policy();

LayoutPlan plan_layouts(const Graph& g, LayoutPolicy policy = LayoutPolicy::channels_last_convs);

// What still moves data instead of computing, once the plan is made (issue 40: what remains
// as a copy is listed, with why): the plan's conversions, and every data-movement node
// (transpose, reshape, slice, concat, pad, expand, cast) that is not a view of its input
// (views: a reshape between contiguous values, a transpose that keeps its input's bytes, a
// block slice, graph inputs and outputs aside). `bytes`: what it writes.
struct LayoutCopy {
  NodeId node = -1;  // the node that copies, or the reader a conversion is made for (-1: a
                     // graph output read back)
  std::string what;  // "transpose 'x'", "conversion of 'v' [2, 8, 6, 6]"
  size_t bytes = 0;
  std::string reason;
};
// Nodes named in `read_through` copy nothing whatever the plan says: the CUDA executable reads
// them through (ExecutableStats::read_through).
std::vector<LayoutCopy> layout_copies(const Graph& g, const LayoutPlan& plan,
                                      const std::vector<std::string>& read_through = {});
// Count and bytes per kind, then each copy (at most `max_lines`): for `--report`.
std::string describe_copies(const std::vector<LayoutCopy>& copies, size_t max_lines = 30);

// Where a slice's output lies in its input's bytes when both are stored contiguous and the
// slice takes one block of them: steps of 1, the dims after the first one it cuts whole, those
// before it of extent 1 (ViT's q, k, v out of [3, T, B, E]); nullopt otherwise. The CUDA
// executable makes such a slice a view at that offset where it is 256-byte aligned
// (kBlockSliceAlignment), as its arena's values are.
std::optional<size_t> block_slice_offset(const Graph& g, const Node& slice);
inline constexpr size_t kBlockSliceAlignment = 256;

// Whether transposing a dense `in_shape` stored in order `from` by `perm` gives a tensor
// dense in order `to` (dims of extent 1 aside): then the transpose's output is its input's
// bytes and nothing need be copied (NCHW channels-last -> NHWC contiguous by {0, 2, 3, 1},
// NHWC contiguous -> NCHW channels-last by {0, 3, 1, 2}).
bool transpose_keeps_bytes(const Shape& in_shape, const std::vector<int64_t>& perm,
                           MemoryFormat from, MemoryFormat to);

}  // namespace fusebox
