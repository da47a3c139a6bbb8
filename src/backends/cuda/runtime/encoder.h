// The command encoder: records the CUDA backend's work into a CUDA graph and launches it
// on the device stream at commit().
//
//   CommandEncoder& enc = CommandEncoder::for_device(0);
//   DeviceBuffer x = ..., y = ..., tmp = memory.allocate(bytes);
//   enc.launch(scale_kernel, grid, block, /*shared_bytes=*/0,
//              /*reads=*/{x}, /*writes=*/{tmp}, x.as<float>(), tmp.as<float>(), 2.0f, n);
//   enc.capture_library_call({tmp, weights}, {y}, [&](cudaStream_t s) {
//     FUSEBOX_CUBLAS_CHECK(cublasLtMatmul(dev.cublaslt_handle(), ..., s));
//   });
//   enc.commit();        // instantiate or update the graph, launch it; returns at once
//   enc.synchronize();   // wait for everything committed
//
// Recording. A kernel launch becomes a kernel node (its arguments are converted to the
// kernel's parameter types and copied when recorded). A library call (cuBLASLt, cuDNN, or
// any stream-ordered work) is recorded by running it on a side stream under stream capture
// (cudaStreamCaptureModeThreadLocal) and added as a child-graph node. A capture forbids
// allocation and synchronisation, so allocate the workspace and create the
// library handles before the call; inside, bind cuDNN to the given stream
// (Device::cudnn_handle(s)) and pass it to cuBLASLt. memset and memcpy become memset and
// memcpy nodes.
//
// Ordering. Every operation declares the buffers (or byte ranges) it reads and writes,
// and the encoder adds an edge for each hazard on overlapping bytes: read after write,
// write after read, write after write. Nothing else is ordered, so independent branches
// run concurrently. An edge that a single intermediate operation already implies (A->B->C
// makes A->C redundant) is left out. Memory an operation touches but does not declare is
// not ordered: declaring it is the caller's contract.
//
// Lifetimes. Every declared buffer, and anything passed to add_temporary or keep_alive,
// is held until the work of the commit that used it has completed on the GPU (an event
// per commit, polled at each commit, at synchronize(), and by the allocator when it runs
// short), so a buffer dropped by its owner never returns to the cache while in use.
//
// Executables. commit() looks the graph's topology up in a GraphCache (capacity
// FUSEBOX_CUDA_GRAPH_CACHE, default 64): a hit updates the cached exec with the new
// pointers and values, a refused update re-instantiates, a miss instantiates.
// FUSEBOX_CUDA_GRAPHS=0 launches everything directly on the stream instead (debugging),
// with the same API and lifetimes.
//
// Replay. A step that runs again and again on the same buffers need not be recorded again:
//
//   RecordedGraph step = enc.finish_recording();  // instantiated once, not launched
//   for (...) { enc.copy_to_device(input, host); enc.replay(step); enc.copy_to_host(...); }
//
// finish_recording() ends the recording and hands it over with everything it holds (every
// declared buffer, temporaries, kept objects), so the addresses baked into its nodes stay
// valid; replay() launches it after all work committed so far, recording nothing, and
// keeps what it holds until that launch completes, so dropping the RecordedGraph (or the
// caller's handles to its buffers) while a launch runs is safe. New values reach a replay
// through the contents of its buffers, never through its parameters.
//
// Child graphs. add_child_graph() places a graph built elsewhere (cuDNN's native
// cudnnBackendPopulateCudaGraph, say) in the recording as one operation, ordered by the
// buffers it declares like any other.
//
// Threads: one thread uses an encoder at a time (per the stream it owns); the completion
// bookkeeping is locked, since the allocator may reclaim from another thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/cuda/runtime/allocator.h"
#include "backends/cuda/runtime/device.h"
#include "backends/cuda/runtime/graph_cache.h"

namespace fusebox::cuda {

using BufferList = std::vector<BufferRange>;

// A finished recording, instantiated, with everything its nodes use (see "Replay" above).
// A shared handle: copies launch the same exec. Empty when default-made or when the
// recording had no operation (replaying it launches nothing).
class RecordedGraph {
 public:
  RecordedGraph() = default;

  explicit operator bool() const { return state_ != nullptr; }
  size_t ops() const;  // operations recorded (nodes of the graph)
  int device() const;  // -1 when empty
  // Turns operation `op`'s node off for later launches, or back on (kernel, memset and
  // memcpy nodes: cudaGraphNodeSetEnabled). E.g. the executor poisons a step's outputs in
  // its first launch only. Not while a launch of this graph is being issued elsewhere.
  void set_enabled(size_t op, bool enabled);
  // Points event-wait operation `op` (CommandEncoder::wait_for) at `fence` for later launches
  // (cudaGraphExecEventWaitNodeSetEvent). The caller keeps the fence until those launches
  // have completed, and the fence the node waits on until it is re-pointed: CUDA refuses to
  // re-point a node whose event was destroyed (invalid argument; bench/probes/
  // graph_wait_repoint.cu). Not while a launch is being issued elsewhere.
  void set_wait(size_t op, const class Fence& fence);

 private:
  friend class CommandEncoder;
  struct State;
  std::shared_ptr<State> state_;
};

// A point in an encoder's stream: done once the work launched before it has completed.
// A shared handle; empty (default) counts as done.
class Fence {
  friend class RecordedGraph;

 public:
  Fence() = default;
  bool done() const;  // without waiting
  void wait() const;  // blocks until done
  explicit operator bool() const { return state_ != nullptr; }
  // A fence after the work issued so far on `stream` (of `device`).
  static Fence record(cudaStream_t stream, int device);
  // Makes later work on `stream` wait for this fence.
  void wait_on(cudaStream_t stream) const;

 private:
  friend class CommandEncoder;
  struct State;
  std::shared_ptr<State> state_;
};

class CommandEncoder {
 public:
  struct Options {
    bool use_graphs = true;            // FUSEBOX_CUDA_GRAPHS (1, or 0 to launch directly)
    size_t graph_cache_capacity = 64;  // FUSEBOX_CUDA_GRAPH_CACHE
    size_t miss_warning_every = 100;   // see GraphCache
    // As the environment sets them (settings(), read once); a malformed value throws.
    static Options from_env();
  };
  struct Stats {
    uint64_t ops_recorded = 0;         // launches, library calls, memsets, memcpys
    uint64_t nodes_recorded = 0;       // graph nodes added (0 when launching directly)
    uint64_t edges_recorded = 0;       // hazard edges added
    uint64_t commits = 0;              // commits that had work to launch
    uint64_t direct_launches = 0;      // operations launched directly (FUSEBOX_CUDA_GRAPHS=0)
    uint64_t recordings_finished = 0;  // finish_recording() calls that returned a graph
    uint64_t replays = 0;              // replay() launches
    GraphCache::Stats graph_cache;     // instantiations, updates, refusals, hits, misses
  };
  static constexpr size_t kNoOp = SIZE_MAX;  // returned when nothing was recorded

  // Records onto `device`'s stream. `allocator` (default: the device's) is the one whose
  // shortages may reclaim this encoder's finished buffers; either may outlive the other.
  explicit CommandEncoder(Device& device, Options options = Options::from_env(),
                          CachingAllocator* allocator = nullptr);
  // The process-wide encoder of the device's stream, options from the environment.
  static CommandEncoder& for_device(int device);
  // Commits and waits for all work, then frees its CUDA objects. Never throws.
  ~CommandEncoder();
  CommandEncoder(const CommandEncoder&) = delete;
  CommandEncoder& operator=(const CommandEncoder&) = delete;

  // Records kernel<<<grid, block, shared_bytes>>>(args...). Each argument converts to the
  // kernel's parameter type, as in a call. Returns the operation's index in this recording.
  template <class... Params, class... Args>
  size_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                const BufferList& reads, const BufferList& writes, Args&&... args) {
    static_assert(sizeof...(Params) == sizeof...(Args),
                  "CommandEncoder::launch: argument count differs from the kernel's");
    std::tuple<std::remove_cvref_t<Params>...> values(std::forward<Args>(args)...);
    return std::apply(
        [&](auto&... value) {
          void* pointers[] = {static_cast<void*>(&value)..., nullptr};
          return launch_kernel(reinterpret_cast<const void*>(kernel), grid, block, shared_bytes,
                               pointers, reads, writes);
        },
        values);
  }
  // The same with the kernel and its argument pointers given raw (as cudaLaunchKernel).
  size_t launch_kernel(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, void** args,
                       const BufferList& reads, const BufferList& writes);
  // The same for a kernel given as a handle: a library's kernel, e.g. one generated and
  // compiled at run time (runtime/nvrtc.h). CUDA takes a cudaKernel_t, cast to a pointer,
  // wherever a kernel's address goes (cudaLaunchKernel, kernel nodes, cudaFuncSetAttribute),
  // so it is recorded, ordered and replayed like any other launch.
  size_t launch_handle(cudaKernel_t kernel, dim3 grid, dim3 block, size_t shared_bytes, void** args,
                       const BufferList& reads, const BufferList& writes) {
    return launch_kernel(reinterpret_cast<const void*>(kernel), grid, block, shared_bytes, args,
                         reads, writes);
  }

  // Records the stream-ordered work `record` issues on the stream it is given.
  size_t capture_library_call(const BufferList& reads, const BufferList& writes,
                              const std::function<void(cudaStream_t)>& record);

  // Records a copy of `child` (the caller keeps it) as one child-graph node, ordered by the
  // declared buffers like any other operation. Launching directly, instantiates and
  // launches it on the stream instead.
  size_t add_child_graph(const BufferList& reads, const BufferList& writes, cudaGraph_t child);

  // Sets every byte of `dst` to `value`. kNoOp for an empty range.
  size_t memset(const BufferRange& dst, uint8_t value);
  // Device-to-device copy; the ranges must have equal sizes. kNoOp for empty ranges.
  size_t memcpy(const BufferRange& dst, const BufferRange& src);

  // Temporaries: memory one operation writes and reads only while it runs (a library
  // call's workspace, a layout conversion, partial sums). A compiled executable recording
  // an operation lends it a region of its arena that no value occupies during that
  // operation (runtime/memory_plan.h): temporary() and scratch() take their bytes from the
  // region while it has room, so they cost no memory of their own; the hazard rules order
  // the region's reuse like any arena bytes. When the region is full (or empty), an
  // operation's temporaries come from the encoder's overflow buffer, from its start for each
  // operation (a new region starts a new operation), so that a step holds the largest
  // operation's worth instead of every operation's: the hazard rules order the operations
  // that share it, as for scratch(). Outside a region
  // (direct kernel calls), temporary() allocates from `allocator` and holds the buffer with
  // the recording.
  void set_temporary_region(const BufferRange& region);  // until clear_temporary_region()
  void clear_temporary_region();
  BufferRange temporary(CachingAllocator& allocator, size_t bytes);
  // A workspace for one operation of this recording: from the region when it fits, else
  // the recording's shared scratch buffer, replaced by a larger one from `allocator` when
  // too small. Declare it as written: the hazard rules then order the operations that share
  // it, so a step holds one workspace (the largest) instead of one per operation. Empty
  // for 0 bytes.
  BufferRange scratch(CachingAllocator& allocator, size_t bytes);

  // Holds `buffer` (or any object) until the work recorded so far has completed.
  void add_temporary(DeviceBuffer buffer);
  void keep_alive(std::shared_ptr<const void> object);

  // Launches the recorded work on the stream (does not wait), and releases what finished
  // commits held. A commit with nothing recorded launches nothing.
  void commit();
  // commit(), then waits for the stream and releases everything held.
  void synchronize();

  // Drops what was recorded since the last commit without launching it (e.g. a run that
  // failed half-way); launching directly, that work has run already: then commit().
  void discard_recording();

  // Ends the recording and returns it instantiated, not launched, with what it holds; the
  // encoder starts a fresh recording. An error when launching directly (the operations
  // have run already; there is nothing to replay).
  RecordedGraph finish_recording();
  // Commits, then launches `graph` (finished by an encoder of this device) on the stream,
  // holding what it holds until this launch completes. An empty graph launches nothing.
  void replay(const RecordedGraph& graph);

  // Blocking copies between host memory (any kind) and a buffer, ordered after all work
  // recorded so far (they commit first). For tests and the edges of a run.
  void copy_to_device(const BufferRange& dst, const void* host);
  void copy_to_host(void* host, const BufferRange& src);
  // The same, stream-ordered and returning at once, for page-locked (pinned) host memory:
  // the host bytes must stay unchanged (to the device), or unread (to the host), and the
  // device buffer alive (these copies hold nothing: an executable's buffers outlive its
  // runs), until a fence taken after the copy is done.
  void copy_to_device_async(const BufferRange& dst, const void* pinned_host);
  void copy_to_host_async(void* pinned_host, const BufferRange& src);
  // A device-to-device copy issued on the stream now (committing first), not recorded: for
  // the edges of a run, where recording a one-node graph would cost more than the copy.
  // Holds nothing, as the copies above.
  void copy_now(const BufferRange& dst, const BufferRange& src);
  // Commits, and marks the point in the stream after everything launched so far.
  Fence fence();
  // Commits; what is launched later waits for `fence` (work on another stream).
  void wait(const Fence& fence);
  // Records a wait for `fence` (work on another stream) that later accesses to `writes`
  // are ordered after, and only those: an event-wait node, which RecordedGraph::set_wait
  // re-points before a launch (the fence is held with the recording). Launching directly,
  // a wait on the stream now. kNoOp for an empty fence. `after`: an earlier operation this one
  // also follows (a chain of waits for copies that end in that order).
  size_t wait_for(const Fence& fence, const BufferList& writes, size_t after = kNoOp);

  // Introspection for tests: the graph being recorded (null before the first node and
  // when launching directly), an operation's node, and the edges as (from, to) operation
  // indices, sorted.
  size_t pending_ops() const { return pending_ops_; }
  cudaGraph_t recorded_graph() const { return graph_; }
  cudaGraphNode_t recorded_node(size_t op) const;
  std::vector<std::pair<size_t, size_t>> recorded_edges() const;

  Stats stats() const;
  const Options& options() const { return options_; }
  Device& device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

 private:
  // A declared access to bytes [begin, end) of one block, by operation `op`.
  struct Access {
    size_t begin;
    size_t end;
    uint32_t op;
    bool write;
  };
  // Per block touched by this recording: a handle that keeps it alive, and the accesses
  // that later ones may have to wait for.
  struct BlockState {
    DeviceBuffer buffer;
    std::vector<Access> accesses;
  };
  // A launched commit or replay: what it holds until its event completes.
  struct InFlight {
    cudaEvent_t done = nullptr;
    std::vector<DeviceBuffer> buffers;
    std::vector<std::shared_ptr<const void>> objects;
  };

  void check_buffers(const BufferList& list) const;
  // `bytes` of the lent region, when it has room left.
  std::optional<BufferRange> from_region(size_t bytes);
  // The hazard edges of a new operation into deps_ (operation indices, leaving out those
  // another hazard already orders); notes the blocks it touches in touched_.
  void find_dependencies(const BufferList& reads, const BufferList& writes);
  // Records operation `op`'s accesses in the blocks find_dependencies noted.
  void record_accesses(uint32_t op, const BufferList& reads, const BufferList& writes);
  // Adds the node `make_node(deps, count)` creates, with its hazard edges, and appends its
  // key part (append_key_part(key_)); returns its operation index. (runtime/encoder.cpp only.)
  template <class AppendKey, class MakeNode>
  size_t add_node(const BufferList& reads, const BufferList& writes, AppendKey&& append_key_part,
                  MakeNode&& make_node);
  size_t add_graph_node(const BufferList& reads, const BufferList& writes, cudaGraph_t child);
  size_t note_direct_op(const BufferList& reads, const BufferList& writes);
  void retain(const BufferList& list);
  void ensure_graph();
  void reset_recording();
  // What the recording holds (its buffers, temporaries and objects), moved out.
  InFlight take_held();
  // Keeps `held` until the work launched so far on the stream completes.
  void hold_until_done(InFlight held);
  cudaEvent_t take_event();
  // Releases what completed commits held; with wait, first waits for all of them.
  void release_completed(bool wait);
  void opt_in_shared_memory(const void* kernel, size_t shared_bytes);
  void issue_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what);

  Device& device_;
  Options options_;
  cudaStream_t stream_;
  cudaStream_t capture_stream_ = nullptr;
  CachingAllocator::Registration reclaimer_;  // lets the allocator take back finished buffers
  GraphCache cache_;

  // The recording.
  cudaGraph_t graph_ = nullptr;
  std::vector<cudaGraphNode_t> nodes_;  // by operation index
  // Direct dependencies of operation i: dep_pool_[dep_begin_[i] .. dep_begin_[i + 1]), sorted.
  std::vector<uint32_t> dep_pool_;
  std::vector<uint32_t> dep_begin_{0};
  std::string key_;                                     // topology key so far
  std::unordered_map<const void*, BlockState> blocks_;  // by block address
  // Scratch of find_dependencies, kept to save allocations per operation.
  std::vector<uint32_t> hazards_, deps_;
  size_t extra_dep_ = kNoOp;  // an op the next node follows besides its hazards (wait_for)
  std::vector<BlockState*> touched_;
  std::vector<cudaGraphNode_t> dep_nodes_;
  std::vector<std::shared_ptr<const void>> objects_;
  std::vector<DeviceBuffer> temporaries_;
  DeviceBuffer scratch_;  // see scratch()
  // The lent region (see set_temporary_region) and how much of it is taken.
  std::optional<BufferRange> region_;
  size_t region_used_ = 0;
  // The overflow buffer of the operations given a region (see temporary()) and how much of
  // it the current operation took.
  DeviceBuffer overflow_;
  size_t overflow_used_ = 0;
  size_t pending_ops_ = 0;
  std::unordered_map<const void*, size_t> shared_opt_in_;  // kernel -> bytes granted

  // Completion bookkeeping (locked: the allocator's reclaimer may run on another thread).
  mutable std::mutex in_flight_mutex_;
  std::deque<InFlight> in_flight_;
  std::vector<cudaEvent_t> spare_events_;
  Stats stats_;
};

}  // namespace fusebox::cuda
