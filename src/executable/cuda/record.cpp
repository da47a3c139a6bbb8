// The CUDA executable's node walk: recorded once into the step (launching directly, run
// by every run), and by profile() node by node (cuda_executable.h).
#include <algorithm>

#include "executable/cuda/cuda_executable.h"
#include "fusebox/core/compile_trace.h"

namespace fusebox::runtime {

DeviceTensor CudaExecutable::arena_tensor(ValueId v) const {
  const TensorType& t = graph_.value(v).type;
  DeviceTensor d;
  d.buffer = arena_;
  d.offset = int64_t(offsets_[size_t(v)] / dtype_size(t.dtype));
  d.dtype = t.dtype;
  d.shape = t.shape;
  d.strides = strides_for(t.shape, layout_.of(v));
  return d;
}

// A layout op's output as the strided view of its root's tensor that compile planned
// (layout_views.h); the root is stored in the order compile assumed.
DeviceTensor CudaExecutable::root_view(const Walk& w, ValueId v) const {
  const LayoutView& lv = layout_views_[size_t(v)];
  const DeviceTensor& root = w.slots[size_t(lv.root)];
  const Value& rv = graph_.value(lv.root);
  FUSEBOX_CHECK(root.buffer && root.strides == strides_for(rv.type.shape, layout_.of(lv.root)),
                where_, "the view '", graph_.value(v).name, "' of '", rv.name,
                "' was planned on another order of it (internal error)");
  return root.view(root.offset + lv.offset, graph_.value(v).type.shape, lv.strides);
}

// Step 4: the node walk (recorded once; launching directly, run by every run).
void CudaExecutable::record_step() {
  const cuda::ConvReportScope reporting(report_);
  cuda::ErrorFlags& flags = cuda::ErrorFlags::of(ctx_.encoder);
  if (halt_) flags.set_halt(halt_->word);
  try {
    record_nodes();
  } catch (...) {
    flags.clear_halt();
    throw;
  }
  flags.clear_halt();
}

// Constants and inputs in their slots, then the input conversions (a staged input's copy in
// from its staging buffer runs before the step's launch: run.cpp); a profile (`step`
// false) reads the inputs as the last run left them and records only the conversions
// (arena values).
CudaExecutable::Walk CudaExecutable::begin_walk(bool step) {
  Walk w;
  w.slots.resize(graph_.values().size());
  for (const auto& [v, t] : graph_.constants()) w.slots[size_t(v)] = constants_[size_t(v)];
  for (Input& in : inputs_) {
    if (in.convert) cuda::copy_strided(ctx_, in.array.storage()->tensor, in.value_tensor);
    w.slots[size_t(in.value)] = in.value_tensor;
  }
  w.output_tensor.resize(graph_.values().size());
  if (step) {
    // The first operations: the writers of the returned outputs' pieces wait for the last
    // copies of those bytes out (cuda_executable.h). A recorded step needs a fence to record
    // each wait with: one after nothing yet, until a run copies.
    if (!direct_ && !outputs_read_)
      outputs_read_ = cuda::Fence::record(ctx_.encoder.stream(), ctx_.device.id());
    plan_readback_pieces();
    // Each wait after the one before, in the order the copies end (the large outputs' pieces,
    // then the small outputs', whose fence is the last copy's): no wait gets longer, and the
    // graph has one root wait instead of one per piece.
    size_t last_wait = cuda::CommandEncoder::kNoOp;
    for (size_t k = 1; k <= readback_pieces_.size(); ++k) {
      ReadbackPiece& p = readback_pieces_[k % readback_pieces_.size()];
      if (!p.read && !direct_)
        p.read = cuda::Fence::record(ctx_.encoder.stream(), ctx_.device.id());
      p.op = cuda::CommandEncoder::kNoOp;
      if (!p.ranges.empty()) last_wait = p.op = ctx_.encoder.wait_for(p.read, p.ranges, last_wait);
      p.pointed = p.read;
    }
  }
  for (size_t i = 0; i < outputs_.size(); ++i) {
    const ValueId v = graph_.outputs()[i];
    if (in_place_[size_t(v)] >= 0) {
      w.output_tensor[size_t(v)] = inputs_[size_t(in_place_[size_t(v)])].value_tensor;
    } else if (alias_buffer_[i].buffer) {
      w.output_tensor[size_t(v)] = alias_buffer_[i];
    } else {
      w.output_tensor[size_t(v)] = outputs_[i].storage()->tensor;
    }
  }
  // Values computed in an output's buffer, in their own shape (plan_outputs_through_reshapes).
  for (size_t v = 0; v < computed_in_output_.size(); ++v) {
    if (computed_in_output_[v] < 0) continue;
    const DeviceTensor& out = outputs_[size_t(computed_in_output_[v])].storage()->tensor;
    const Shape& shape = graph_.values()[v].type.shape;
    w.output_tensor[v] = out.view(out.offset, shape, strides_for(shape, MemoryFormat::contiguous));
  }
  return w;
}

// The returned outputs' bytes as readback pieces (cuda_executable.h): the outputs smaller than
// two pieces together in the first, each larger one in up to kMaxReadbackPieces of at least
// kReadbackPieceBytes. Once: the pieces and their fences outlive the recording.
void CudaExecutable::plan_readback_pieces() {
  if (!readback_pieces_.empty()) return;
  readback_pieces_.emplace_back();
  for (size_t i = 0; i < outputs_.size(); ++i) {
    const ValueId v = graph_.outputs()[i];
    if (in_place_[size_t(v)] >= 0 || alias_buffer_[i].buffer) continue;
    const cuda::BufferRange range = outputs_[i].storage()->tensor.range();
    const size_t count = std::min(kMaxReadbackPieces, range.bytes / kReadbackPieceBytes);
    if (count < 2) {
      readback_pieces_[0].ranges.push_back(range);
      continue;
    }
    const size_t step = ((range.bytes + count - 1) / count + 255) / 256 * 256;
    for (size_t at = 0; at < range.bytes; at += step) {
      ReadbackPiece p;
      p.output = int(i);
      p.begin = at;
      p.bytes = std::min(step, range.bytes - at);
      p.ranges = {cuda::BufferRange(range.buffer, range.offset + at, p.bytes)};
      readback_pieces_.push_back(std::move(p));
    }
  }
}

// Where node `n`'s outputs go: a returned buffer, the arena, or (no bytes) a buffer of
// its own that keeps pointers valid.
std::vector<DeviceTensor> CudaExecutable::node_outputs(const Walk& w, const Node& n) {
  std::vector<DeviceTensor> outs;
  for (ValueId v : n.outputs) {
    const LayoutView& lv = layout_views_[size_t(v)];
    if (lv.kind == LayoutView::Kind::view) {
      outs.push_back(root_view(w, v));
    } else if (lv.kind == LayoutView::Kind::unstored) {
      outs.emplace_back();  // no tensor: only layout ops read it, through its root
    } else if (w.output_tensor[size_t(v)].buffer) {
      outs.push_back(w.output_tensor[size_t(v)]);
    } else if (offsets_[size_t(v)] != MemoryPlan::kNotPlanned) {
      outs.push_back(arena_tensor(v));
    } else {
      const TensorType& t = graph_.value(v).type;
      outs.push_back(DeviceTensor::empty(ctx_.allocator, t.dtype, t.shape, layout_.of(v)));
    }
  }
  return outs;
}

// Records node `i` reading the walk's slots into `outs`, its temporaries in its gap. The
// node may replace an output by a view (a reshape of its input): `outs` then holds it.
void CudaExecutable::record_node(size_t i, const Walk& w, std::vector<DeviceTensor>& outs) {
  const Node& n = graph_.nodes()[i];
  const TracePhase trace("cuda record ", op_name(n.op));
  if (reshape_into_output_[i]) return;  // its input was computed in its output's bytes
  // Layout ops read through (layout_views.h): a view or nothing, or a copy from the root.
  if (n.outputs.size() == 1) {
    switch (layout_views_[size_t(n.outputs[0])].kind) {
      case LayoutView::Kind::view:
      case LayoutView::Kind::unstored:
        return;
      case LayoutView::Kind::from_root:
        cuda::copy_strided(ctx_, root_view(w, n.outputs[0]), outs[0]);
        return;
      case LayoutView::Kind::copy:
        break;
    }
  }
  std::vector<const DeviceTensor*> in_ptrs;
  for (ValueId v : n.inputs) in_ptrs.push_back(v == kNoValue ? nullptr : &w.slots[size_t(v)]);
  // Every node gets a region (maybe empty), so that the temporaries the gap cannot hold
  // share the encoder's overflow buffer with other nodes' (CommandEncoder::temporary).
  const bool gap = i < gaps_.size() && gaps_[i].bytes > 0;
  ctx_.encoder.set_temporary_region(gap ? cuda::BufferRange(arena_, gaps_[i].offset, gaps_[i].bytes)
                                        : cuda::BufferRange(arena_, 0, 0));
  const size_t in_use_before = ctx_.allocator.stats().bytes_in_use;
  try {
    cuda::run_node(ctx_, n, in_ptrs, outs);
  } catch (...) {
    ctx_.encoder.clear_temporary_region();
    throw;
  }
  ctx_.encoder.clear_temporary_region();
  // What the node's recording holds of its own (ExecutableStats::temporary_holders).
  const size_t in_use = ctx_.allocator.stats().bytes_in_use;
  constexpr size_t kNoted = size_t(1) << 20;
  if (in_use > in_use_before && in_use < in_use_before + kNoted) {
    small_holder_bytes_ += in_use - in_use_before;
    ++small_holders_;
  }
  if (in_use >= in_use_before + kNoted) {
    large_holder_bytes_ += in_use - in_use_before;
    auto& holders = stats_.temporary_holders;
    holders.emplace_back(n.name, in_use - in_use_before);
    std::stable_sort(holders.begin(), holders.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    if (holders.size() > 5) holders.pop_back();
  }
}

// Node i's outputs (node_outputs), poisoned where the options ask: all but state updated in
// place (the poison would be its only value) and views (the poison would be their input's).
std::vector<DeviceTensor> CudaExecutable::poisoned_outputs(const Walk& w, size_t i) {
  const Node& n = graph_.nodes()[i];
  std::vector<DeviceTensor> outs = node_outputs(w, n);
  if (options_.poison && !reshape_into_output_[i])  // (that one: its input's bytes)
    for (size_t k = 0; k < outs.size(); ++k)
      if (in_place_[size_t(n.outputs[k])] < 0 && same_bytes_[size_t(n.outputs[k])] == kNoValue)
        ctx_.encoder.memset(outs[k].range(), 0xff);
  return outs;
}

// The run of optimizer updates from node i (the step emits them one after another) as
// multi-tensor launches (kernels.h record_update_group), else node by node. Returns the node
// after the run.
size_t CudaExecutable::record_updates(size_t i, Walk& w) {
  const std::vector<Node>& nodes = graph_.nodes();
  size_t end = i;
  while (end < nodes.size() && nodes[end].op == nodes[i].op) ++end;
  std::vector<std::vector<DeviceTensor>> outs(end - i);
  std::vector<std::vector<const DeviceTensor*>> ins(end - i);
  std::vector<cuda::NodeOperands> operands;
  for (size_t k = i; k < end; ++k) {
    outs[k - i] = poisoned_outputs(w, k);
    for (ValueId v : nodes[k].inputs)
      ins[k - i].push_back(v == kNoValue ? nullptr : &w.slots[size_t(v)]);
    operands.push_back({&nodes[k], ins[k - i], outs[k - i]});
  }
  ctx_.encoder.set_temporary_region(cuda::BufferRange(arena_, 0, 0));
  bool grouped = false;
  try {
    grouped = cuda::record_update_group(ctx_, operands);
  } catch (...) {
    ctx_.encoder.clear_temporary_region();
    throw;
  }
  ctx_.encoder.clear_temporary_region();
  for (size_t k = i; k < end; ++k) {
    if (!grouped) record_node(k, w, outs[k - i]);
    for (size_t o = 0; o < nodes[k].outputs.size(); ++o)
      w.slots[size_t(nodes[k].outputs[o])] = outs[k - i][o];
  }
  return end;
}

void CudaExecutable::record_nodes() {
  Walk w = begin_walk(true);
  for (size_t i = 0; i < graph_.nodes().size();) {
    const Node& n = graph_.nodes()[i];
    if (n.op == OpKind::sgd_update || n.op == OpKind::adamw_update) {
      i = record_updates(i, w);
      continue;
    }
    std::vector<DeviceTensor> outs = poisoned_outputs(w, i);
    record_node(i, w, outs);
    for (size_t k = 0; k < n.outputs.size(); ++k) w.slots[size_t(n.outputs[k])] = outs[k];
    ++i;
  }
  end_walk(w);
}

// Outputs not written where they are returned (an input or a constant marked as an
// output), then aliased outputs that could not be computed in place.
void CudaExecutable::end_walk(const Walk& w) {
  for (size_t i = 0; i < outputs_.size(); ++i) {
    const ValueId v = graph_.outputs()[i];
    const DeviceTensor& want = w.output_tensor[size_t(v)];
    if (w.slots[size_t(v)].data() != want.data())
      cuda::copy_strided(ctx_, w.slots[size_t(v)], want);
  }
  for (size_t i = 0; i < outputs_.size(); ++i) {
    if (!alias_buffer_[i].buffer) continue;
    const DeviceTensor& state = inputs_[size_t(io_.alias_of_output[i])].array.storage()->tensor;
    if (halt_) {
      DeviceTensor next = alias_buffer_[i];
      if (next.strides != state.strides) {  // into the state's order first (rare)
        next = cuda::temporary_tensor(
            ctx_, state.dtype, state.shape,
            state.is_contiguous() ? MemoryFormat::contiguous : MemoryFormat::channels_last);
        cuda::copy_strided(ctx_, alias_buffer_[i], next);
      }
      cuda::copy_unless_halted(ctx_, next, state, halt_->word);
    } else {
      cuda::copy_strided(ctx_, alias_buffer_[i], state);
    }
  }
}

}  // namespace fusebox::runtime
