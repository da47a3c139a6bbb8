// Where a compiled step keeps its intermediate values: one arena, shared by liveness.
//
// A value lives from the node that writes it to the last node that reads it (both
// included), in the graph's node order, which is the order the step is recorded in. Two
// values whose lives overlap get disjoint bytes; others may share. A node's outputs never
// share with its inputs (both live at that node), so no kernel reads and writes the same
// bytes unless an alias asks for it (executable.h).
//
// Sharing is safe on the GPU because the command encoder orders operations by the bytes
// they declare: a write into bytes an earlier operation reads waits for that reader (a
// write-after-read edge), and any reuse is such a write. So the plan needs no knowledge
// of the streams or of the graph's concurrency.
//
// Placement: values largest first, each at the lowest aligned offset free of every placed
// value it overlaps in time (the greedy-by-size plan of TFLite's arena planner, among
// others). It is within a few percent of the lower bound (the most bytes live at any one
// node) on the networks we run (tests/unit/executable print both).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "fusebox/ir/graph.h"
#include "fusebox/runtime/executable.h"

namespace fusebox::runtime {

// For each value: the node that writes it (-1 for inputs and constants) and the last node
// that reads it (-1 when none does); graph outputs are read "after the last node", and the
// inputs of a collective (all_reduce) at the last node: it runs beside the nodes after it.
struct Liveness {
  std::vector<int> first;
  std::vector<int> last;
  static constexpr int kAfterLastNode = 1 << 30;
};
Liveness liveness(const Graph& g);

struct MemoryPlan {
  static constexpr size_t kAlignment = 256;  // every offset; enough for any vector access
  static constexpr size_t kNotPlanned = SIZE_MAX;
  std::vector<size_t> offset;  // by ValueId; kNotPlanned for values not in the arena
  size_t arena_bytes = 0;      // the arena's size
  size_t unshared_bytes = 0;   // the planned values each in its own (aligned) buffer
  size_t peak_live_bytes = 0;  // the most (aligned) bytes live at one node: a lower bound
  // Where that is: the node (the first such; nodes().size() for after the last one) and the
  // planned values (views by their root) live there, the largest first.
  int peak_node = -1;
  std::vector<ValueId> peak_values;
  ValueId largest = kNoValue;  // the largest planned value
  // By ValueId, for the planned values: the nodes from and to which its bytes are held; a
  // root's (a value with views) from the first writer to the last reader of it or any of its
  // views, a view's its own life (inside its root's).
  std::vector<int> held_from, held_to;
};

// Bytes of the arena no planned value occupies while node i runs, for the node's
// temporaries (CommandEncoder::set_temporary_region): the largest such gap for each node,
// [offset, offset + bytes). Sharing them is safe for the reason above: the temporaries are
// declared to the encoder like any arena bytes. A root's bytes are occupied for as long as the
// plan holds them (MemoryPlan::held_from/held_to), not only while the root itself lives: a
// view need not be made by a reader of its root (layout_views.h maps a chain of layout ops
// onto the first stored value of the chain, past stored copies in it), so a view read in the
// backward may be of a value the forward read last.
struct Gap {
  size_t offset = 0;
  size_t bytes = 0;
};
std::vector<Gap> free_gaps(const Graph& g, const std::vector<size_t>& bytes,
                           const MemoryPlan& plan);

// Plans the values with bytes[v] > 0 (the caller gives 0 for inputs, constants, outputs and
// anything else kept outside the arena). With reuse false, every value gets bytes of its own.
// Views: same_bytes[v] names a planned value whose bytes v is (a reshape's output is its
// input's bytes under another shape; kNoValue: none; an empty vector: no views), starting
// view_offset[v] bytes into them (a slice that is one block of its input; empty: 0 for all).
// A value and its views are placed once, living from the first one's writer to the last one's
// last reader; unshared_bytes and peak_live_bytes count them once.
MemoryPlan plan_memory(const Graph& g, const Liveness& life, const std::vector<size_t>& bytes,
                       bool reuse, const std::vector<ValueId>& same_bytes = {},
                       const std::vector<size_t>& view_offset = {});

// The outputs of elementwise nodes that may be computed in the bytes of an input that dies
// there (for kernels that read every element of the input before writing the output's element
// at the same address: the CUDA map kernels and generated programs). Per value, `holder`: the
// stored value whose bytes it is (itself, or the root of a layout view of it), kNoValue for
// none; `order`: the order (a MemoryFormat) its elements lie in densely from the holder's first
// byte, -1 for any other (a strided or offset view). A node of the unary, binary or pointwise
// family takes, for its output (a holder, in some order), the bytes of the first input of the
// same dtype, shape and order whose holder is of that size and is read by nothing after the
// node (nor its views), every operand of the node in those bytes being read in that order; a
// holder once. Returns, by ValueId, that holder (kNoValue where none). An output taken may be
// an input again: a chain shares one buffer.
struct InPlaceCandidates {
  std::vector<ValueId> holder;
  std::vector<int> order;
};
std::vector<ValueId> elementwise_in_place(const Graph& g, const Liveness& life,
                                          const std::vector<size_t>& bytes,
                                          const InPlaceCandidates& c);

// Fills stats' peak_node and peak_values from `plan` (`bytes` as given to plan_memory).
void note_peak(const Graph& g, const MemoryPlan& plan, const std::vector<size_t>& bytes,
               ExecutableStats& stats);

}  // namespace fusebox::runtime
