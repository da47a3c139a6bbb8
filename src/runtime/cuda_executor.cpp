// Runs a graph on the CUDA backend, and replays it when it runs again.
//
// First run of a graph (a miss): constants and inputs are uploaded, every node is recorded
// on the device's command encoder, and the recording is finished into a RecordedGraph (a
// "compiled step") that keeps every buffer it uses: inputs, constants, intermediates and
// outputs stay allocated at the addresses baked into its nodes. It is launched, the outputs
// are downloaded, and the step is kept.
//
// Later runs of the same graph (a hit) record nothing: the feeds are copied into the
// step's input buffers, the step is replayed (one cudaGraphLaunch) and the outputs copied
// out. Its outputs are poisoned (RunOptions::poison_outputs) in the first launch only:
// the poison memsets are switched off after it, since a replay runs the same kernels with
// the same parameters.
//
// What "the same graph" means: the same contents, compared in full on every run
// (same_graph below: values, nodes with their attributes, inputs, outputs, and constants by
// identity, i.e. the same tensor buffers), so a graph edited since, or another graph built
// at the same address, is recorded anew; an input's shape and dtype are part of the graph.
// A graph's constants are taken as immutable (a tensor changed in place after it was added
// is not noticed), as the constant-upload cache of the kernels already assumes.
//
// Steps that are not kept (recorded every run, through the encoder's graph cache):
// FUSEBOX_CUDA_GRAPHS=0 (launching directly), FUSEBOX_CUDA_STEP_CACHE=0, and recordings a
// replay cannot reproduce: a node that checks its data on the host part-way (the encoder
// committed during the recording), or kernels with run-time error checks (ErrorFlags),
// whose records are checked by the run that reserved them only.
//
// Memory: the kept steps hold all their buffers; at most FUSEBOX_CUDA_STEP_CACHE steps
// (default 4) are kept (one more while a new one runs first), the least recently used
// goes first, release_cuda_step_cache() drops them all, and so does the allocator when it
// is about to fail a request (a reclaimer). Runs are serialised: they share the device's
// encoder.
#include "runtime/cuda_executor.h"

#include <algorithm>
#include <bit>
#include <list>
#include <memory>
#include <mutex>
#include <variant>

#include "backends/cuda/kernels.h"
#include "backends/cuda/runtime/error_flags.h"
#include "backends/cuda/runtime/settings.h"
#include "fusebox/passes/layout.h"

namespace fusebox {

namespace {

// ---- Graph equality ----------------------------------------------------------------------
// Every field of the IR's structs is compared. kFields<T> names how many fields an
// aggregate has; a structured binding of that many then compiles only while it is right, so
// a field added to an attribute struct (or a new struct in Attrs) breaks the build here
// instead of being silently left out of the comparison.

template <class T>
inline constexpr size_t kFields = 0;  // 0: compared with == (or an overload below)
template <>
inline constexpr size_t kFields<TensorType> = 2;
template <>
inline constexpr size_t kFields<Value> = 4;
template <>
inline constexpr size_t kFields<Node> = 6;
template <>
inline constexpr size_t kFields<ConvAttrs> = 5;
template <>
inline constexpr size_t kFields<ConvBackwardDataAttrs> = 2;
template <>
inline constexpr size_t kFields<ConvBackwardFilterAttrs> = 2;
template <>
inline constexpr size_t kFields<BatchNormAttrs> = 3;
template <>
inline constexpr size_t kFields<NormAttrs> = 2;
template <>
inline constexpr size_t kFields<LeakyReluAttrs> = 1;
template <>
inline constexpr size_t kFields<GeluAttrs> = 1;
template <>
inline constexpr size_t kFields<ClipAttrs> = 2;
template <>
inline constexpr size_t kFields<GemmAttrs> = 4;
template <>
inline constexpr size_t kFields<ReduceAttrs> = 2;
template <>
inline constexpr size_t kFields<SoftmaxAttrs> = 1;
template <>
inline constexpr size_t kFields<PoolAttrs> = 8;
template <>
inline constexpr size_t kFields<ReshapeAttrs> = 2;
template <>
inline constexpr size_t kFields<FlattenAttrs> = 1;
template <>
inline constexpr size_t kFields<TransposeAttrs> = 1;
template <>
inline constexpr size_t kFields<ConcatAttrs> = 1;
template <>
inline constexpr size_t kFields<SliceAttrs> = 5;
template <>
inline constexpr size_t kFields<PadAttrs> = 3;
template <>
inline constexpr size_t kFields<AxesAttrs> = 1;
template <>
inline constexpr size_t kFields<CastAttrs> = 1;
template <>
inline constexpr size_t kFields<ConstantAttrs> = 1;
template <>
inline constexpr size_t kFields<CrossEntropyAttrs> = 2;
template <>
inline constexpr size_t kFields<ExpandAttrs> = 1;
template <>
inline constexpr size_t kFields<UnaryBackwardAttrs> = 5;
template <>
inline constexpr size_t kFields<BinaryBackwardAttrs> = 1;
template <>
inline constexpr size_t kFields<PoolBackwardAttrs> = 2;
template <>
inline constexpr size_t kFields<SliceBackwardAttrs> = 2;
template <>
inline constexpr size_t kFields<PadBackwardAttrs> = 2;
template <>
inline constexpr size_t kFields<SgdAttrs> = 4;
template <>
inline constexpr size_t kFields<AdamWAttrs> = 4;

template <class T>
bool same(const T& a, const T& b);

// Tensors (constants) by identity: the kept step holds them, so an address is never reused.
bool same(const Tensor& a, const Tensor& b) {
  return a.raw() == b.raw() && a.dtype() == b.dtype() && a.shape() == b.shape();
}
// Bits, not ==: -0.0 differs from 0.0 (a pad value), and a NaN attribute is itself.
bool same(const double& a, const double& b) {
  return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b);
}
template <class T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same(a[i], b[i])) return false;
  return true;
}
template <class... Ts>
bool same(const std::variant<Ts...>& a, const std::variant<Ts...>& b) {
  if (a.index() != b.index()) return false;
  return std::visit(
      [&](const auto& x) { return same(x, std::get<std::remove_cvref_t<decltype(x)>>(b)); }, a);
}
bool same(const std::monostate&, const std::monostate&) {
  return true;
}

template <size_t N, class T>
bool same_fields(const T& a, const T& b) {
  static_assert(N >= 1 && N <= 8, "same_fields: add a case");
  if constexpr (N == 1) {
    const auto& [a1] = a;
    const auto& [b1] = b;
    return same(a1, b1);
  } else if constexpr (N == 2) {
    const auto& [a1, a2] = a;
    const auto& [b1, b2] = b;
    return same(a1, b1) && same(a2, b2);
  } else if constexpr (N == 3) {
    const auto& [a1, a2, a3] = a;
    const auto& [b1, b2, b3] = b;
    return same(a1, b1) && same(a2, b2) && same(a3, b3);
  } else if constexpr (N == 4) {
    const auto& [a1, a2, a3, a4] = a;
    const auto& [b1, b2, b3, b4] = b;
    return same(a1, b1) && same(a2, b2) && same(a3, b3) && same(a4, b4);
  } else if constexpr (N == 5) {
    const auto& [a1, a2, a3, a4, a5] = a;
    const auto& [b1, b2, b3, b4, b5] = b;
    return same(a1, b1) && same(a2, b2) && same(a3, b3) && same(a4, b4) && same(a5, b5);
  } else if constexpr (N == 6) {
    const auto& [a1, a2, a3, a4, a5, a6] = a;
    const auto& [b1, b2, b3, b4, b5, b6] = b;
    return same(a1, b1) && same(a2, b2) && same(a3, b3) && same(a4, b4) && same(a5, b5) &&
           same(a6, b6);
  } else if constexpr (N == 7) {
    const auto& [a1, a2, a3, a4, a5, a6, a7] = a;
    const auto& [b1, b2, b3, b4, b5, b6, b7] = b;
    return same(a1, b1) && same(a2, b2) && same(a3, b3) && same(a4, b4) && same(a5, b5) &&
           same(a6, b6) && same(a7, b7);
  } else {
    const auto& [a1, a2, a3, a4, a5, a6, a7, a8] = a;
    const auto& [b1, b2, b3, b4, b5, b6, b7, b8] = b;
    return same(a1, b1) && same(a2, b2) && same(a3, b3) && same(a4, b4) && same(a5, b5) &&
           same(a6, b6) && same(a7, b7) && same(a8, b8);
  }
}

template <class T>
bool same(const T& a, const T& b) {
  if constexpr (kFields < T >> 0) {
    return same_fields<kFields<T>>(a, b);
  } else {
    return a == b;  // scalars, enums, strings, shapes, std::optional of those
  }
}

}  // namespace

bool same_graph(const Graph& a, const Graph& b) {
  if (a.nodes().size() != b.nodes().size() || a.values().size() != b.values().size() ||
      a.constants().size() != b.constants().size() || a.inputs() != b.inputs() ||
      a.outputs() != b.outputs() || a.name() != b.name()) {
    return false;
  }
  if (!same(a.values(), b.values()) || !same(a.nodes(), b.nodes())) return false;
  auto ca = a.constants().begin();
  for (auto cb = b.constants().begin(); cb != b.constants().end(); ++ca, ++cb) {
    if (ca->first != cb->first || !same(ca->second, cb->second)) return false;
  }
  return true;
}

namespace {

// ---- Moving tensors ----------------------------------------------------------------------

cuda::DeviceTensor upload(cuda::Context& ctx, const Tensor& t) {
  cuda::DeviceTensor d = cuda::DeviceTensor::empty(ctx.allocator, t.dtype(), t.shape());
  if (t.nbytes() > 0) ctx.encoder.copy_to_device(d.buffer, t.raw());
  return d;
}

Tensor download(cuda::Context& ctx, const cuda::DeviceTensor& d) {
  Tensor t = Tensor::empty(d.dtype, d.shape);
  if (t.nbytes() == 0) return t;
  if (d.is_contiguous()) {
    ctx.encoder.copy_to_host(
        t.raw(), cuda::BufferRange(d.buffer, size_t(d.offset) * dtype_size(d.dtype), t.nbytes()));
    return t;
  }
  cuda::DeviceTensor c = cuda::DeviceTensor::empty(ctx.allocator, d.dtype, d.shape);
  cuda::copy_strided(ctx, d, c);
  ctx.encoder.copy_to_host(t.raw(), c.buffer);
  return t;
}

// ---- Recording a run ---------------------------------------------------------------------

// What recording a run leaves behind: the device tensors of the graph's inputs and outputs
// (in the graph's order), the operations that poisoned outputs, and whether a replay of the
// recording would do what the run did.
struct Recording {
  std::vector<cuda::DeviceTensor> inputs;
  std::vector<cuda::DeviceTensor> outputs;
  std::vector<size_t> poison_ops;
  bool replayable = true;
};

// Uploads the constants and the feeds, then records every node on ctx.encoder (nothing is
// committed after the uploads unless a node does so itself). Intermediates are dropped
// after their last reader is recorded: the recording holds them.
//
// Layouts (passes/layout.h): every value is allocated in its planned order. A constant
// planned channels-last is converted once, when it is uploaded (committed before the
// recording starts, so a replay does not repeat it); a graph input is uploaded into a
// contiguous buffer (where a replay copies the next feed) and converted by the first
// recorded operation; outputs are read back through download(), which converts.
Recording record_run(cuda::Context& ctx, const Graph& g, const NamedTensors& feeds,
                     const RunOptions& opts, const LayoutPlan& plan) {
  Recording rec;
  std::vector<cuda::DeviceTensor> slots(g.values().size());
  std::vector<int> remaining_reads = count_reads(g);
  auto in_planned_order = [&](ValueId v, const cuda::DeviceTensor& loaded) {
    if (plan.of(v) == MemoryFormat::contiguous) return loaded;
    cuda::DeviceTensor t =
        cuda::DeviceTensor::empty(ctx.allocator, loaded.dtype, loaded.shape, plan.of(v));
    cuda::copy_strided(ctx, loaded, t);
    ctx.encoder.add_temporary(loaded.buffer);
    return t;
  };
  for (const auto& [v, t] : g.constants()) {
    if (remaining_reads[size_t(v)] > 0) slots[size_t(v)] = in_planned_order(v, upload(ctx, t));
  }
  ctx.encoder.commit();  // the constants' conversions: not part of the recording
  std::vector<ValueId> converted_inputs;
  for (ValueId v : g.inputs()) {
    slots[size_t(v)] = upload(ctx, feeds.at(g.value(v).name));
    rec.inputs.push_back(slots[size_t(v)]);
    if (plan.of(v) != MemoryFormat::contiguous) converted_inputs.push_back(v);
  }

  const uint64_t ops_before = ctx.encoder.stats().ops_recorded;
  for (ValueId v : converted_inputs) slots[size_t(v)] = in_planned_order(v, slots[size_t(v)]);
  std::vector<const cuda::DeviceTensor*> in_ptrs;
  std::vector<cuda::DeviceTensor> outs;
  for (const Node& n : g.nodes()) {
    in_ptrs.clear();
    for (ValueId v : n.inputs) in_ptrs.push_back(v == kNoValue ? nullptr : &slots[size_t(v)]);
    outs.clear();
    for (ValueId v : n.outputs) {
      const TensorType& t = g.value(v).type;
      outs.push_back(cuda::DeviceTensor::empty(ctx.allocator, t.dtype, t.shape, plan.of(v)));
      if (opts.poison_outputs) {
        size_t op = ctx.encoder.memset(outs.back().range(), 0xff);
        if (op != cuda::CommandEncoder::kNoOp) rec.poison_ops.push_back(op);
      }
    }
    cuda::run_node(ctx, n, in_ptrs, outs);
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      ValueId v = n.outputs[i];
      if (remaining_reads[size_t(v)] > 0) slots[size_t(v)] = std::move(outs[i]);
    }
    for (ValueId v : n.inputs)
      if (v != kNoValue && --remaining_reads[size_t(v)] == 0) slots[size_t(v)] = {};
  }
  for (ValueId v : g.outputs()) rec.outputs.push_back(slots[size_t(v)]);

  // Everything since the uploads must still be pending as one recording, and no kernel may
  // have reserved an error record (checked by this run only).
  const uint64_t recorded = ctx.encoder.stats().ops_recorded - ops_before;
  rec.replayable = ctx.encoder.options().use_graphs && recorded == ctx.encoder.pending_ops() &&
                   cuda::ErrorFlags::of(ctx.encoder).pending() == 0;
  return rec;
}

NamedTensors download_outputs(cuda::Context& ctx, const Graph& g,
                              const std::vector<cuda::DeviceTensor>& outputs) {
  NamedTensors result;
  for (size_t i = 0; i < outputs.size(); ++i)
    result[g.value(g.outputs()[i]).name] = download(ctx, outputs[i]);
  return result;
}

// ---- Compiled steps ----------------------------------------------------------------------

struct CompiledStep {
  Graph graph;  // the graph as recorded: a run replays this step when same_graph holds
  int device = 0;
  LayoutPolicy layout = LayoutPolicy::channels_last_convs;
  bool poisoned = false;
  std::vector<cuda::DeviceTensor> inputs;
  std::vector<cuda::DeviceTensor> outputs;
  cuda::RecordedGraph recorded;  // holds every buffer, the above included
};

struct StepCache {
  // Held for a whole run (runs share the device's encoder); recursive because the
  // allocator's reclaimer may run on the thread that allocates inside a run.
  std::recursive_mutex mutex;
  const size_t capacity = cuda::settings().step_cache_capacity;
  std::list<std::unique_ptr<CompiledStep>> steps;  // most recently used first
  const CompiledStep* replaying = nullptr;         // the step a run is replaying
  cuda::CachingAllocator::Registration reclaimer;  // see reclaim()
  bool reclaiming = false;                         // the reclaimer is registered
  CudaStepCacheStats stats;

  StepCache() { stats.capacity = capacity; }

  CompiledStep* find(const Graph& g, int device, bool poison, LayoutPolicy layout) {
    for (auto it = steps.begin(); it != steps.end(); ++it) {
      const CompiledStep& step = **it;
      if (step.device != device || step.poisoned != poison || step.layout != layout ||
          !same_graph(step.graph, g)) {
        continue;
      }
      steps.splice(steps.begin(), steps, it);  // now most recently used
      return steps.front().get();
    }
    return nullptr;
  }

  // Drops least recently used steps until at most `keep` remain.
  void shrink_to(size_t keep) {
    while (steps.size() > keep) {
      steps.pop_back();
      ++stats.evictions;
    }
    stats.size = steps.size();
  }

  // The allocator is about to fail (wait = true): drop every step but one being replayed,
  // so that their memory can serve the request. Skipped while another thread runs.
  void reclaim(bool wait) {
    if (!wait) return;
    std::unique_lock lock(mutex, std::try_to_lock);
    if (!lock.owns_lock()) return;
    stats.evictions +=
        std::erase_if(steps, [&](const auto& step) { return step.get() != replaying; });
    stats.size = steps.size();
  }
};

StepCache& step_cache() {
  // Never destroyed: its graphs and buffers must not be freed after the CUDA runtime has
  // unloaded at exit (see Device::get).
  static StepCache* cache = new StepCache;
  return *cache;
}

NamedTensors replay_step(cuda::Context& ctx, CompiledStep& step, const Graph& g,
                         const NamedTensors& feeds) {
  for (size_t i = 0; i < step.inputs.size(); ++i) {
    const Tensor& feed = feeds.at(g.value(g.inputs()[i]).name);
    if (feed.nbytes() > 0) ctx.encoder.copy_to_device(step.inputs[i].buffer, feed.raw());
  }
  ctx.encoder.replay(step.recorded);
  return download_outputs(ctx, g, step.outputs);
}

}  // namespace

NamedTensors run_graph_cuda(const Graph& g, const NamedTensors& feeds, const RunOptions& opts) {
  cuda::Device& device = cuda::Device::get(0);
  cuda::Context ctx{device, cuda::CommandEncoder::for_device(0),
                    cuda::CachingAllocator::for_device(0)};
  StepCache& cache = step_cache();
  std::lock_guard lock(cache.mutex);
  const LayoutPolicy layout = layout_policy_from_env();
  const bool keep_steps = cache.capacity > 0 && ctx.encoder.options().use_graphs;
  if (keep_steps) {
    if (!cache.reclaiming) {
      cache.reclaimer = ctx.allocator.add_reclaimer([&cache](bool wait) { cache.reclaim(wait); });
      cache.reclaiming = true;
    }
    if (CompiledStep* step = cache.find(g, device.id(), opts.poison_outputs, layout)) {
      ++cache.stats.hits;
      cache.replaying = step;
      try {
        NamedTensors result = replay_step(ctx, *step, g, feeds);
        cache.replaying = nullptr;
        return result;
      } catch (...) {
        cache.replaying = nullptr;
        throw;
      }
    }
  }
  ++cache.stats.misses;

  ctx.encoder.commit();  // the recording starts empty
  Recording rec;
  try {
    rec = record_run(ctx, g, feeds, opts, plan_layouts(g, layout));
  } catch (...) {
    ctx.encoder.discard_recording();  // half a run: nothing of it may launch later
    throw;
  }
  std::unique_ptr<CompiledStep> step;
  if (keep_steps && rec.replayable) {
    step = std::make_unique<CompiledStep>();
    step->recorded = ctx.encoder.finish_recording();
    ctx.encoder.replay(step->recorded);
    // The first launch poisoned the outputs; replays run the same kernels on them.
    for (size_t op : rec.poison_ops) step->recorded.set_enabled(op, false);
  } else {
    if (keep_steps) ++cache.stats.uncacheable;
    ctx.encoder.commit();
  }
  ctx.encoder.synchronize();
  cuda::check_error_flags(ctx);  // throws an Error naming the node whose kernel flagged bad data
  NamedTensors result = download_outputs(ctx, g, rec.outputs);

  if (step) {
    step->graph = g;
    step->device = device.id();
    step->layout = layout;
    step->poisoned = opts.poison_outputs;
    step->inputs = std::move(rec.inputs);
    step->outputs = std::move(rec.outputs);
    cache.steps.push_front(std::move(step));
    ++cache.stats.compiled;
    cache.shrink_to(cache.capacity);
  }
  return result;
}

CudaStepCacheStats cuda_step_cache_stats() {
  StepCache& cache = step_cache();
  std::lock_guard lock(cache.mutex);
  return cache.stats;
}

void release_cuda_step_cache() {
  StepCache& cache = step_cache();
  std::lock_guard lock(cache.mutex);
  cache.steps.clear();
  cache.stats.size = 0;
}

}  // namespace fusebox
