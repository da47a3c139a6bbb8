#include "backends/cuda/encoder.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "backends/cuda/env.h"
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
  if (auto text = env_text("FUSEBOX_CUDA_GRAPHS")) {
    options.use_graphs = parse_switch(*text, "FUSEBOX_CUDA_GRAPHS");
  }
  if (auto text = env_text("FUSEBOX_CUDA_GRAPH_CACHE")) {
    options.graph_cache_capacity = parse_count(*text, "FUSEBOX_CUDA_GRAPH_CACHE");
  }
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

// ---- Recording ---------------------------------------------------------------------------

void CommandEncoder::check_buffers(const BufferList& list) const {
  for (const BufferRange& range : list) {
    FUSEBOX_CHECK(!range.buffer || range.buffer.device() == device_.id(), "cuda",
                  "a buffer of device ", range.buffer.device(),
                  " was given to the command encoder of device ", device_.id());
  }
}

std::vector<uint32_t> CommandEncoder::dependencies(const BufferList& reads,
                                                   const BufferList& writes) {
  std::vector<uint32_t> hazards;
  auto collect = [&](const BufferRange& range, bool write) {
    if (range.bytes == 0) return;
    auto found = blocks_.find(range.buffer.data());
    if (found == blocks_.end()) return;
    size_t begin = range.offset, end = range.offset + range.bytes;
    for (const Access& earlier : found->second.accesses) {
      bool overlap = earlier.begin < end && begin < earlier.end;
      // Read after write, write after read, write after write; never read after read.
      if (overlap && (write || earlier.write)) hazards.push_back(earlier.op);
    }
  };
  for (const BufferRange& range : reads) collect(range, false);
  for (const BufferRange& range : writes) collect(range, true);
  std::sort(hazards.begin(), hazards.end());
  hazards.erase(std::unique(hazards.begin(), hazards.end()), hazards.end());
  // Leave out a hazard that another one already orders through its own edge.
  std::vector<uint32_t> edges;
  for (uint32_t from : hazards) {
    bool implied = std::any_of(hazards.begin(), hazards.end(), [&](uint32_t other) {
      const auto& deps = node_deps_[other];
      return other != from && std::binary_search(deps.begin(), deps.end(), from);
    });
    if (!implied) edges.push_back(from);
  }
  return edges;
}

void CommandEncoder::record_accesses(uint32_t op, const BufferList& reads,
                                     const BufferList& writes) {
  auto state_of = [&](const BufferRange& range) -> BlockState& {
    BlockState& state = blocks_[range.buffer.data()];
    if (!state.buffer) state.buffer = range.buffer;
    return state;
  };
  for (const BufferRange& range : reads) {
    if (range.bytes == 0) continue;
    state_of(range).accesses.push_back({range.offset, range.offset + range.bytes, op, false});
  }
  for (const BufferRange& range : writes) {
    if (range.bytes == 0) continue;
    BlockState& state = state_of(range);
    size_t begin = range.offset, end = range.offset + range.bytes;
    // An access inside this write's bytes is ordered before it, and everything later that
    // overlaps those bytes overlaps this write too: it only needs to wait for this one.
    std::erase_if(state.accesses,
                  [&](const Access& a) { return a.begin >= begin && a.end <= end; });
    state.accesses.push_back({begin, end, op, true});
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

size_t CommandEncoder::add_node(
    const BufferList& reads, const BufferList& writes, std::string_view key_part,
    const std::function<cudaGraphNode_t(const cudaGraphNode_t*, size_t)>& add) {
  ensure_graph();
  std::vector<uint32_t> deps = dependencies(reads, writes);
  std::vector<cudaGraphNode_t> dep_nodes;
  dep_nodes.reserve(deps.size());
  for (uint32_t d : deps) dep_nodes.push_back(nodes_[d]);
  cudaGraphNode_t node = add(dep_nodes.data(), dep_nodes.size());
  auto op = uint32_t(nodes_.size());
  nodes_.push_back(node);
  key_ += key_part;
  append_key(key_, uint32_t(deps.size()));
  for (uint32_t d : deps) append_key(key_, d);
  node_deps_.push_back(std::move(deps));
  record_accesses(op, reads, writes);
  ++pending_ops_;
  ++stats_.ops_recorded;
  ++stats_.nodes_recorded;
  stats_.edges_recorded += dep_nodes.size();
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
  std::string key_part(1, 'K');
  append_key(key_part, reinterpret_cast<uintptr_t>(kernel));
  append_key(key_part, grid);
  append_key(key_part, block);
  append_key(key_part, shared_bytes);
  return add_node(reads, writes, key_part, [&](const cudaGraphNode_t* deps, size_t count) {
    cudaKernelNodeParams params{};
    params.func = const_cast<void*>(kernel);
    params.gridDim = grid;
    params.blockDim = block;
    params.sharedMemBytes = unsigned(shared_bytes);
    params.kernelParams = args;
    cudaGraphNode_t node = nullptr;
    FUSEBOX_CUDA_CHECK_AS(cudaGraphAddKernelNode(&node, graph_, deps, count, &params),
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
  size_t child_nodes = 0;
  FUSEBOX_CUDA_CHECK(cudaGraphGetNodes(child.get(), nullptr, &child_nodes));
  if (child_nodes == 0) {
    // Nothing captured: an empty node keeps one node per operation.
    return add_node(reads, writes, "E", [&](const cudaGraphNode_t* deps, size_t count) {
      cudaGraphNode_t node = nullptr;
      FUSEBOX_CUDA_CHECK(cudaGraphAddEmptyNode(&node, graph_, deps, count));
      return node;
    });
  }
  std::string key_part = "G(" + graph_topology(child.get()) + ")";
  return add_node(reads, writes, key_part, [&](const cudaGraphNode_t* deps, size_t count) {
    cudaGraphNode_t node = nullptr;  // the child graph is cloned into the node
    FUSEBOX_CUDA_CHECK(cudaGraphAddChildGraphNode(&node, graph_, deps, count, child.get()));
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
  std::string key_part(1, 'S');
  append_key(key_part, dst.bytes);
  return add_node({}, writes, key_part, [&](const cudaGraphNode_t* deps, size_t count) {
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
  std::string key_part(1, 'C');
  append_key(key_part, dst.bytes);
  return add_node(reads, writes, key_part, [&](const cudaGraphNode_t* deps, size_t count) {
    cudaGraphNode_t node = nullptr;
    FUSEBOX_CUDA_CHECK_AS(cudaGraphAddMemcpyNode1D(&node, graph_, deps, count, dst.data(),
                                                   src.data(), dst.bytes, cudaMemcpyDeviceToDevice),
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

// ---- Commit and completion ---------------------------------------------------------------

void CommandEncoder::reset_recording() {
  if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
  graph_ = nullptr;
  nodes_.clear();
  node_deps_.clear();
  key_.clear();
  blocks_.clear();
  objects_.clear();
  temporaries_.clear();
  pending_ops_ = 0;
}

void CommandEncoder::commit() {
  DeviceGuard guard(device_.id());
  // Take the recording; whatever happens below, the encoder starts a fresh one.
  InFlight held;
  for (auto& [address, state] : blocks_) held.buffers.push_back(std::move(state.buffer));
  for (DeviceBuffer& buffer : temporaries_) held.buffers.push_back(std::move(buffer));
  held.objects = std::move(objects_);
  OwnedGraph graph(graph_);
  graph_ = nullptr;
  std::string key = std::move(key_);
  bool had_work = pending_ops_ > 0;
  reset_recording();

  if (graph && had_work) {
    cudaGraphExec_t exec = cache_.prepare(key, graph.get());
    FUSEBOX_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  }
  if (had_work) ++stats_.commits;
  if (!held.buffers.empty() || !held.objects.empty()) {
    // Everything held is released once the stream has passed this point.
    held.done = take_event();
    cudaError_t recorded = cudaEventRecord(held.done, stream_);
    if (recorded != cudaSuccess) {
      std::lock_guard lock(in_flight_mutex_);
      spare_events_.push_back(held.done);
    }
    FUSEBOX_CUDA_CHECK_AS(recorded, "cudaEventRecord(commit completion)");
    std::lock_guard lock(in_flight_mutex_);
    in_flight_.push_back(std::move(held));
  }
  release_completed(false);
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

void CommandEncoder::copy_to_device(const BufferRange& dst, const void* host) {
  commit();
  if (dst.bytes == 0) return;
  DeviceGuard guard(device_.id());
  FUSEBOX_CUDA_CHECK_AS(
      cudaMemcpyAsync(dst.data(), host, dst.bytes, cudaMemcpyHostToDevice, stream_),
      cat("cudaMemcpyAsync(", dst.bytes, " bytes, host to device)"));
  FUSEBOX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  release_completed(true);
}

void CommandEncoder::copy_to_host(void* host, const BufferRange& src) {
  commit();
  if (src.bytes == 0) return;
  DeviceGuard guard(device_.id());
  FUSEBOX_CUDA_CHECK_AS(
      cudaMemcpyAsync(host, src.data(), src.bytes, cudaMemcpyDeviceToHost, stream_),
      cat("cudaMemcpyAsync(", src.bytes, " bytes, device to host)"));
  FUSEBOX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  release_completed(true);
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
