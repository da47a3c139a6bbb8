// The CUDA executable's compile: layouts, memory, the inputs' and outputs' buffers,
// constants, then the recording (cuda_executable.h).
#include <algorithm>
#include <chrono>

#include "backends/cuda/runtime/nccl.h"
#include "backends/cuda/runtime/settings.h"
#include "executable/cuda/cuda_executable.h"
#include "executable/executables.h"
#include "executable/layout_views.h"
#include "fusebox/core/compile_trace.h"
#include "fusebox/core/memory.h"
#include "fusebox/ir/op_groups.h"
#include "fusebox/ir/op_info.h"

namespace fusebox::runtime {

CudaExecutable::CudaExecutable(const Graph& g, const CompileOptions& options)
    : graph_(g), options_(options), where_("run " + g.name()), ctx_(cuda_context()) {
  const auto start = std::chrono::steady_clock::now();
  const size_t in_use_before = ctx_.allocator.stats().bytes_in_use;
  if (options_.communicator) {
    ctx_.world = dynamic_cast<cuda::NcclCommunicator*>(options_.communicator.get());
    FUSEBOX_CHECK(ctx_.world != nullptr, where_,
                  "the CUDA backend's collectives run on NCCL: give an nccl_communicator() "
                  "(CompileOptions::communicator), not another kind");
    FUSEBOX_CHECK(ctx_.world->comm().device() == ctx_.device.id(), where_, "the communicator is ",
                  "on GPU ", ctx_.world->comm().device(), " but this process runs on GPU ",
                  ctx_.device.id(), " (use_cuda_device)");
  }
  direct_ = !ctx_.encoder.options().use_graphs;
  time_runs_ = !direct_ && cuda::settings().time_runs;
  if (!direct_) copy_stream_ = std::make_unique<cuda::CopyStream>(ctx_.device.id());
  io_ = plan_io(graph_, options_, where_);
  life_ = liveness(graph_);
  layout_ = plan_layouts(graph_, layout_policy_from_env());
  if (!options_.aliases.empty()) {
    // State updated in place: a bad label must leave it as it was (error_flags.h).
    halt_ = std::make_shared<HaltState>();
    halt_->word = ctx_.allocator.allocate(sizeof(int32_t));
    FUSEBOX_CUDA_CHECK(cudaMemset(halt_->word.data(), 0, sizeof(int32_t)));
  }
  {
    const TracePhase trace("cuda plan memory and buffers");
    plan_memory_and_buffers();
  }
  {
    const TracePhase trace("cuda upload constants");
    upload_constants();
  }
  if (!direct_) {
    const TracePhase trace("cuda record step");
    FUSEBOX_CHECK(cuda::ErrorFlags::of(ctx_.encoder).pending() == 0, where_,
                  "kernel error records of an earlier run were left unchecked");
    ctx_.encoder.commit();  // the recording starts empty
    stats_.temporary_holders.clear();
    try {
      record_step();
    } catch (...) {
      ctx_.encoder.discard_recording();
      cuda::ErrorFlags::of(ctx_.encoder).take();
      throw;
    }
    step_ = ctx_.encoder.finish_recording();
    errors_ = std::make_shared<const cuda::ErrorFlags::Reserved>(
        cuda::ErrorFlags::of(ctx_.encoder).take());
    stats_.operations = step_ ? step_.ops() : 0;
  }
  const size_t in_use = ctx_.allocator.stats().bytes_in_use - in_use_before;
  const size_t known = stats_.arena_bytes + stats_.io_bytes + stats_.constant_bytes;
  stats_.temporary_bytes = in_use > known ? in_use - known : 0;
  note_small_holders();
  stats_.nodes = graph_.nodes().size();
  stats_.compile_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The rest of temporary_holders: the nodes that each held less than the 1 MiB a holder is
// listed for, together, and what no node's recording accounts for (the allocator's rounding
// of the step's buffers, a cached block larger than asked for, staging), so that the list
// (with every node of 1 MiB or more) sums to temporary_bytes.
void CudaExecutable::note_small_holders() {
  constexpr size_t kNoted = size_t(1) << 20;
  auto& holders = stats_.temporary_holders;
  if (small_holder_bytes_ >= kNoted)
    holders.emplace_back(cat(small_holders_, " nodes under 1 MiB each"), small_holder_bytes_);
  size_t listed = small_holder_bytes_ + large_holder_bytes_;
  if (stats_.temporary_bytes >= listed + kNoted)
    holders.emplace_back("outside the nodes", stats_.temporary_bytes - listed);
}

// Steps 1-2: the arena, the inputs' and outputs' buffers, which aliases run in place.
void CudaExecutable::plan_memory_and_buffers() {
  const size_t values = graph_.values().size();
  std::vector<size_t> bytes(values, 0);
  std::vector<bool> outside(values, false);  // inputs, constants, outputs
  for (ValueId v : graph_.inputs()) outside[size_t(v)] = true;
  for (ValueId v : graph_.outputs()) outside[size_t(v)] = true;
  for (const auto& [v, t] : graph_.constants()) outside[size_t(v)] = true;
  for (size_t v = 0; v < values; ++v) {
    const TensorType& t = graph_.values()[v].type;
    if (!outside[v]) bytes[v] = size_t(numel(t.shape)) * dtype_size(t.dtype);
  }
  // An input fed in another order than the step reads it (NCHW images for channels-last
  // convolutions) is converted by the step's first operations: the copy is an arena value,
  // live until its last reader.
  std::vector<bool> converted_in_arena(values, false);
  for (size_t i = 0; i < io_.input_names.size(); ++i) {
    const ValueId v = graph_.inputs()[i];
    const TensorType& t = graph_.value(v).type;
    if (io_.aliased_by_input[i] >= 0 || life_.last[size_t(v)] == Liveness::kAfterLastNode) continue;
    DeviceTensor fed;  // the order the input's buffer has: the bound array's, else dense
    fed.dtype = t.dtype;
    fed.shape = t.shape;
    fed.strides = io_.bound[i] ? options_.bound.at(io_.input_names[i]).storage()->tensor.strides
                               : strides_for(t.shape, MemoryFormat::contiguous);
    if (in_format(fed, layout_.of(v))) continue;
    converted_in_arena[size_t(v)] = true;
    bytes[size_t(v)] = size_t(numel(t.shape)) * dtype_size(t.dtype);
  }
  // Views: layout ops read through (layout_views.h) where their readers take the view.
  same_bytes_.assign(values, kNoValue);
  computed_in_input_.assign(values, false);
  plan_layout_views_into(bytes, converted_in_arena);
  plan_outputs_through_reshapes(bytes, converted_in_arena);
  if (options_.reuse_memory) plan_elementwise_in_place(bytes, converted_in_arena);
  const MemoryPlan plan = plan_memory(graph_, life_, bytes, options_.reuse_memory, same_bytes_);
  offsets_ = plan.offset;
  // The nodes' temporaries go where no value is at the time (none without reuse: that
  // plan is the reference the reusing one is tested against).
  if (options_.reuse_memory) gaps_ = free_gaps(graph_, bytes, plan);
  stats_.arena_bytes = plan.arena_bytes;
  stats_.unshared_bytes = plan.unshared_bytes;
  stats_.peak_live_bytes = plan.peak_live_bytes;
  note_peak(graph_, plan, bytes, stats_);
  if (plan.largest != kNoValue) {
    stats_.largest_value = graph_.value(plan.largest).name;
    stats_.largest_value_bytes = bytes[size_t(plan.largest)];
  }
  try {
    if (plan.arena_bytes > 0) arena_ = ctx_.allocator.allocate(plan.arena_bytes);
  } catch (const Error& e) {
    throw Error(where_, cat("out of device memory for the step's intermediates: ",
                            bytes_str(plan.arena_bytes), ", the largest '", stats_.largest_value,
                            "' ", bytes_str(stats_.largest_value_bytes), " (", error_message(e),
                            "); try a smaller batch"));
  }

  // The inputs' and outputs' buffers are one allocation, each tensor at an aligned offset in
  // it: a buffer each is rounded up to the allocator's 2 MiB step, which cost ViT-B/16's
  // training ~190 MiB (its 2.25 and 6.75 MiB weights, each three times with AdamW's moments).
  // A first pass over the decisions below sizes it (tensors without a buffer), the second
  // places them.
  constexpr size_t kIoAlignment = 256;
  cuda::DeviceBuffer pool;
  size_t pool_used = 0;
  std::string pool_names;  // the first few, for an out-of-memory error
  auto allocate = [&](const TensorType& t, MemoryFormat f, const std::string& what) {
    const size_t bytes =
        std::max<size_t>(tensor_size_or_throw(t.shape, t.dtype, where_, what).bytes, 1);
    const size_t at = (pool_used + kIoAlignment - 1) / kIoAlignment * kIoAlignment;
    pool_used = at + bytes;
    if (!pool) {
      if (pool_names.size() < 200) pool_names += cat(pool_names.empty() ? "" : ", ", what);
      DeviceTensor sized;
      sized.dtype = t.dtype;
      sized.shape = t.shape;
      sized.strides = strides_for(t.shape, f);
      return sized;
    }
    stats_.io_bytes += bytes;
    return DeviceTensor::over(cuda::BufferRange(pool, at, bytes), t.dtype, t.shape, f);
  };
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1 && pool_used > 0) {
      try {
        pool = ctx_.allocator.allocate(pool_used);
      } catch (const Error& e) {
        throw Error(where_,
                    cat("out of device memory for the inputs and outputs (", bytes_str(pool_used),
                        ": ", pool_names, "): ", error_message(e), "; try a smaller batch"));
      }
    }
    pool_used = 0;
    stats_.aliases_in_place = stats_.aliases_copied = 0;
    assign_io_buffers(allocate, converted_in_arena);
  }
}

// Step 2's decisions: which input and output buffers the executable owns, in which order,
// and which aliased outputs are computed in place. Run twice by plan_memory_and_buffers (to
// size its one allocation, then to place the tensors in it): `allocate` returns a tensor
// without a buffer in the first pass.
void CudaExecutable::assign_io_buffers(const IoAllocate& allocate,
                                       const std::vector<bool>& converted_in_arena) {
  const size_t values = graph_.values().size();
  auto own_array = [&](const DeviceTensor& d) { return DeviceArray(cuda_storage(d)); };

  inputs_.resize(io_.input_names.size());  // each pass sets what it decides
  for (size_t i = 0; i < inputs_.size(); ++i) {
    Input& in = inputs_[i];
    in.value = graph_.inputs()[i];
    const TensorType& t = graph_.value(in.value).type;
    const MemoryFormat planned = layout_.of(in.value);
    const std::string& name = io_.input_names[i];
    if (io_.bound[i]) {
      in.array = options_.bound.at(name);
      in.has_contents = true;
    } else if (io_.aliased_by_input[i] >= 0) {
      in.array = own_array(allocate(t, planned, "input '" + name + "'"));
      in.has_contents = true;  // resident: the caller fills it (executable.h)
    } else {
      in.array = own_array(allocate(t, MemoryFormat::contiguous, "input '" + name + "'"));
      in.staged = !direct_ && in.array.nbytes() > kSmallFeedBytes;
    }
    in.value_tensor = in.array.storage()->tensor;
    in.convert = !in_format(in.value_tensor, planned);
    if (in.convert) {
      in.value_tensor = converted_in_arena[size_t(in.value)]
                            ? arena_tensor(in.value)
                            : allocate(t, planned, "input '" + name + "' in its planned order");
    }
  }
  output_staging_.resize(io_.output_names.size());
  readback_.resize(io_.output_names.size());
  alias_buffer_.assign(io_.output_names.size(), DeviceTensor{});
  input_staging_.resize(io_.input_names.size());
  outputs_.resize(io_.output_names.size());
  in_place_.assign(values, -1);
  for (size_t i = 0; i < outputs_.size(); ++i) {
    const ValueId v = graph_.outputs()[i];
    const int alias = io_.alias_of_output[i];
    if (alias >= 0) {
      outputs_[i] = inputs_[size_t(alias)].array;
      if (can_compute_in_place(v, size_t(alias))) {
        in_place_[size_t(v)] = alias;
        ++stats_.aliases_in_place;
      } else {
        ++stats_.aliases_copied;
        alias_buffer_[i] =
            allocate(graph_.value(v).type, layout_.of(v), "output '" + io_.output_names[i] + "'");
      }
      continue;
    }
    outputs_[i] = own_array(
        allocate(graph_.value(v).type, layout_.of(v), "output '" + io_.output_names[i] + "'"));
  }
}

// An aliased output may be written straight into its input's buffer when its producer
// may compute it in place of that very input (OpInfo::in_place), nothing reads the input
// after the producer, and the buffer is in the order the producer writes.
bool CudaExecutable::can_compute_in_place(ValueId out, size_t input) const {
  const Input& in = inputs_[input];
  const int k = life_.first[size_t(out)];
  if (k < 0 || in.convert) return false;
  const Node& n = graph_.nodes()[size_t(k)];
  size_t which = 0;
  while (n.outputs[which] != out) ++which;
  const int m = in_place_input(op_info(n.op), which);
  if (m < 0 || n.inputs[size_t(m)] != in.value || life_.last[size_t(in.value)] != k) return false;
  // Running statistics are written in the forward pass, before the loss has checked the
  // labels: with a halt word they are committed at the step's end, guarded (small).
  if (halt_ && n.op == OpKind::batch_norm) return false;
  if (std::count(n.inputs.begin(), n.inputs.end(), in.value) != 1) return false;
  if (std::count(graph_.outputs().begin(), graph_.outputs().end(), out) != 1) return false;
  return in_format(in.array.storage()->tensor, layout_.of(out));
}

// Step 1c: an elementwise node's output computed in the bytes of an input that dies there
// (memory_plan.h elementwise_in_place; same_bytes_[out] = that input: the plan places them
// once, the output living on in them). At a transformer MLP's peak the product's output and
// its GELU are both live, and a residual stream's r_i = r_{i-1} + f(...) holds two values that
// greedy placement cannot pack; in place, each pair is one buffer. Safe because every element
// of the input is read, by the thread that writes the output's element at the same address,
// before that write (the map kernels, elementwise.cuh, and the generated programs,
// fused_codegen: no __restrict__ in either; a refused program's unfused ops write only their
// last into y), and nothing reads the input after this node. The input may be a layout view
// (a reshape of the product's rows): its root's bytes are taken where the view reads them
// densely from the first byte in the output's order. (Plans without reuse, the reference the
// reusing ones are tested against, take none.)
void CudaExecutable::plan_elementwise_in_place(const std::vector<size_t>& bytes,
                                               const std::vector<bool>& converted_in_arena) {
  const size_t values = graph_.values().size();
  InPlaceCandidates c{std::vector<ValueId>(values, kNoValue), std::vector<int>(values, -1)};
  auto holds = [&](ValueId v) {  // stored by its own node (or a copy from a view): its bytes
    const LayoutView::Kind kind = layout_views_[size_t(v)].kind;
    return bytes[size_t(v)] > 0 && same_bytes_[size_t(v)] == kNoValue &&
           !converted_in_arena[size_t(v)] && kind != LayoutView::Kind::view &&
           kind != LayoutView::Kind::unstored;
  };
  for (size_t v = 0; v < values; ++v) {
    const ValueId id = ValueId(v);
    if (holds(id)) {
      c.holder[v] = id;
      c.order[v] = int(layout_.of(id));
      continue;
    }
    const LayoutView& lv = layout_views_[v];
    if (lv.kind != LayoutView::Kind::view || lv.root == kNoValue || !holds(lv.root)) continue;
    c.holder[v] = lv.root;  // read through: its root's bytes are read at its readers too
    const Shape& shape = graph_.value(id).type.shape;
    if (lv.offset != 0) continue;
    for (MemoryFormat f : {MemoryFormat::contiguous, MemoryFormat::channels_last})
      if ((f == MemoryFormat::contiguous || shape.size() >= 3) &&
          lv.strides == strides_for(shape, f)) {
        c.order[v] = int(f);
        break;
      }
  }
  const std::vector<ValueId> in = elementwise_in_place(graph_, life_, bytes, c);
  for (size_t v = 0; v < values; ++v) {
    if (in[v] == kNoValue) continue;
    same_bytes_[v] = in[v];
    computed_in_input_[v] = true;
  }
}

// Step 1b': a value read only by the reshape that makes a graph output is computed in that
// output's buffer (both dense in one order: the same bytes), and the reshape records nothing.
// GPT-2's LM head (a gemm of [16384, 768] rows) writes its f32 logits into the [16, 1024,
// 50257] output directly, where the arena held them (3.3 GB) for the reshape to copy. Not for
// an aliased output (state written in place has rules of its own: can_compute_in_place), an
// output listed twice, or a value anything else reads or views.
void CudaExecutable::plan_outputs_through_reshapes(std::vector<size_t>& bytes,
                                                   const std::vector<bool>& converted_in_arena) {
  const size_t values = graph_.values().size();
  computed_in_output_.assign(values, -1);
  reshape_into_output_.assign(graph_.nodes().size(), false);
  std::vector<int> readers(values, 0), listed(values, 0);
  for (const Node& n : graph_.nodes())
    for (ValueId v : n.inputs)
      if (v != kNoValue) ++readers[size_t(v)];
  for (ValueId v : graph_.outputs()) ++listed[size_t(v)];
  using Kind = LayoutView::Kind;
  for (size_t i = 0; i < io_.output_names.size(); ++i) {
    const ValueId o = graph_.outputs()[i];
    const NodeId r = graph_.value(o).producer;
    if (io_.alias_of_output[i] >= 0 || listed[size_t(o)] != 1 || r < 0) continue;
    const Node& n = graph_.node(r);
    if (!is_reshape_family(n.op) || n.outputs.size() != 1 ||
        layout_views_[size_t(o)].kind != Kind::copy)
      continue;
    const ValueId v = n.inputs[0];
    const Kind kind = layout_views_[size_t(v)].kind;
    if (bytes[size_t(v)] == 0 || converted_in_arena[size_t(v)] ||
        same_bytes_[size_t(v)] != kNoValue || kind == Kind::view || kind == Kind::unstored ||
        readers[size_t(v)] != 1 || listed[size_t(v)] != 0 ||
        layout_.of(v) != MemoryFormat::contiguous || layout_.of(o) != MemoryFormat::contiguous)
      continue;
    computed_in_output_[size_t(v)] = int(i);
    reshape_into_output_[size_t(r)] = true;
    bytes[size_t(v)] = 0;  // not in the arena
  }
}

// Step 3: constants, each once, in its planned order.
void CudaExecutable::upload_constants() {
  constants_.assign(graph_.values().size(), DeviceTensor{});
  for (const auto& [v, t] : graph_.constants()) {
    if (life_.last[size_t(v)] < 0) continue;  // nobody reads it
    DeviceTensor d = upload(ctx_, t);
    if (!in_format(d, layout_.of(v))) {
      DeviceTensor c = DeviceTensor::empty(ctx_.allocator, d.dtype, d.shape, layout_.of(v));
      cuda::copy_strided(ctx_, d, c);
      ctx_.encoder.add_temporary(d.buffer);
      d = c;
    }
    stats_.constant_bytes += d.buffer.size();
    constants_[size_t(v)] = d;
  }
  ctx_.encoder.commit();
}

std::unique_ptr<Executable> compile_cuda(const Graph& g, const CompileOptions& options) {
  return std::make_unique<CudaExecutable>(g, options);
}

// Step 1b: layout ops read through (layout_views.h). Roots are arena values stored dense in
// their planned order; views and unstored values share their root's bytes (same_bytes_, all
// of them: bytes[v] becomes the root's), so that the root lives as long as any of them. A view in
// its planned order at an aligned address is what the value would have been stored as, for any
// reader (a reshape of a contiguous value, a transpose that keeps the bytes, a block slice).
void CudaExecutable::plan_layout_views_into(std::vector<size_t>& bytes,
                                            const std::vector<bool>& converted_in_arena) {
  const size_t values = graph_.values().size();
  std::vector<bool> eligible(values, false);
  std::vector<Shape> stored(values);
  for (size_t v = 0; v < values; ++v) {
    if (bytes[v] == 0 || converted_in_arena[v]) continue;
    stored[v] = strides_for(graph_.values()[v].type.shape, layout_.of(ValueId(v)));
    eligible[v] = true;
  }
  layout_views_ = plan_layout_views(graph_, eligible, stored, [](const Node& n, size_t) {
    // Copies and attention check what they use (alignment, strides); kernels that walk
    // strides may still vectorise on an address they take to be the arena's.
    if (n.op == OpKind::attention || n.op == OpKind::attention_backward || n.op == OpKind::slice ||
        n.op == OpKind::concat || is_reshape_family(n.op) ||
        layout_role(n) == LayoutRole::any_order)
      return ReaderTakes::any_view;
    return op_info(n.op).cuda_strided_inputs ? ReaderTakes::aligned_strides : ReaderTakes::planned;
  });
  using Kind = LayoutView::Kind;
  for (size_t v = 0; v < values; ++v) {
    const LayoutView& p = layout_views_[v];
    if (p.kind != Kind::view && p.kind != Kind::unstored) continue;
    same_bytes_[v] = p.root;
    // A view's elements may lie anywhere in its root's bytes (q of a packed projection spans
    // all of it): while it lives, all of them are taken (free_gaps lends the rest to nodes'
    // temporaries).
    bytes[v] = bytes[size_t(p.root)];
    ++stats_.views;
  }
  for (const Node& n : graph_.nodes()) {
    if (n.outputs.size() != 1) continue;
    const Kind kind = layout_views_[size_t(n.outputs[0])].kind;
    if (kind == Kind::view || kind == Kind::unstored) stats_.read_through.push_back(n.name);
  }
}

}  // namespace fusebox::runtime
