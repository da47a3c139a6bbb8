// Layout ops read through instead of copied: a chain of reshapes, squeezes, transposes and
// slices from a value the executable stores (the root) is an index map onto the root's
// elements; where a value of the chain is a strided view of the root and all its readers
// take strided inputs (attention's q, k, v, concat, the elementwise kernels), it is that view
// and no kernel runs for it. A value in the middle that is no strided view (MultiheadAttention's
// head split [T, B, E] -> [T, B*H, d] merges B with part of E) may still go unmaterialised when
// only layout ops read it, and the view appears further down (-> [B*H, T, d] -> [B, H, T, d]
// is a view of the packed projection again).
//
// The map keeps each dim as factors (extent, stride), outermost first; a reshape regroups the
// factors (splitting one where a new dim ends inside it), a transpose permutes the dims, a slice
// offsets and scales a dim of one factor. A dim is one stride when its factors nest (the outer
// one's stride is the inner one's extent times its stride).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "fusebox/ir/graph.h"

namespace fusebox::runtime {

struct Factor {
  int64_t extent = 1;
  int64_t stride = 0;
};

class IndexMap {
 public:
  // The dense map of a stored tensor: one factor per dim of extent > 1.
  static IndexMap stored(const Shape& shape, const Shape& strides);
  // Each applies a layout op to the map; false where the result has no factored form (the
  // map is then unspecified).
  bool reshape(const Shape& to);
  void transpose(const std::vector<int64_t>& perm);
  bool slice(const SliceAttrs& a, const Shape& out_shape);
  // The strides of a strided view of the root (one per dim; 1 for dims of extent 1), or
  // nullopt where some dim is not one stride.
  std::optional<Shape> strides() const;
  int64_t offset() const { return offset_; }

 private:
  int64_t offset_ = 0;                     // elements into the root
  std::vector<std::vector<Factor>> dims_;  // by dim; empty for extent 1
};

// Whether node n is a layout op the maps follow: the reshape family, transpose, slice.
bool follows_layout(const Node& n);
// Applies such a node (its output's shape `out`) to `map`; false as the IndexMap functions.
bool apply_layout(IndexMap& map, const Node& n, const Shape& out);

// What the executable does for the output of a layout op.
struct LayoutView {
  enum class Kind : uint8_t {
    copy,       // stored; its node runs (the default)
    view,       // the strided view of root (offset, strides); no kernel
    unstored,   // no tensor at all: only layout ops read it, views or copies of root below
    from_root,  // stored, but copied from the strided view of root (its input is unstored)
  };
  Kind kind = Kind::copy;
  ValueId root = kNoValue;
  int64_t offset = 0;  // view, from_root: elements into the root's tensor
  Shape strides;       // view, from_root
};

// What a reader takes of a value it reads: only the value stored in its planned order at an
// arena-aligned address (MemoryPlan::kAlignment); any strides at such an address (kernels that walk
// strides but may vectorise on the address); any view at all (attention, copies: they check what
// they use).
enum class ReaderTakes : uint8_t { planned, aligned_strides, any_view };

// The plan for every value (by ValueId; Kind::copy for all but layout outputs planned
// otherwise). eligible[v]: v, a layout op's output, may go unstored or be a view (the caller
// excludes graph outputs and values outside its arena). stored[v]: the strides v has where
// it is stored (its planned order; empty: v is not stored by the caller and is no root).
// takes(reader, input): what that input of the reader takes.
std::vector<LayoutView> plan_layout_views(
    const Graph& g, const std::vector<bool>& eligible, const std::vector<Shape>& stored,
    const std::function<ReaderTakes(const Node&, size_t)>& takes);

}  // namespace fusebox::runtime
