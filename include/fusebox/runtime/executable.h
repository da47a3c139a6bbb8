// A compiled graph: all the expensive work done once, then run many times.
//
//   auto exe = Executable::compile(model, {.device = Device::cuda});
//   NamedTensors out = exe->run({{"input", images}});            // host in, host out
//
//   // Training state kept on the device and updated in place: bind each state input to a
//   // device array and alias the output holding its next value to it.
//   DeviceArray w = DeviceArray::upload(w0, Device::cuda);
//   auto step = Executable::compile(step_graph, {.device = Device::cuda,
//                                                .bound = {{"w", w}},
//                                                .aliases = {{"__next__/w", "w"}}});
//   StepResult r = step->run_async({{"x", batch}}, {"__loss__"});  // returns at once
//   float loss = r.host.at("__loss__").get().get(0);                // waits for that step
//
// compile() (modelled on XLA's GpuExecutable and cudnn-frontend's build-once graphs) runs the
// graph passes the options name (CompileOptions::pipeline), plans the layouts (passes/layout.h),
// plans memory (intermediates share one arena by liveness, see runtime/memory_plan.h), uploads the
// constants, resolves the convolution plans and, on CUDA, records the whole step as one CUDA graph.
// A run copies the feeds in, replays the graph and hands the outputs back: it records nothing and
// compares nothing.
//
// Feeds from the host: a large one (over 64 KiB) is copied to the GPU on a copy stream while
// the previous run still computes, straight from a pinned tensor (pinned_host_tensor), from
// any other host tensor through pinned staging (double-buffered) the host copies it into;
// small ones (a learning rate, labels) go through pinned staging on the device's stream. Inputs
// bound or aliased (resident) keep what their array holds: fill it (input(name).copy_from) before
// the first run.
//
// Buffers. Every input and output has a buffer of its own for the executable's life (or,
// for a bound input, the caller's array), so their addresses are baked into the recorded
// graph. A run copies each feed into its input's buffer; an input that is bound, or not
// fed, keeps what its buffer holds (the last feed, or what an aliased output wrote).
// Outputs handed back as device arrays are the executable's own buffers: the next run
// overwrites them (clone() to keep one).
//
// Aliases. (output, input): at the end of each run the output's values are in the input's
// buffer. Where the op producing the output may write in place (an optimizer update, a
// batch norm's running statistics) and no op reads the input after it, the output is
// computed straight into the input's buffer; otherwise it is copied there as the step's
// last operation. The aliased output is not also returned separately: its device array is
// the input's.
//
// Errors found by kernels at run time (a label outside [0, C)) are reported by the run
// that made them, as an Error naming the node: run() checks at its end; after run_async(),
// when a host output of that run is read (PendingTensor::get), at check_errors(), or at the
// first run_async() after the run has completed, whichever comes first. On CUDA, with
// state aliased in place (a training step), a bad label also stops every in-place state
// update of that run and of the runs queued after it (a halt word the update kernels read),
// until the error has been reported: the state stays the last good one, and the error and
// stats().runs_not_applied say which runs were not applied. (On the CPU a run that fails
// changes no state.)
//
// Threads: one thread at a time uses an executable (runs share the device's stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "fusebox/core/communicator.h"
#include "fusebox/ir/graph.h"
#include "fusebox/passes/pipeline.h"
#include "fusebox/runtime/executor.h"
#include "fusebox/runtime/report.h"

namespace fusebox {

// An array a backend owns: host memory on the CPU backend, device memory on CUDA (dense, in
// the logical order of its shape). A shared handle: copies refer to the same storage.
class DeviceArray {
 public:
  struct Storage;  // the backend's (runtime/device_array.h)

  DeviceArray() = default;
  explicit DeviceArray(std::shared_ptr<Storage> storage) : storage_(std::move(storage)) {}
  // Uninitialised storage on `device`.
  static DeviceArray empty(DType dtype, const Shape& shape, Device device);
  // A copy of `t` on `device` (blocking).
  static DeviceArray upload(const Tensor& t, Device device);

  bool defined() const { return storage_ != nullptr; }
  Device device() const;
  DType dtype() const;
  const Shape& shape() const;
  size_t nbytes() const;
  // A host copy, after all work queued on the device so far (blocking).
  Tensor to_host() const;
  // Overwrites the contents with `t` (same dtype and shape, else an Error naming both),
  // after all work queued so far (blocking).
  void copy_from(const Tensor& t) const;
  // A new array with the same contents.
  DeviceArray clone() const;
  bool same_storage(const DeviceArray& other) const { return storage_ == other.storage_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

 private:
  std::shared_ptr<Storage> storage_;
};

// A host copy of an output, on its way: ready once the run that made it has completed.
class PendingTensor {
 public:
  struct State;
  PendingTensor() = default;
  explicit PendingTensor(std::shared_ptr<State> state) : state_(std::move(state)) {}
  bool defined() const { return state_ != nullptr; }
  // Whether get() would return without waiting.
  bool ready() const;
  // Waits for the run, checks its kernels' error records (throwing the Error of a node
  // that found bad data), and returns the tensor. From 1 MiB up the tensor is the pinned
  // buffer the device copied into (no second copy; the buffer is not reused while held),
  // smaller ones a pageable copy.
  Tensor get() const;

 private:
  std::shared_ptr<State> state_;
};

struct CompileOptions {
  Device device = Device::cpu;
  // On the CPU: the reference kernels (the default) or the fast ones where they take a node
  // (fusebox/runtime/executor.h CpuKernels; ExecutableStats::fast_nodes counts them).
  CpuKernels cpu_kernels = CpuKernels::reference;
  // The graph passes run first (passes/pipeline.h): none (the graph as given, the default) or
  // the inference pipeline (folded, in pipeline.precision, fused), whose graph the executable
  // then runs (graph()). Input and output names are kept.
  PipelineOptions pipeline;
  // Fill every node's outputs with NaN bytes before the node runs, in every run (tests: an
  // element a kernel leaves unwritten, or a buffer reused while still read, shows as NaN).
  bool poison = false;
  // Intermediates share one arena by liveness; false gives each its own buffer (tests
  // compare the two plans).
  bool reuse_memory = true;
  // Inputs bound to the caller's arrays (on options.device): runs read and, aliased,
  // write them in place; they are never fed.
  std::map<std::string, DeviceArray> bound;
  // (output name, input name) pairs: see "Aliases" above.
  std::vector<std::pair<std::string, std::string>> aliases;
  // The data-parallel world the graph's all_reduce nodes sum over (null: a world of one).
  // CPU: any Communicator (mpi_world()); CUDA: an NCCL one (nccl_communicator()) of the
  // device this process uses.
  std::shared_ptr<dist::Communicator> communicator;
};

// What compile() did and what the executable holds.
struct ExecutableStats {
  double compile_seconds = 0;
  size_t nodes = 0;
  size_t operations = 0;      // operations recorded (CUDA graph nodes)
  size_t arena_bytes = 0;     // intermediates, sharing by liveness
  size_t unshared_bytes = 0;  // the same intermediates each in a buffer of its own
  // CUDA: the most intermediate bytes live at one node (the arena's lower bound: the arena
  // above it is what the packing of the values into one buffer leaves unused).
  size_t peak_live_bytes = 0;
  // Both: the node where the most intermediate bytes are live ("" after the last node), and
  // the largest of the values live there (at most 8, by name, the largest first): what a
  // smaller peak has to do without.
  std::string peak_node;
  std::vector<std::pair<std::string, size_t>> peak_values;
  size_t largest_value_bytes = 0;  // the largest intermediate
  std::string largest_value;       // its name
  size_t io_bytes = 0;             // inputs (unbound) and outputs the executable owns
  size_t constant_bytes = 0;       // constants as uploaded (in their planned layouts)
  size_t temporary_bytes = 0;      // kernel workspaces and conversions the step holds
  // CUDA: the nodes whose recording took device memory of its own (outside the arena and the
  // inputs and outputs: a workspace larger than the node's gap in the arena, a conversion),
  // the most first (at most 5, each at least 1 MiB), then the smaller nodes together and what
  // no node accounts for (each entry at least 1 MiB): what temporary_bytes holds.
  std::vector<std::pair<std::string, size_t>> temporary_holders;
  size_t views = 0;  // layout ops that copy nothing (CUDA: read through)
  // CUDA: the layout ops (reshapes, transposes, slices) that run no kernel: their outputs are
  // views of a stored value, or not stored at all (executable/layout_views.h).
  std::vector<std::string> read_through;
  size_t fast_nodes = 0;        // CPU, fast kernels: nodes on them (the rest: reference)
  std::string fast_summary;     // ... which ops ran fast and which did not, and why
  size_t aliases_in_place = 0;  // aliased outputs computed in their input's buffer
  size_t aliases_copied = 0;    // ... copied there at the end of the step
  // CUDA, state aliased in place: runs whose state updates were not applied because a run
  // found bad training data (a label outside [0, C)): that run and the runs queued after
  // it, counted once the error has been reported (see run_async).
  size_t runs_not_applied = 0;
  // CUDA, FUSEBOX_TIME_RUNS=1 (CUDA graphs): each replay timed by events on the device stream,
  // summed over the runs retired so far: the device's time from a run's start to its end, and
  // its idle time between a run's end and the next one's start (runs issued back to back show
  // whether the device waited for the host between them).
  size_t timed_runs = 0;
  double run_device_ms = 0;
  double run_idle_ms = 0;
};

// One node's time in Executable::profile().
struct NodeTime {
  std::string node;  // the node's name
  OpKind op;
  double ms = 0;  // per execution: CUDA the mean of `repeats`, the CPU their median
};

using Feed = std::variant<Tensor, DeviceArray>;
using Feeds = std::map<std::string, Feed>;

struct StepResult {
  std::map<std::string, DeviceArray> outputs;  // every output (aliased: the input's array)
  std::map<std::string, PendingTensor> host;   // the outputs asked for on the host
};

// A host tensor in page-locked (pinned) memory when a GPU is present (else ordinary memory):
// a feed the executable copies to the GPU asynchronously, straight from it. Fill it, run,
// and do not write it again until that run's results have been read.
Tensor pinned_host_tensor(DType dtype, const Shape& shape);

// The device memory fusebox holds (CUDA: its caching allocator; the CPU: not tracked, 0).
struct DeviceMemoryStats {
  size_t in_use = 0;  // bytes behind live buffers
  size_t peak = 0;    // high-water mark of in_use since the last reset
  size_t cached = 0;  // freed bytes kept for reuse
};
DeviceMemoryStats device_memory_stats(Device device);
void reset_peak_device_memory(Device device);

class Executable {
 public:
  // Compiles `graph` for options.device. Errors name the graph and what is at fault (an
  // unknown bound or aliased name, mismatched types, out of memory with the sizes).
  static std::unique_ptr<Executable> compile(const Graph& graph,
                                             const CompileOptions& options = {});
  // The same from a graph the caller gives up: its constants are released once the pipeline
  // has made its graph, so the source's weights and the backend's prepared copies of the
  // pipeline's are not held at once.
  static std::unique_ptr<Executable> compile(Graph&& graph, const CompileOptions& options = {});
  virtual ~Executable() = default;

  // Feeds (host tensors or device arrays) every unbound input that `feeds` names; checks
  // dtypes and shapes (an Error names the input and both types) and that every input
  // without contents yet is fed. Returns at once: every output as a device array, and the
  // outputs named in `to_host` copied back asynchronously.
  // `label` prefixes the message of a kernel error this run finds ("step 12").
  virtual StepResult run_async(const Feeds& feeds, const std::set<std::string>& to_host = {},
                               const std::string& label = {}) = 0;
  // Host in, host out: every output, after the run has completed and its errors checked.
  NamedTensors run(const NamedTensors& feeds);
  // Waits for every run so far and throws the first kernel error none has reported yet.
  virtual void check_errors() = 0;
  // The array holding an input's current contents: the bound array, else the executable's
  // own (kept in the order the step reads it; to_host and copy_from convert). Writing it
  // with copy_from feeds the input for the following runs.
  virtual DeviceArray input(const std::string& name) const = 0;

  // Runs the step once more on the inputs as they are (the last feeds), node by node in
  // the step's order, timing each node `repeats` times: on CUDA its operations recorded
  // `repeats` times into a graph of their own, launched once untimed (the real execution,
  // which the next node reads) and once timed. For `fusebox run|bench --report`: where the
  // time goes, not the step's own time (independent nodes do not overlap here). Refused for
  // an executable with aliases (state updated in place: repeating would change it). Waits
  // for earlier runs first; overwrites the outputs as a run does; a kernel error is thrown
  // as a run's would be.
  virtual std::vector<NodeTime> profile(int repeats = 10) = 0;

  virtual const Graph& graph() const = 0;
  virtual const ExecutableStats& stats() const = 0;
  // What its recordings decided on the GPU: each convolution's path and plan, the plan
  // caches' counters (fusebox/runtime/report.h). Grows with later recordings (profile(); every
  // run when launching directly); empty on the CPU.
  virtual const ExecutableReport& report() const = 0;
  virtual Device device() const = 0;
};

}  // namespace fusebox
