// The CUDA executable: a graph compiled once into one recorded CUDA graph, replayed by
// every run (fusebox/runtime/executable.h). Its jobs, one file each:
//
// compile.cpp  1. plans the layouts (passes/layout.h) and the memory (executable/memory_plan.h);
//              2. gives every input a buffer: the bound array; an aliased (resident) input's
//                 own, in the order the step computes it; else a contiguous one that feeds
//                 are copied into; an input the step reads in another order is converted by
//                 the step's first operations into a buffer of its own;
//              3. uploads the constants, converted once to their planned order (committed
//                 before the recording: replays do not repeat it);
//              4. records the step (record.cpp) and finishes the recording.
// record.cpp   The node walk: every node on the device's command encoder with its outputs in
//              the arena (or in the executable's output buffers, or in place: an aliased
//              output), then the copies of aliased outputs that could not be computed in
//              place. The recording resolves the convolution plans (memory and disk caches,
//              autotuning). Each node's temporaries (library workspaces, layout conversions,
//              partial sums) take arena bytes that no value holds while it runs
//              (memory_plan.h free_gaps); what does not fit there is allocated and held for
//              the executable's life.
// run.cpp      Feeds are copied into the input buffers (from the host through double-buffered
//              pinned staging, stream-ordered; from device arrays by a device copy), the
//              recording is replayed, the requested outputs and the kernels' error records are
//              copied back into pinned memory, and a fence marks the run's end; nothing waits
//              unless asked to.
// profile.cpp  Executable::profile: the walk again, each node recorded into a graph of its own
//              and timed.
//
// FUSEBOX_CUDA_GRAPHS=0 (launching directly, for debugging): every run records (runs) the
// node walk again on the same buffers; errors are checked at the end of each run.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/conv/report.h"
#include "executable/device_array.h"
#include "executable/io_plan.h"
#include "executable/layout_views.h"
#include "executable/memory_plan.h"
#include "fusebox/passes/layout.h"
#include "fusebox/runtime/executable.h"

namespace fusebox::runtime {

using cuda::DeviceTensor;

inline bool in_format(const DeviceTensor& t, MemoryFormat f) {
  return f == MemoryFormat::contiguous ? t.is_contiguous() : t.is_channels_last();
}

inline std::string bytes_str(size_t bytes) {
  return cat(bytes, " bytes (", (bytes + (1 << 20) - 1) >> 20, " MiB)");
}

// FUSEBOX_TIME_RUNS: timing events recorded on the device stream before and after a replay.
struct RunTiming {
  cudaEvent_t start = nullptr, end = nullptr;
  RunTiming();
  ~RunTiming();
  RunTiming(const RunTiming&) = delete;
  RunTiming& operator=(const RunTiming&) = delete;
};

class CudaExecutable final : public Executable {
 public:
  CudaExecutable(const Graph& g, const CompileOptions& options);  // compile.cpp
  ~CudaExecutable() override;                                     // run.cpp

  StepResult run_async(const Feeds& feeds, const std::set<std::string>& to_host,
                       const std::string& label) override;  // run.cpp
  void check_errors() override;                             // run.cpp
  std::vector<NodeTime> profile(int repeats) override;      // profile.cpp

  DeviceArray input(const std::string& name) const override {
    auto it = io_.input_index.find(name);
    FUSEBOX_CHECK(it != io_.input_index.end(), where_, "'", name, "' is not an input");
    return inputs_[it->second].array;
  }
  const Graph& graph() const override { return graph_; }
  const ExecutableStats& stats() const override {
    if (halt_) stats_.runs_not_applied = size_t(halt_->not_applied);
    return stats_;
  }
  const ExecutableReport& report() const override { return report_.report(); }
  Device device() const override { return Device::cuda; }

 private:
  struct Input {
    ValueId value = kNoValue;
    DeviceArray array;          // what feeds are copied into (and input() returns)
    bool convert = false;       // the step reads a converted copy (value_tensor)
    DeviceTensor value_tensor;  // what the step reads
    bool has_contents = false;
    // Staging (recorded steps, inputs fed from the host): a batch is copied on the copy
    // stream into `stage` while the device still runs the step before; just before the
    // step's launch a device copy on the step's stream moves it into `array`, and
    // `stage_free` marks that copy's end, which is all the next batch's copy waits for. One
    // staging buffer: the next batch's copy overlaps the step as well as with two (it waits
    // for the device copy, tens of microseconds, not for the step), and a second costs an
    // input's worth of device memory (74 MiB for Swin-T at batch 128).
    cuda::DeviceBuffer stage;
    cuda::Fence stage_free;  // after the last device copy out of `stage`
    bool staged = false;     // fed from the host through `stage` (large inputs, recorded steps)
  };

  // The values a walk over the nodes reads and writes.
  struct Walk {
    std::vector<DeviceTensor> slots;          // by ValueId: what readers of the value read
    std::vector<DeviceTensor> output_tensor;  // by ValueId: an output's returned buffer
  };

  // compile.cpp
  void plan_memory_and_buffers();
  using IoAllocate =
      std::function<DeviceTensor(const TensorType&, MemoryFormat, const std::string& what)>;
  void assign_io_buffers(const IoAllocate& allocate, const std::vector<bool>& converted_in_arena);
  void note_small_holders();
  void plan_layout_views_into(std::vector<size_t>& bytes,
                              const std::vector<bool>& converted_in_arena);
  bool can_compute_in_place(ValueId out, size_t input) const;
  void plan_outputs_through_reshapes(std::vector<size_t>& bytes,
                                     const std::vector<bool>& converted_in_arena);
  void plan_elementwise_in_place(const std::vector<size_t>& bytes,
                                 const std::vector<bool>& converted_in_arena);
  void upload_constants();

  // record.cpp
  DeviceTensor arena_tensor(ValueId v) const;
  DeviceTensor root_view(const Walk& w, ValueId v) const;
  void record_step();
  Walk begin_walk(bool step);
  std::vector<DeviceTensor> node_outputs(const Walk& w, const Node& n);
  void record_node(size_t i, const Walk& w, std::vector<DeviceTensor>& outs);
  std::vector<DeviceTensor> poisoned_outputs(const Walk& w, size_t i);
  size_t record_updates(size_t i, Walk& w);
  void record_nodes();
  void end_walk(const Walk& w);

  // run.cpp
  void feed_inputs(const Feeds& feeds);
  const cuda::DeviceBuffer& stage_buffer(Input& in);
  void copy_staged_inputs();
  void retire_oldest_run();

  Graph graph_;
  CompileOptions options_;
  std::string where_;
  cuda::Context ctx_;
  bool direct_ = false;
  IoPlan io_;
  Liveness life_;
  LayoutPlan layout_;
  std::vector<size_t> offsets_;
  std::vector<Gap> gaps_;            // by node: arena bytes free for its temporaries
  std::shared_ptr<HaltState> halt_;  // with state aliased in place: its halt word
  cuda::DeviceBuffer arena_;
  std::vector<DeviceTensor> constants_;  // by ValueId
  std::vector<Input> inputs_;
  std::vector<DeviceArray> outputs_;
  std::vector<int> in_place_;  // by ValueId: the input an output is computed in
  // By ValueId: the root whose bytes a layout view reads, or the dying input an elementwise
  // output is computed in (plan_elementwise_in_place; computed_in_input_ says which).
  std::vector<ValueId> same_bytes_;
  std::vector<bool> computed_in_input_;
  // By ValueId: the output (index) whose buffer the value is computed in, the reshape of it
  // that makes that output recording nothing (plan_outputs_through_reshapes); -1: none.
  std::vector<int> computed_in_output_;
  std::vector<bool> reshape_into_output_;  // by node: such a reshape
  // By ValueId: layout ops' outputs read through (views, unstored values; layout_views.h).
  std::vector<LayoutView> layout_views_;
  // By output: where an aliased output that cannot be computed in place is computed, to be
  // copied into its input at the end (empty for every other output).
  std::vector<DeviceTensor> alias_buffer_;
  cuda::RecordedGraph step_;
  std::shared_ptr<const cuda::ErrorFlags::Reserved> errors_;
  std::vector<cuda::PinnedPool> input_staging_, output_staging_;
  std::vector<DeviceTensor> readback_;  // by output: contiguous copies of non-contiguous ones
  cuda::PinnedPool error_staging_;
  std::vector<std::shared_ptr<cuda::PinnedSlot>> fed_slots_;
  std::vector<Input*> staged_now_;  // inputs whose batch is in `stage`, to be copied in
  std::unique_ptr<cuda::CopyStream> copy_stream_;
  // Host outputs of kOverlappedOutputBytes or more are copied out on a stream of their own,
  // so that the next run's nodes overlap the copy (GPT-2's 3.3 GB of f32 logits take ~66 ms
  // over PCIe; its step computes in ~15): the nodes that write an output wait for the last
  // copy of its bytes out, and only those nodes. A large output is copied in pieces, each
  // with its own wait in the step, so that a node writing the first rows waits for those
  // rows' copy, not the whole output's (GPT-2's LM head writes the logits in 13 blocks of
  // rows: waiting for all of them, each run would wait out the whole copy and then compute
  // the blocks). Recorded steps only (launching directly, a run waits at its start).
  struct ReadbackPiece {
    int output = -1;              // a piece of this output; -1: all the small ones whole
    size_t begin = 0, bytes = 0;  // a piece's bytes in its output
    cuda::BufferList ranges;      // what the step's writers wait on
    size_t op = cuda::CommandEncoder::kNoOp;  // the step's wait (CommandEncoder::wait_for)
    cuda::Fence read;                         // after the last copy of these bytes out
    bool stale = false;  // `read` changed since the step's wait was pointed at it
    // What the step's wait waits on now, held until it is re-pointed: a graph exec's wait
    // node whose event was destroyed cannot be re-pointed.
    cuda::Fence pointed;
  };
  void plan_readback_pieces();  // record.cpp, by begin_walk
  std::unique_ptr<cuda::CopyStream> readback_stream_;
  std::vector<ReadbackPiece> readback_pieces_;  // the small outputs' first
  cuda::Fence outputs_read_;                    // after the last copies out (of every output)
  static constexpr size_t kOverlappedOutputBytes = size_t(8) << 20;
  static constexpr size_t kReadbackPieceBytes = size_t(64) << 20;  // at least, and
  static constexpr size_t kMaxReadbackPieces = 16;                 // at most, per output
  // A run queued on the device: its error check (and fence), and the feeds it copies
  // straight from the caller's memory, held until it has completed.
  struct RunInFlight {
    std::shared_ptr<RunCheck> run;
    std::vector<cuda::Fence> waited;  // the copies its readback waits waited for (held)
    std::vector<Tensor> pinned_feeds;
    std::vector<DeviceArray> array_feeds;
    std::shared_ptr<RunTiming> timing;  // FUSEBOX_TIME_RUNS: the replay's events
  };
  RunInFlight next_run_;  // filled while a run is issued
  std::deque<RunInFlight> in_flight_;
  static constexpr size_t kMaxRunsInFlight = 3;
  // Feeds up to this size (a learning rate, labels) go straight from pinned staging into
  // the input on the device stream: the copy stream's events cost more than they hide.
  static constexpr size_t kSmallFeedBytes = 64 << 10;
  // FUSEBOX_TIME_RUNS=1: events around each replay (stats' timed_runs); the end event of the
  // last run retired, which the next one's idle time is measured from.
  bool time_runs_ = false;
  std::shared_ptr<RunTiming> last_timed_;
  mutable ExecutableStats stats_;  // runs_not_applied refreshed by stats()
  // What the nodes' recordings took of their own (record_node): nodes of 1 MiB or more (the
  // largest five are stats_.temporary_holders) and the rest, summed.
  size_t large_holder_bytes_ = 0;
  size_t small_holder_bytes_ = 0;
  size_t small_holders_ = 0;
  cuda::ConvReportSink report_;  // filled by every recording (a ConvReportScope)
};

}  // namespace fusebox::runtime
