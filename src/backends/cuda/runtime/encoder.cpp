#include "backends/cuda/runtime/encoder.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "backends/cuda/runtime/settings.h"
#include "fusebox/core/compile_trace.h"
#include "fusebox/core/error.h"

namespace fusebox::cuda {
namespace {

struct GraphDestroyer {
  void operator()(cudaGraph_t graph) const { (void)cudaGraphDestroy(graph); }
};
using OwnedGraph = std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, GraphDestroyer>;

std::string launch_text(dim3 grid, dim3 block, size_t shared_bytes) {
  return cat("kernel launch (grid ", grid.x, "x", grid.y, "x", grid.z, ", block ", block.x, "x",
             block.y, "x", block.z, ", ", shared_bytes, " B dynamic shared memory)");
}

}  // namespace

CommandEncoder::Options CommandEncoder::Options::from_env() {
  Options options;
  options.use_graphs = settings().use_graphs;
  options.graph_cache_capacity = settings().graph_cache_capacity;
  return options;
}

CommandEncoder::CommandEncoder(Device& device, Options options, CachingAllocator* allocator)
    : device_(device),
      options_(options),
      stream_(device.stream()),
      cache_(options.graph_cache_capacity, options.miss_warning_every) {
  if (allocator == nullptr) allocator = &CachingAllocator::for_device(device.id());
  reclaimer_ = allocator->add_reclaimer([this](bool wait) { release_completed(wait); });
}

CommandEncoder& CommandEncoder::for_device(int device) {
  // Never destroyed (see Device::get).
  static std::mutex mutex;
  static auto* encoders = new std::map<int, std::unique_ptr<CommandEncoder>>();
  std::lock_guard lock(mutex);
  auto& slot = (*encoders)[device];
  if (!slot) slot = std::make_unique<CommandEncoder>(Device::get(device));
  return *slot;
}

CommandEncoder::~CommandEncoder() {
  reclaimer_.reset();
  try {
    synchronize();
  } catch (const std::exception& e) {
    // A destructor cannot throw; the error (a kernel fault, say) has to be reported here.
    std::fprintf(stderr, "[cuda] command encoder: finishing its work failed: %s\n", e.what());
  }
  reset_recording();
  in_flight_.clear();
  for (cudaEvent_t event : spare_events_) (void)cudaEventDestroy(event);
  if (capture_stream_ != nullptr) (void)cudaStreamDestroy(capture_stream_);
}

// ---- Recorded graphs ---------------------------------------------------------------------

struct RecordedGraph::State {
  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    // Status ignored: a destructor must not throw. Only reached once no launch is running
    // (replay() holds the state until its launch completes).
    for (cudaGraphExec_t exec : execs) (void)cudaGraphExecDestroy(exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
  }

  int device = -1;
  cudaGraph_t graph = nullptr;  // the template the execs came from: set_enabled names its nodes
  // Its instantiations (settings().replay_execs), replays taking them in turn; every change
  // (set_enabled, set_wait) goes to each.
  std::vector<cudaGraphExec_t> execs;
  size_t next_exec = 0;
  std::vector<cudaGraphNode_t> nodes;  // by operation index
  std::vector<DeviceBuffer> buffers;
  std::vector<std::shared_ptr<const void>> objects;
};

size_t RecordedGraph::ops() const {
  return state_ ? state_->nodes.size() : 0;
}

int RecordedGraph::device() const {
  return state_ ? state_->device : -1;
}

void RecordedGraph::set_enabled(size_t op, bool enabled) {
  FUSEBOX_CHECK(state_ && op < state_->nodes.size(), "cuda", "set_enabled: no operation ", op,
                " in a recorded graph of ", ops(), " operations");
  DeviceGuard guard(state_->device);
  for (cudaGraphExec_t exec : state_->execs)
    FUSEBOX_CUDA_CHECK(cudaGraphNodeSetEnabled(exec, state_->nodes[op], enabled ? 1 : 0));
}

// ---- Recording ---------------------------------------------------------------------------

void CommandEncoder::check_buffers(const BufferList& list) const {
  for (const BufferRange& range : list) {
    FUSEBOX_CHECK(!range.buffer || range.buffer.device() == device_.id(), "cuda",
                  "a buffer of device ", range.buffer.device(),
                  " was given to the command encoder of device ", device_.id());
  }
}

void CommandEncoder::find_dependencies(const BufferList& reads, const BufferList& writes) {
  hazards_.clear();
  touched_.clear();
  auto collect = [&](const BufferRange& range, bool write) {
    if (range.bytes == 0) {  // touches nothing: neither ordered nor held
      touched_.push_back(nullptr);
      return;
    }
    // One lookup per range: record_accesses uses the pointer (stable across insertions).
    BlockState& state = blocks_[range.buffer.data()];
    if (!state.buffer) state.buffer = range.buffer;
    touched_.push_back(&state);
    size_t begin = range.offset, end = range.offset + range.bytes;
    for (const Access& earlier : state.accesses) {
      bool overlap = earlier.begin < end && begin < earlier.end;
      // Read after write, write after read, write after write; never read after read.
      if (overlap && (write || earlier.write)) hazards_.push_back(earlier.op);
    }
  };
  for (const BufferRange& range : reads) collect(range, false);
  for (const BufferRange& range : writes) collect(range, true);
  std::sort(hazards_.begin(), hazards_.end());
  hazards_.erase(std::unique(hazards_.begin(), hazards_.end()), hazards_.end());
  // Leave out a hazard that another one already orders through its own edge.
  deps_.clear();
  for (uint32_t from : hazards_) {
    bool implied = std::any_of(hazards_.begin(), hazards_.end(), [&](uint32_t other) {
      const uint32_t* first = dep_pool_.data() + dep_begin_[other];
      const uint32_t* last = dep_pool_.data() + dep_begin_[other + 1];
      return other != from && std::binary_search(first, last, from);
    });
    if (!implied) deps_.push_back(from);
  }
}

void CommandEncoder::record_accesses(uint32_t op, const BufferList& reads,
                                     const BufferList& writes) {
  size_t i = 0;
  for (const BufferRange& range : reads) {
    BlockState* state = touched_[i++];
    if (state != nullptr) {
      state->accesses.push_back({range.offset, range.offset + range.bytes, op, false});
    }
  }
  for (const BufferRange& range : writes) {
    BlockState* state = touched_[i++];
    if (state == nullptr) continue;
    size_t begin = range.offset, end = range.offset + range.bytes;
    // An access inside this write's bytes is ordered before it, and everything later that
    // overlaps those bytes overlaps this write too: it only needs to wait for this one.
    std::erase_if(state->accesses,
                  [&](const Access& a) { return a.begin >= begin && a.end <= end; });
    state->accesses.push_back({begin, end, op, true});
  }
}

void CommandEncoder::retain(const BufferList& list) {
  for (const BufferRange& range : list) {
    if (!range.buffer) continue;
    BlockState& state = blocks_[range.buffer.data()];
    if (!state.buffer) state.buffer = range.buffer;
  }
}

void CommandEncoder::ensure_graph() {
  if (graph_ == nullptr) FUSEBOX_CUDA_CHECK(cudaGraphCreate(&graph_, 0));
}

template <class AppendKey, class MakeNode>
size_t CommandEncoder::add_node(const BufferList& reads, const BufferList& writes,
                                AppendKey&& append_key_part, MakeNode&& make_node) {
  ensure_graph();
  find_dependencies(reads, writes);
  if (extra_dep_ != kNoOp) {
    const auto extra = uint32_t(extra_dep_);
    extra_dep_ = kNoOp;
    auto at = std::lower_bound(deps_.begin(), deps_.end(), extra);
    if (at == deps_.end() || *at != extra) deps_.insert(at, extra);
  }
  dep_nodes_.clear();
  for (uint32_t d : deps_) dep_nodes_.push_back(nodes_[d]);
  cudaGraphNode_t node = make_node(dep_nodes_.data(), dep_nodes_.size());
  // The node exists: only now does the recording change.
  auto op = uint32_t(nodes_.size());
  nodes_.push_back(node);
  append_key_part(key_);
  append_key(key_, uint32_t(deps_.size()));
  for (uint32_t d : deps_) append_key(key_, d);
  dep_pool_.insert(dep_pool_.end(), deps_.begin(), deps_.end());
  dep_begin_.push_back(uint32_t(dep_pool_.size()));
  record_accesses(op, reads, writes);
  ++pending_ops_;
  ++stats_.ops_recorded;
  ++stats_.nodes_recorded;
  stats_.edges_recorded += deps_.size();
  return op;
}

size_t CommandEncoder::note_direct_op(const BufferList& reads, const BufferList& writes) {
  retain(reads);
  retain(writes);
  ++stats_.ops_recorded;
  ++stats_.direct_launches;
  return pending_ops_++;
}

void CommandEncoder::opt_in_shared_memory(const void* kernel, size_t shared_bytes) {
  const DeviceProperties& props = device_.properties();
  if (shared_bytes <= props.shared_memory_per_block) return;
  FUSEBOX_CHECK(shared_bytes <= props.shared_memory_per_block_optin, "cuda",
                "a kernel launch asks for ", shared_bytes,
                " B of dynamic shared memory; the device allows at most ",
                props.shared_memory_per_block_optin, " B per block");
  size_t& granted = shared_opt_in_[kernel];
  if (granted >= shared_bytes) return;
  FUSEBOX_CUDA_CHECK_AS(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes)),
      cat("cudaFuncSetAttribute(MaxDynamicSharedMemorySize = ", shared_bytes, ")"));
  granted = shared_bytes;
}

size_t CommandEncoder::launch_kernel(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes,
                                     void** args, const BufferList& reads,
                                     const BufferList& writes) {
  check_buffers(reads);
  check_buffers(writes);
  uint64_t threads = uint64_t(block.x) * block.y * block.z;
  FUSEBOX_CHECK(threads >= 1 && uint64_t(grid.x) * grid.y * grid.z >= 1, "cuda",
                launch_text(grid, block, shared_bytes), " has an empty grid or block");
  FUSEBOX_CHECK(threads <= uint64_t(device_.properties().max_threads_per_block), "cuda",
                launch_text(grid, block, shared_bytes), " has ", threads,
                " threads per block; the device allows ",
                device_.properties().max_threads_per_block);
  DeviceGuard guard(device_.id());
  opt_in_shared_memory(kernel, shared_bytes);
  if (!options_.use_graphs) {
    FUSEBOX_CUDA_CHECK_AS(cudaLaunchKernel(kernel, grid, block, args, shared_bytes, stream_),
                          launch_text(grid, block, shared_bytes));
    return note_direct_op(reads, writes);
  }
  return add_node(
      reads, writes,
      [&](std::string& key) {
        key += 'K';
        append_key(key, reinterpret_cast<uintptr_t>(kernel));
        append_key(key, grid);
        append_key(key, block);
        append_key(key, shared_bytes);
      },
      [&](const cudaGraphNode_t* deps, size_t count) {
        cudaKernelNodeParams params{};
        params.func = const_cast<void*>(kernel);
        params.gridDim = grid;
        params.blockDim = block;
        params.sharedMemBytes = unsigned(shared_bytes);
        params.kernelParams = args;
        cudaGraphNode_t node = nullptr;
        FUSEBOX_CUDA_CHECK_AS(
            cudaGraphAddKernelNode(&node, graph_, deps, count, &params),
            cat("cudaGraphAddKernelNode: ", launch_text(grid, block, shared_bytes)));
        return node;
      });
}

size_t CommandEncoder::capture_library_call(const BufferList& reads, const BufferList& writes,
                                            const std::function<void(cudaStream_t)>& record) {
  check_buffers(reads);
  check_buffers(writes);
  DeviceGuard guard(device_.id());
  if (!options_.use_graphs) {
    record(stream_);
    return note_direct_op(reads, writes);
  }
  if (capture_stream_ == nullptr) {
    FUSEBOX_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
  }
  FUSEBOX_CUDA_CHECK(cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t captured = nullptr;
  try {
    record(capture_stream_);
  } catch (...) {
    (void)cudaStreamEndCapture(capture_stream_, &captured);
    if (captured != nullptr) (void)cudaGraphDestroy(captured);
    (void)cudaGetLastError();
    throw;
  }
  cudaError_t ended = cudaStreamEndCapture(capture_stream_, &captured);
  OwnedGraph child(captured);
  if (ended != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error("cuda",
                cat("capture_library_call: cudaStreamEndCapture failed: ", cuda_error_text(ended),
                    ". The recorded call did something a stream capture cannot hold "
                    "(a synchronisation, cudaMalloc, work on another stream, ...)"));
  }
  return add_graph_node(reads, writes, child.get());
}

size_t CommandEncoder::add_child_graph(const BufferList& reads, const BufferList& writes,
                                       cudaGraph_t child) {
  FUSEBOX_CHECK(child != nullptr, "cuda", "add_child_graph: no graph given");
  check_buffers(reads);
  check_buffers(writes);
  DeviceGuard guard(device_.id());
  if (!options_.use_graphs) {
    size_t count = 0;
    FUSEBOX_CUDA_CHECK(cudaGraphGetNodes(child, nullptr, &count));
    if (count > 0) {
      cudaGraphExec_t exec = nullptr;
      FUSEBOX_CUDA_CHECK_AS(cudaGraphInstantiate(&exec, child, 0),
                            cat("cudaGraphInstantiate(child graph of ", count, " nodes)"));
      cudaError_t launched = cudaGraphLaunch(exec, stream_);
      // A running exec may be destroyed: the driver frees it when the launch completes.
      (void)cudaGraphExecDestroy(exec);
      FUSEBOX_CUDA_CHECK_AS(launched, "cudaGraphLaunch(child graph)");
    }
    return note_direct_op(reads, writes);
  }
  return add_graph_node(reads, writes, child);
}

size_t CommandEncoder::add_graph_node(const BufferList& reads, const BufferList& writes,
                                      cudaGraph_t child) {
  size_t child_nodes = 0;
  FUSEBOX_CUDA_CHECK(cudaGraphGetNodes(child, nullptr, &child_nodes));
  if (child_nodes == 0) {
    // Nothing to run: an empty node keeps one node per operation.
    return add_node(
        reads, writes, [](std::string& key) { key += 'E'; },
        [&](const cudaGraphNode_t* deps, size_t count) {
          cudaGraphNode_t node = nullptr;
          FUSEBOX_CUDA_CHECK(cudaGraphAddEmptyNode(&node, graph_, deps, count));
          return node;
        });
  }
  const std::string topology = graph_topology(child);
  return add_node(
      reads, writes,
      [&](std::string& key) {
        key += "G(";
        key += topology;
        key += ')';
      },
      [&](const cudaGraphNode_t* deps, size_t count) {
        cudaGraphNode_t node = nullptr;  // the child graph is cloned into the node
        FUSEBOX_CUDA_CHECK(cudaGraphAddChildGraphNode(&node, graph_, deps, count, child));
        return node;
      });
}

size_t CommandEncoder::memset(const BufferRange& dst, uint8_t value) {
  if (dst.bytes == 0) return kNoOp;
  BufferList writes{dst};
  check_buffers(writes);
  DeviceGuard guard(device_.id());
  if (!options_.use_graphs) {
    FUSEBOX_CUDA_CHECK_AS(cudaMemsetAsync(dst.data(), value, dst.bytes, stream_),
                          cat("cudaMemsetAsync(", dst.bytes, " bytes)"));
    return note_direct_op({}, writes);
  }
  return add_node(
      {}, writes,
      [&](std::string& key) {
        key += 'S';
        append_key(key, dst.bytes);
      },
      [&](const cudaGraphNode_t* deps, size_t count) {
        cudaMemsetParams params{};
        params.dst = dst.data();
        params.value = value;
        params.elementSize = 1;
        params.width = dst.bytes;
        params.height = 1;
        cudaGraphNode_t node = nullptr;
        FUSEBOX_CUDA_CHECK_AS(cudaGraphAddMemsetNode(&node, graph_, deps, count, &params),
                              cat("cudaGraphAddMemsetNode(", dst.bytes, " bytes)"));
        return node;
      });
}

size_t CommandEncoder::memcpy(const BufferRange& dst, const BufferRange& src) {
  FUSEBOX_CHECK(dst.bytes == src.bytes, "cuda", "memcpy between ranges of different sizes (",
                dst.bytes, " and ", src.bytes, " bytes)");
  if (dst.bytes == 0) return kNoOp;
  BufferList reads{src}, writes{dst};
  check_buffers(reads);
  check_buffers(writes);
  DeviceGuard guard(device_.id());
  if (!options_.use_graphs) {
    FUSEBOX_CUDA_CHECK_AS(
        cudaMemcpyAsync(dst.data(), src.data(), dst.bytes, cudaMemcpyDeviceToDevice, stream_),
        cat("cudaMemcpyAsync(", dst.bytes, " bytes, device to device)"));
    return note_direct_op(reads, writes);
  }
  return add_node(
      reads, writes,
      [&](std::string& key) {
        key += 'C';
        append_key(key, dst.bytes);
      },
      [&](const cudaGraphNode_t* deps, size_t count) {
        cudaGraphNode_t node = nullptr;
        FUSEBOX_CUDA_CHECK_AS(
            cudaGraphAddMemcpyNode1D(&node, graph_, deps, count, dst.data(), src.data(), dst.bytes,
                                     cudaMemcpyDeviceToDevice),
            cat("cudaGraphAddMemcpyNode1D(", dst.bytes, " bytes)"));
        return node;
      });
}

void CommandEncoder::add_temporary(DeviceBuffer buffer) {
  if (buffer) temporaries_.push_back(std::move(buffer));
}

void CommandEncoder::keep_alive(std::shared_ptr<const void> object) {
  if (object) objects_.push_back(std::move(object));
}

// ---- Commit, replay and completion -------------------------------------------------------

void CommandEncoder::reset_recording() {
  if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
  graph_ = nullptr;
  nodes_.clear();
  dep_pool_.clear();
  dep_begin_.assign(1, 0);
  key_.clear();  // keeps its capacity for the next recording
  blocks_.clear();
  objects_.clear();
  temporaries_.clear();
  scratch_ = DeviceBuffer();
  overflow_ = DeviceBuffer();
  clear_temporary_region();
  pending_ops_ = 0;
}

void CommandEncoder::set_temporary_region(const BufferRange& region) {
  region_ = region;
  region_used_ = 0;
  overflow_used_ = 0;  // a new operation
}

void CommandEncoder::clear_temporary_region() {
  region_.reset();
  region_used_ = 0;
  overflow_used_ = 0;
}

namespace {

// Temporaries in a region start on this boundary: enough for any vector access.
constexpr size_t kTemporaryAlignment = 256;

size_t aligned_up(size_t bytes) {
  return (bytes + kTemporaryAlignment - 1) / kTemporaryAlignment * kTemporaryAlignment;
}

}  // namespace

std::optional<BufferRange> CommandEncoder::from_region(size_t bytes) {
  if (!region_) return std::nullopt;
  // The region starts aligned (the arena's offsets are); keep every temporary so.
  const size_t at = aligned_up(region_used_);
  if (at + bytes > region_->bytes) return std::nullopt;
  region_used_ = at + bytes;
  return BufferRange(region_->buffer, region_->offset + at, bytes);
}

BufferRange CommandEncoder::temporary(CachingAllocator& allocator, size_t bytes) {
  // A zero-size temporary still gets a (tiny) range so that pointers are valid.
  bytes = std::max<size_t>(bytes, 1);
  if (std::optional<BufferRange> lent = from_region(bytes)) return *lent;
  if (region_) {
    // The overflow buffer, from where this operation's earlier temporaries end. A larger
    // one replaces it when too small (at the same offset: the buffer then holds a whole
    // operation's temporaries for the operations after); the old one is held with the
    // recording, whose operations so far use it.
    const size_t at = aligned_up(overflow_used_);
    if (at + bytes > overflow_.size()) {
      overflow_ = allocator.allocate(at + bytes);
      add_temporary(overflow_);
    }
    overflow_used_ = at + bytes;
    return BufferRange(overflow_, at, bytes);
  }
  DeviceBuffer buffer = allocator.allocate(bytes);
  add_temporary(buffer);
  return BufferRange(std::move(buffer), 0, bytes);
}

BufferRange CommandEncoder::scratch(CachingAllocator& allocator, size_t bytes) {
  if (bytes == 0) return BufferRange(DeviceBuffer(), 0, 0);
  if (std::optional<BufferRange> lent = from_region(bytes)) return *lent;
  if (scratch_.size() < bytes) {
    scratch_ = allocator.allocate(bytes);
    add_temporary(scratch_);  // held with the recording, like any temporary
  }
  return BufferRange(scratch_, 0, bytes);
}

CommandEncoder::InFlight CommandEncoder::take_held() {
  InFlight held;
  held.buffers.reserve(blocks_.size() + temporaries_.size());
  for (auto& [address, state] : blocks_) held.buffers.push_back(std::move(state.buffer));
  for (DeviceBuffer& buffer : temporaries_) held.buffers.push_back(std::move(buffer));
  temporaries_.clear();
  held.objects = std::move(objects_);
  objects_.clear();
  return held;
}

void CommandEncoder::hold_until_done(InFlight held) {
  if (held.buffers.empty() && held.objects.empty()) return;
  // Everything held is released once the stream has passed this point.
  held.done = take_event();
  cudaError_t recorded = cudaEventRecord(held.done, stream_);
  if (recorded != cudaSuccess) {
    std::lock_guard lock(in_flight_mutex_);
    spare_events_.push_back(held.done);
  }
  FUSEBOX_CUDA_CHECK_AS(recorded, "cudaEventRecord(completion)");
  std::lock_guard lock(in_flight_mutex_);
  in_flight_.push_back(std::move(held));
}

void CommandEncoder::commit() {
  DeviceGuard guard(device_.id());
  // Take the recording; whatever happens below, the encoder starts a fresh one.
  const bool had_work = pending_ops_ > 0;
  InFlight held = take_held();
  OwnedGraph graph(graph_);
  graph_ = nullptr;
  try {
    if (graph && had_work) {
      cudaGraphExec_t exec = cache_.prepare(key_, graph.get());
      FUSEBOX_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    }
  } catch (...) {
    reset_recording();
    throw;
  }
  reset_recording();
  if (had_work) ++stats_.commits;
  hold_until_done(std::move(held));
  release_completed(false);
}

void CommandEncoder::discard_recording() {
  if (!options_.use_graphs) return commit();
  // Nothing recorded has been launched: the buffers it holds may return at once (earlier
  // commits that use them hold handles of their own).
  reset_recording();
}

RecordedGraph CommandEncoder::finish_recording() {
  FUSEBOX_CHECK(options_.use_graphs, "cuda",
                "finish_recording needs CUDA graphs, but this encoder launches directly "
                "(FUSEBOX_CUDA_GRAPHS=0): the operations have run already");
  if (graph_ == nullptr || pending_ops_ == 0) {
    commit();  // temporaries and objects wait for the work committed before
    return {};
  }
  DeviceGuard guard(device_.id());
  auto state = std::make_shared<RecordedGraph::State>();
  state->device = device_.id();
  InFlight held = take_held();
  state->buffers = std::move(held.buffers);
  state->objects = std::move(held.objects);
  state->graph = graph_;
  graph_ = nullptr;
  state->nodes = std::move(nodes_);
  reset_recording();
  const TracePhase trace("cuda graph instantiate");
  for (size_t i = 0; i < settings().replay_execs; ++i) {
    cudaGraphExec_t exec = nullptr;
    FUSEBOX_CUDA_CHECK_AS(
        cudaGraphInstantiate(&exec, state->graph, 0),
        cat("cudaGraphInstantiate(recorded graph of ", state->nodes.size(), " nodes)"));
    state->execs.push_back(exec);
  }
  ++stats_.recordings_finished;
  RecordedGraph recorded;
  recorded.state_ = std::move(state);
  return recorded;
}

void CommandEncoder::replay(const RecordedGraph& graph) {
  commit();
  if (!graph) return;
  FUSEBOX_CHECK(graph.state_->device == device_.id(), "cuda", "a graph recorded on device ",
                graph.state_->device, " was replayed on the command encoder of device ",
                device_.id());
  DeviceGuard guard(device_.id());
  RecordedGraph::State& state = *graph.state_;
  FUSEBOX_CUDA_CHECK(cudaGraphLaunch(state.execs[state.next_exec], stream_));
  state.next_exec = (state.next_exec + 1) % state.execs.size();
  ++stats_.replays;
  InFlight held;
  held.objects.push_back(graph.state_);  // the exec, its buffers and objects
  hold_until_done(std::move(held));
}

cudaEvent_t CommandEncoder::take_event() {
  {
    std::lock_guard lock(in_flight_mutex_);
    if (!spare_events_.empty()) {
      cudaEvent_t event = spare_events_.back();
      spare_events_.pop_back();
      return event;
    }
  }
  cudaEvent_t event = nullptr;
  FUSEBOX_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void CommandEncoder::release_completed(bool wait) {
  std::vector<InFlight> finished;  // released when this function returns, outside the lock
  std::lock_guard lock(in_flight_mutex_);
  // One stream: when the newest commit is done, all are.
  if (wait && !in_flight_.empty()) {
    FUSEBOX_CUDA_CHECK_AS(cudaEventSynchronize(in_flight_.back().done),
                          "cudaEventSynchronize(commit completion)");
  }
  while (!in_flight_.empty()) {
    cudaError_t status = cudaEventQuery(in_flight_.front().done);
    if (status == cudaErrorNotReady) break;
    FUSEBOX_CUDA_CHECK_AS(status, "cudaEventQuery(commit completion)");
    spare_events_.push_back(in_flight_.front().done);
    finished.push_back(std::move(in_flight_.front()));
    in_flight_.pop_front();
  }
}

void CommandEncoder::synchronize() {
  commit();
  DeviceGuard guard(device_.id());
  FUSEBOX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  release_completed(true);
}

// Commits, then issues one stream-ordered copy (the copies below share it).
void CommandEncoder::issue_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                const char* what) {
  commit();
  if (bytes == 0) return;
  DeviceGuard guard(device_.id());
  FUSEBOX_CUDA_CHECK_AS(cudaMemcpyAsync(dst, src, bytes, kind, stream_),
                        cat("cudaMemcpyAsync(", bytes, " bytes, ", what, ")"));
}

void CommandEncoder::copy_to_device(const BufferRange& dst, const void* host) {
  issue_copy(dst.data(), host, dst.bytes, cudaMemcpyHostToDevice, "host to device");
  synchronize();
}

void CommandEncoder::copy_to_host(void* host, const BufferRange& src) {
  issue_copy(host, src.data(), src.bytes, cudaMemcpyDeviceToHost, "device to host");
  synchronize();
}

void CommandEncoder::copy_to_device_async(const BufferRange& dst, const void* pinned_host) {
  issue_copy(dst.data(), pinned_host, dst.bytes, cudaMemcpyHostToDevice, "pinned host to device");
}

void CommandEncoder::copy_to_host_async(void* pinned_host, const BufferRange& src) {
  issue_copy(pinned_host, src.data(), src.bytes, cudaMemcpyDeviceToHost, "device to pinned host");
}

void CommandEncoder::copy_now(const BufferRange& dst, const BufferRange& src) {
  FUSEBOX_CHECK(dst.bytes == src.bytes, "cuda", "copy_now: ", src.bytes, " bytes into ", dst.bytes);
  issue_copy(dst.data(), src.data(), dst.bytes, cudaMemcpyDeviceToDevice, "device to device");
}

// An event of its own (not one of the completion events, which are recycled).
struct Fence::State {
  cudaEvent_t event = nullptr;
  int device = 0;
  ~State() {
    if (event != nullptr) (void)cudaEventDestroy(event);
  }
};

bool Fence::done() const {
  if (!state_) return true;
  DeviceGuard guard(state_->device);
  const cudaError_t status = cudaEventQuery(state_->event);
  if (status == cudaErrorNotReady) return false;
  FUSEBOX_CUDA_CHECK_AS(status, "cudaEventQuery(fence)");
  return true;
}

void Fence::wait() const {
  if (!state_) return;
  DeviceGuard guard(state_->device);
  FUSEBOX_CUDA_CHECK_AS(cudaEventSynchronize(state_->event), "cudaEventSynchronize(fence)");
}

Fence Fence::record(cudaStream_t stream, int device) {
  DeviceGuard guard(device);
  auto state = std::make_shared<Fence::State>();
  state->device = device;
  FUSEBOX_CUDA_CHECK(cudaEventCreateWithFlags(&state->event, cudaEventDisableTiming));
  FUSEBOX_CUDA_CHECK_AS(cudaEventRecord(state->event, stream), "cudaEventRecord(fence)");
  Fence f;
  f.state_ = std::move(state);
  return f;
}

Fence CommandEncoder::fence() {
  commit();
  return Fence::record(stream_, device_.id());
}

void Fence::wait_on(cudaStream_t stream) const {
  if (!state_) return;
  FUSEBOX_CUDA_CHECK_AS(cudaStreamWaitEvent(stream, state_->event, 0),
                        "cudaStreamWaitEvent(fence)");
}

void CommandEncoder::wait(const Fence& fence) {
  commit();
  DeviceGuard guard(device_.id());
  fence.wait_on(stream_);
}

void RecordedGraph::set_wait(size_t op, const Fence& fence) {
  FUSEBOX_CHECK(state_ && op < state_->nodes.size(), "cuda", "set_wait: no operation ", op,
                " in a recorded graph of ", ops(), " operations");
  FUSEBOX_CHECK(fence.state_ != nullptr, "cuda", "set_wait: an empty fence");
  DeviceGuard guard(state_->device);
  for (cudaGraphExec_t exec : state_->execs)
    FUSEBOX_CUDA_CHECK(
        cudaGraphExecEventWaitNodeSetEvent(exec, state_->nodes[op], fence.state_->event));
}

size_t CommandEncoder::wait_for(const Fence& fence, const BufferList& writes, size_t after) {
  if (!fence) return kNoOp;
  check_buffers(writes);
  DeviceGuard guard(device_.id());
  if (!options_.use_graphs) {
    fence.wait_on(stream_);
    return note_direct_op({}, writes);
  }
  keep_alive(fence.state_);
  extra_dep_ = after;
  return add_node(
      {}, writes, [&](std::string& key) { key += 'W'; },
      [&](const cudaGraphNode_t* deps, size_t count) {
        cudaGraphNode_t node = nullptr;
        FUSEBOX_CUDA_CHECK_AS(
            cudaGraphAddEventWaitNode(&node, graph_, deps, count, fence.state_->event),
            "cudaGraphAddEventWaitNode");
        return node;
      });
}

// ---- Introspection -----------------------------------------------------------------------

cudaGraphNode_t CommandEncoder::recorded_node(size_t op) const {
  FUSEBOX_CHECK(op < nodes_.size(), "cuda", "no recorded graph node for operation ", op, " (",
                nodes_.size(), " recorded)");
  return nodes_[op];
}

std::vector<std::pair<size_t, size_t>> CommandEncoder::recorded_edges() const {
  std::vector<std::pair<size_t, size_t>> edges;
  if (graph_ == nullptr) return edges;
  size_t count = 0;
  FUSEBOX_CUDA_CHECK(cudaGraphGetEdges(graph_, nullptr, nullptr, nullptr, &count));
  std::vector<cudaGraphNode_t> from(count), to(count);
  std::vector<cudaGraphEdgeData> data(count);  // (ours are all plain edges)
  if (count > 0) {
    FUSEBOX_CUDA_CHECK(cudaGraphGetEdges(graph_, from.data(), to.data(), data.data(), &count));
  }
  std::unordered_map<cudaGraphNode_t, size_t> op_of;
  for (size_t op = 0; op < nodes_.size(); ++op) op_of.emplace(nodes_[op], op);
  for (size_t i = 0; i < count; ++i) edges.emplace_back(op_of.at(from[i]), op_of.at(to[i]));
  std::sort(edges.begin(), edges.end());
  return edges;
}

CommandEncoder::Stats CommandEncoder::stats() const {
  Stats stats = stats_;
  stats.graph_cache = cache_.stats();
  return stats;
}

}  // namespace fusebox::cuda
