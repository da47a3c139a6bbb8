// The CUDA executable: a graph compiled once into one recorded CUDA graph, replayed by
// every run (fusebox/runtime/executable.h).
//
// Compile:
//   1. plan the layouts (passes/layout.h) and the memory (executable/memory_plan.h);
//   2. give every input a buffer: the bound array; an aliased (resident) input's own, in
//      the order the step computes it; else a contiguous one that feeds are copied into;
//      an input the step reads in another order is converted by the step's first
//      operations into a buffer of its own;
//   3. upload the constants, converted once to their planned order (committed before the
//      recording: replays do not repeat it);
//   4. record every node on the device's command encoder with its outputs in the arena (or
//      in the executable's output buffers, or in place: an aliased output), then the copies
//      of aliased outputs that could not be computed in place; finish the recording.
// The recording resolves the convolution plans (memory and disk caches, autotuning). Each
// node's temporaries (library workspaces, layout conversions, partial sums) take arena
// bytes that no value holds while it runs (memory_plan.h free_gaps); what does not fit
// there is allocated and held for the executable's life.
//
// Run: feeds are copied into the input buffers (from the host through double-buffered
// pinned staging, stream-ordered; from device arrays by a device copy), the recording is
// replayed, the requested outputs and the kernels' error records are copied back into
// pinned memory, and a fence marks the run's end; nothing waits unless asked to.
//
// FUSEBOX_CUDA_GRAPHS=0 (launching directly, for debugging): every run records (runs) the
// node walk again on the same buffers; errors are checked at the end of each run.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>

#include "backends/cuda/kernels.h"
#include "backends/cuda/runtime/nccl.h"
#include "fusebox/ir/op_groups.h"
#include "fusebox/passes/layout.h"
#include "executable/device_array.h"
#include "executable/executables.h"
#include "executable/io_plan.h"
#include "executable/memory_plan.h"

namespace fusebox::runtime {

namespace {

using cuda::DeviceTensor;

bool in_format(const DeviceTensor& t, MemoryFormat f) {
  return f == MemoryFormat::contiguous ? t.is_contiguous() : t.is_channels_last();
}

// Which input of a node an output may be computed in place of: the optimizer updates
// (each output is its state input's next value, elementwise), batch_norm's running
// statistics (per channel, read and written by the same thread) and the loss scaler's
// state (one thread reads it all, then writes). -1: none.
int in_place_input(const Node& n, size_t output) {
  switch (n.op) {
    case OpKind::sgd_update:  // (param, grad, buf, lr) -> (param', buf')
      return output == 0 ? 0 : output == 1 ? 2 : -1;
    case OpKind::adamw_update:  // (param, grad, m, v, lr, step) -> (param', m', v')
      return output == 0 ? 0 : output == 1 ? 2 : output == 2 ? 3 : -1;
    case OpKind::batch_norm:  // training: (y, running mean', running var', saved...)
      return output == 1 ? 3 : output == 2 ? 4 : -1;
    case OpKind::loss_scale_update:  // (scale, tracker, found_inf, skipped?) -> (scale', ...)
      return output == 0 ? 0 : output == 1 ? 1 : output == 2 ? 3 : -1;
    default:
      return -1;
  }
}

std::string bytes_str(size_t bytes) {
  return cat(bytes, " bytes (", (bytes + (1 << 20) - 1) >> 20, " MiB)");
}

class CudaExecutable final : public Executable {
 public:
  CudaExecutable(const Graph& g, const CompileOptions& options)
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
    plan_memory_and_buffers();
    upload_constants();
    if (!direct_) {
      FUSEBOX_CHECK(cuda::ErrorFlags::of(ctx_.encoder).pending() == 0, where_,
                    "kernel error records of an earlier run were left unchecked");
      ctx_.encoder.commit();  // the recording starts empty
      try {
        record_step();
      } catch (...) {
        ctx_.encoder.discard_recording();
        cuda::ErrorFlags::of(ctx_.encoder).take();
        throw;
      }
      step_ = ctx_.encoder.finish_recording();
      for (Input& in : inputs_)
        if (in.stage_op != cuda::CommandEncoder::kNoOp) set_stage_enabled(in, false);
      errors_ = std::make_shared<const cuda::ErrorFlags::Reserved>(
          cuda::ErrorFlags::of(ctx_.encoder).take());
      stats_.operations = step_ ? step_.ops() : 0;
    }
    const size_t in_use = ctx_.allocator.stats().bytes_in_use - in_use_before;
    const size_t known = stats_.arena_bytes + stats_.io_bytes + stats_.constant_bytes;
    stats_.temporary_bytes = in_use > known ? in_use - known : 0;
    stats_.nodes = graph_.nodes().size();
    stats_.compile_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // Runs issue copies that hold nothing (the executable's buffers outlive them): wait for
  // them before the buffers go.
  ~CudaExecutable() override {
    try {
      ctx_.encoder.synchronize();
    } catch (...) {  // a destructor must not throw; the device's error shows at its next use
    }
  }

  StepResult run_async(const Feeds& feeds, const std::set<std::string>& to_host,
                       const std::string& label) override {
    check_request(io_, feeds, to_host, where_);
    // Runs that have completed are checked (an error surfaces at the next run), and the host
    // queues at most a few runs ahead of the device, which bounds the pinned slots and
    // error records in flight (and the launch queue).
    while (!in_flight_.empty() &&
           (in_flight_.size() >= kMaxRunsInFlight || in_flight_.front().run->fence.done()))
      retire_oldest_run();
    feed_inputs(feeds);
    const int64_t index = halt_ ? halt_->issued++ : 0;
    if (direct_) {
      record_step();
      ctx_.encoder.commit();
      try {
        cuda::check_error_flags(ctx_);
      } catch (const Error& e) {
        const std::string halted = halt_ ? release_halt(*halt_, index) : "";
        throw Error(e.where(), (label.empty() ? "" : label + ": ") + error_message(e) + halted);
      }
    } else {
      ctx_.encoder.replay(step_);
    }

    auto run = std::make_shared<RunCheck>();
    run->label = label;
    run->halt = halt_;
    run->index = index;
    if (errors_ && !errors_->pending.empty()) {
      run->reserved = errors_;
      run->records = error_staging_.acquire(errors_->bytes());
      size_t at = 0;
      for (const cuda::DeviceBuffer& chunk : errors_->chunks) {
        const size_t n = std::min(cuda::ErrorFlags::kRecordsPerChunk, errors_->pending.size() - at);
        ctx_.encoder.copy_to_host_async(run->records->bytes.get() + at * sizeof(cuda::ErrorRecord),
                                        cuda::BufferRange(chunk, 0, n * sizeof(cuda::ErrorRecord)));
        at += n;
      }
    }
    StepResult result;
    std::vector<std::shared_ptr<cuda::PinnedSlot>> slots;
    for (size_t i = 0; i < io_.output_names.size(); ++i) {
      const std::string& name = io_.output_names[i];
      result.outputs[name] = outputs_[i];
      if (!to_host.count(name)) continue;
      auto state = std::make_shared<PendingTensor::State>();
      const DeviceTensor& t = outputs_[i].storage()->tensor;
      state->dtype = t.dtype;
      state->shape = t.shape;
      state->slot = output_staging_[i].acquire(t.nbytes());
      DeviceTensor src = t;
      if (!t.is_contiguous()) {  // read back through a contiguous copy of its own
        if (!readback_[i].buffer)
          readback_[i] = DeviceTensor::empty(ctx_.allocator, t.dtype, t.shape);
        src = readback_[i];
        cuda::copy_strided(ctx_, t, src);
      }
      ctx_.encoder.copy_to_host_async(state->slot->bytes.get(), src.range());
      state->run = run;
      slots.push_back(state->slot);
      result.host[name] = PendingTensor(std::move(state));
    }
    run->fence = ctx_.encoder.fence();
    for (auto& slot : slots) slot->last_use = run->fence;
    if (run->records) run->records->last_use = run->fence;
    for (auto& slot : fed_slots_) slot->last_use = run->fence;
    fed_slots_.clear();
    for (auto& [in, k] : staged_now_) in->stage_free[k] = run->fence;
    staged_now_.clear();
    next_run_.run = run;
    in_flight_.push_back(std::move(next_run_));
    next_run_ = {};
    return result;
  }

  void check_errors() override {
    ctx_.encoder.synchronize();
    while (!in_flight_.empty()) retire_oldest_run();
  }

  std::vector<NodeTime> profile(int repeats) override {
    FUSEBOX_CHECK(repeats >= 1, where_, "profile: repeats must be at least 1, got ", repeats);
    FUSEBOX_CHECK(options_.aliases.empty(), where_,
                  "profile: not for a step with aliased state (repeating would change it)");
    FUSEBOX_CHECK(!direct_, where_,
                  "profile: needs CUDA graphs (FUSEBOX_CUDA_GRAPHS=0 launches directly)");
    check_errors();
    for (size_t i = 0; i < inputs_.size(); ++i)
      FUSEBOX_CHECK(inputs_[i].has_contents, where_, "profile: input '", io_.input_names[i],
                    "' has not been fed (the profile runs on the last feeds)");
    cudaEvent_t events[2] = {nullptr, nullptr};
    std::vector<NodeTime> times;
    try {
      for (cudaEvent_t& e : events) FUSEBOX_CUDA_CHECK(cudaEventCreate(&e));
      Walk w = begin_walk(false);
      ctx_.encoder.commit();
      for (size_t i = 0; i < graph_.nodes().size(); ++i) {
        const Node& n = graph_.nodes()[i];
        const std::vector<DeviceTensor> outs = node_outputs(w, n);
        std::vector<DeviceTensor> written;
        for (int r = 0; r < repeats; ++r) {
          written = outs;
          record_node(i, w, written);
        }
        const cuda::RecordedGraph node_graph = ctx_.encoder.finish_recording();
        ctx_.encoder.replay(node_graph);  // the execution the next nodes read; warms up
        FUSEBOX_CUDA_CHECK(cudaEventRecord(events[0], ctx_.encoder.stream()));
        ctx_.encoder.replay(node_graph);
        FUSEBOX_CUDA_CHECK(cudaEventRecord(events[1], ctx_.encoder.stream()));
        FUSEBOX_CUDA_CHECK(cudaEventSynchronize(events[1]));
        float ms = 0;
        FUSEBOX_CUDA_CHECK(cudaEventElapsedTime(&ms, events[0], events[1]));
        cuda::check_error_flags(ctx_);
        for (size_t k = 0; k < n.outputs.size(); ++k) w.slots[size_t(n.outputs[k])] = written[k];
        times.push_back({n.name, n.op, double(ms) / repeats});
      }
      end_walk(w);
      ctx_.encoder.synchronize();
      cuda::check_error_flags(ctx_);
    } catch (...) {
      ctx_.encoder.discard_recording();
      cuda::ErrorFlags::of(ctx_.encoder).take();
      for (cudaEvent_t e : events)
        if (e) cudaEventDestroy(e);
      throw;
    }
    for (cudaEvent_t e : events) FUSEBOX_CUDA_CHECK(cudaEventDestroy(e));
    return times;
  }

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
  Device device() const override { return Device::cuda; }

 private:
  struct Input {
    ValueId value = kNoValue;
    DeviceArray array;          // what feeds are copied into (and input() returns)
    bool convert = false;       // the step reads a converted copy (value_tensor)
    DeviceTensor value_tensor;  // what the step reads
    bool has_contents = false;
    // Double-buffered staging (recorded steps, inputs fed from the host): a batch is copied
    // on the copy stream into stage[k] while the device still runs the step before, and
    // the step's first operation (memcpy op `stage_op`, pointed at stage[k]) copies it in.
    cuda::DeviceBuffer stage[2];
    cuda::Fence stage_free[2];  // after the last step that read stage[k]
    bool staged = false;        // fed from the host through stage[] (large inputs, recorded steps)
    size_t stage_op = cuda::CommandEncoder::kNoOp;
    int next_stage = 0;
    bool stage_enabled = true;
  };

  // Steps 1-2: the arena, the inputs' and outputs' buffers, which aliases run in place.
  void plan_memory_and_buffers() {
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
      if (io_.aliased_by_input[i] >= 0 || life_.last[size_t(v)] == Liveness::kAfterLastNode)
        continue;
      DeviceTensor fed;  // the order the input's buffer has: the bound array's, else dense
      fed.dtype = t.dtype;
      fed.shape = t.shape;
      fed.strides = io_.bound[i] ? options_.bound.at(io_.input_names[i]).storage()->tensor.strides
                                 : strides_for(t.shape, MemoryFormat::contiguous);
      if (in_format(fed, layout_.of(v))) continue;
      converted_in_arena[size_t(v)] = true;
      bytes[size_t(v)] = size_t(numel(t.shape)) * dtype_size(t.dtype);
    }
    // A reshape between two contiguous arena values is a view: its output shares its
    // input's bytes and the node copies nothing (copy_reshape sees one address).
    same_bytes_.assign(values, kNoValue);
    for (const Node& n : graph_.nodes()) {
      if (!is_reshape_family(n.op)) continue;
      const ValueId in = n.inputs[0], out = n.outputs[0];
      if (bytes[size_t(in)] == 0 || bytes[size_t(out)] != bytes[size_t(in)] ||
          converted_in_arena[size_t(in)] || layout_.of(in) != MemoryFormat::contiguous ||
          layout_.of(out) != MemoryFormat::contiguous)
        continue;
      same_bytes_[size_t(out)] = in;
    }
    const MemoryPlan plan = plan_memory(graph_, life_, bytes, options_.reuse_memory, same_bytes_);
    offsets_ = plan.offset;
    // The nodes' temporaries go where no value is at the time (none without reuse: that
    // plan is the reference the reusing one is tested against).
    if (options_.reuse_memory) gaps_ = free_gaps(graph_, life_, bytes, plan);
    stats_.arena_bytes = plan.arena_bytes;
    stats_.unshared_bytes = plan.unshared_bytes;
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

    auto allocate = [&](const TensorType& t, MemoryFormat f, const std::string& what) {
      try {
        DeviceTensor d = DeviceTensor::empty(ctx_.allocator, t.dtype, t.shape, f);
        stats_.io_bytes += d.buffer.size();
        return d;
      } catch (const Error& e) {
        throw Error(where_, cat("out of device memory for ", what, " (",
                                bytes_str(size_t(numel(t.shape)) * dtype_size(t.dtype)),
                                "): ", error_message(e), "; try a smaller batch"));
      }
    };
    auto own_array = [&](const DeviceTensor& d) { return DeviceArray(cuda_storage(d)); };

    inputs_.resize(io_.input_names.size());
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
    alias_buffer_.resize(io_.output_names.size());
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
  // updates that very input elementwise, nothing reads the input after the producer, and
  // the buffer is in the order the producer writes.
  bool can_compute_in_place(ValueId out, size_t input) const {
    const Input& in = inputs_[input];
    const int k = life_.first[size_t(out)];
    if (k < 0 || in.convert) return false;
    const Node& n = graph_.nodes()[size_t(k)];
    size_t which = 0;
    while (n.outputs[which] != out) ++which;
    const int m = in_place_input(n, which);
    if (m < 0 || n.inputs[size_t(m)] != in.value || life_.last[size_t(in.value)] != k) return false;
    // Running statistics are written in the forward pass, before the loss has checked the
    // labels: with a halt word they are committed at the step's end, guarded (small).
    if (halt_ && n.op == OpKind::batch_norm) return false;
    if (std::count(n.inputs.begin(), n.inputs.end(), in.value) != 1) return false;
    if (std::count(graph_.outputs().begin(), graph_.outputs().end(), out) != 1) return false;
    return in_format(in.array.storage()->tensor, layout_.of(out));
  }

  // Step 3: constants, each once, in its planned order.
  void upload_constants() {
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

  DeviceTensor arena_tensor(ValueId v) const {
    const TensorType& t = graph_.value(v).type;
    DeviceTensor d;
    d.buffer = arena_;
    d.offset = int64_t(offsets_[size_t(v)] / dtype_size(t.dtype));
    d.dtype = t.dtype;
    d.shape = t.shape;
    d.strides = strides_for(t.shape, layout_.of(v));
    return d;
  }

  // Step 4: the node walk (recorded once; launching directly, run by every run).
  void record_step() {
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

  // The values a walk over the nodes reads and writes.
  struct Walk {
    std::vector<DeviceTensor> slots;          // by ValueId: what readers of the value read
    std::vector<DeviceTensor> output_tensor;  // by ValueId: an output's returned buffer
  };

  // Constants and inputs in their slots. The step also records each staged input's copy
  // from its staging buffer, then the input conversions; a profile (`step` false) reads the
  // inputs as the last run left them and records only the conversions (arena values).
  Walk begin_walk(bool step) {
    Walk w;
    w.slots.resize(graph_.values().size());
    for (const auto& [v, t] : graph_.constants()) w.slots[size_t(v)] = constants_[size_t(v)];
    for (Input& in : inputs_) {
      if (in.staged && step) {
        // The staging buffers come with the first feed from the host (a loop fed from device
        // arrays never needs them); until then the copy reads the arena (never runs: off).
        const cuda::DeviceTensor& dst = in.array.storage()->tensor;
        const cuda::DeviceBuffer& src =
            arena_.size() >= dst.nbytes() ? arena_ : stage_buffer(in, 0);
        in.stage_op = ctx_.encoder.memcpy(dst.range(), cuda::BufferRange(src, 0, dst.nbytes()));
      }
      if (in.convert) cuda::copy_strided(ctx_, in.array.storage()->tensor, in.value_tensor);
      w.slots[size_t(in.value)] = in.value_tensor;
    }
    w.output_tensor.resize(graph_.values().size());
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
    return w;
  }

  // Where node `n`'s outputs go: a returned buffer, the arena, or (no bytes) a buffer of
  // its own that keeps pointers valid.
  std::vector<DeviceTensor> node_outputs(const Walk& w, const Node& n) {
    std::vector<DeviceTensor> outs;
    for (ValueId v : n.outputs) {
      if (w.output_tensor[size_t(v)].buffer) {
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
  void record_node(size_t i, const Walk& w, std::vector<DeviceTensor>& outs) {
    const Node& n = graph_.nodes()[i];
    std::vector<const DeviceTensor*> in_ptrs;
    for (ValueId v : n.inputs) in_ptrs.push_back(v == kNoValue ? nullptr : &w.slots[size_t(v)]);
    if (i < gaps_.size() && gaps_[i].bytes > 0)
      ctx_.encoder.set_temporary_region(cuda::BufferRange(arena_, gaps_[i].offset, gaps_[i].bytes));
    try {
      cuda::run_node(ctx_, n, in_ptrs, outs);
    } catch (...) {
      ctx_.encoder.clear_temporary_region();
      throw;
    }
    ctx_.encoder.clear_temporary_region();
  }

  void record_nodes() {
    Walk w = begin_walk(true);
    for (size_t i = 0; i < graph_.nodes().size(); ++i) {
      const Node& n = graph_.nodes()[i];
      std::vector<DeviceTensor> outs = node_outputs(w, n);
      // Poison all but state updated in place (the poison would be its only value) and
      // views (the poison would be their input's).
      if (options_.poison)
        for (size_t k = 0; k < outs.size(); ++k)
          if (in_place_[size_t(n.outputs[k])] < 0 && same_bytes_[size_t(n.outputs[k])] == kNoValue)
            ctx_.encoder.memset(outs[k].range(), 0xff);
      record_node(i, w, outs);
      for (size_t k = 0; k < n.outputs.size(); ++k) w.slots[size_t(n.outputs[k])] = outs[k];
    }
    end_walk(w);
  }

  // Outputs not written where they are returned (an input or a constant marked as an
  // output), then aliased outputs that could not be computed in place.
  void end_walk(const Walk& w) {
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

  void feed_inputs(const Feeds& feeds) {
    // Every feed checked before any is copied: a bad one leaves all inputs as they were.
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const std::string& name = io_.input_names[i];
      const TensorType& type = graph_.value(inputs_[i].value).type;
      auto it = feeds.find(name);
      if (it == feeds.end()) {
        FUSEBOX_CHECK(inputs_[i].has_contents, where_, "no tensor given for input '", name, "' (",
                      dtype_name(type.dtype), shape_str(type.shape), ")");
      } else if (const Tensor* t = std::get_if<Tensor>(&it->second)) {
        check_feed(type, name, t->dtype(), t->shape(), where_);
      } else {
        const DeviceArray& a = std::get<DeviceArray>(it->second);
        FUSEBOX_CHECK(a.defined() && a.device() == Device::cuda, where_, "input '", name,
                      "' was fed an array that is not on the GPU");
        check_feed(type, name, a.dtype(), a.shape(), where_);
      }
    }
    for (size_t i = 0; i < inputs_.size(); ++i) {
      Input& in = inputs_[i];
      const std::string& name = io_.input_names[i];
      auto it = feeds.find(name);
      if (it == feeds.end()) continue;
      const DeviceTensor& dst = in.array.storage()->tensor;
      if (const Tensor* t = std::get_if<Tensor>(&it->second)) {
        if (!dst.is_contiguous()) {
          in.array.copy_from(*t);  // resident state in another order: converted (blocking)
        } else if (in.stage_op != cuda::CommandEncoder::kNoOp && t->nbytes() > kSmallFeedBytes) {
          const int k = in.next_stage;
          in.next_stage ^= 1;
          const void* source = t->raw();
          if (is_pinned(source)) {
            next_run_.pinned_feeds.push_back(*t);  // not written until copied: executable.h
          } else {
            std::shared_ptr<cuda::PinnedSlot> slot = input_staging_[i].acquire(t->nbytes(), 2);
            std::memcpy(slot->bytes.get(), t->raw(), t->nbytes());
            source = slot->bytes.get();
            fed_slots_.push_back(std::move(slot));
          }
          ctx_.encoder.wait(copy_stream_->copy_to_device(
              cuda::BufferRange(stage_buffer(in, k), 0, t->nbytes()), source, in.stage_free[k]));
          step_.set_memcpy(in.stage_op, dst.data(), in.stage[k].data(), t->nbytes());
          set_stage_enabled(in, true);
          staged_now_.push_back({&in, k});
          in.has_contents = true;
          continue;
        } else if (t->nbytes() > 0) {
          std::shared_ptr<cuda::PinnedSlot> slot = input_staging_[i].acquire(t->nbytes(), 2);
          std::memcpy(slot->bytes.get(), t->raw(), t->nbytes());
          ctx_.encoder.copy_to_device_async(dst.range(), slot->bytes.get());
          fed_slots_.push_back(std::move(slot));
        }
      } else {
        const DeviceArray& a = std::get<DeviceArray>(it->second);
        const DeviceTensor& src = a.storage()->tensor;
        if (a.same_storage(in.array)) {
          // already there
        } else if (src.strides == dst.strides) {
          ctx_.encoder.copy_now(dst.range(), src.range());  // same order: a plain copy
          next_run_.array_feeds.push_back(a);  // the caller's array, until the copy is done
        } else {
          cuda::copy_strided(ctx_, src, dst);
        }
      }
      in.has_contents = true;
    }
    // An input not fed from the host this run keeps its buffer: its staging copy is off.
    for (Input& in : inputs_) {
      const bool staged = std::any_of(staged_now_.begin(), staged_now_.end(),
                                      [&](const auto& s) { return s.first == &in; });
      if (in.stage_op != cuda::CommandEncoder::kNoOp && !staged) set_stage_enabled(in, false);
    }
  }

  const cuda::DeviceBuffer& stage_buffer(Input& in, int k) {
    if (!in.stage[k]) {
      const size_t bytes = in.array.nbytes();
      try {
        in.stage[k] = ctx_.allocator.allocate(bytes);
      } catch (const Error& e) {
        throw Error(where_, cat("out of device memory for the staging buffer of input '",
                                io_.input_names[size_t(&in - inputs_.data())], "' (",
                                bytes_str(bytes), "): ", error_message(e)));
      }
    }
    return in.stage[k];
  }

  void set_stage_enabled(Input& in, bool enabled) {
    if (in.stage_enabled == enabled) return;
    step_.set_enabled(in.stage_op, enabled);
    in.stage_enabled = enabled;
  }

  // Waits for the oldest run in flight, lets go of what it held, checks its error records.
  void retire_oldest_run() {
    const std::shared_ptr<RunCheck> run = std::move(in_flight_.front().run);
    in_flight_.pop_front();
    run->check();
  }

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
  std::vector<int> in_place_;        // by ValueId: the input an output is computed in
  std::vector<ValueId> same_bytes_;  // by ValueId: the value a view's bytes are (reshapes)
  // By output: where an aliased output that cannot be computed in place is computed, to be
  // copied into its input at the end (empty for every other output).
  std::vector<DeviceTensor> alias_buffer_;
  cuda::RecordedGraph step_;
  std::shared_ptr<const cuda::ErrorFlags::Reserved> errors_;
  std::vector<cuda::PinnedPool> input_staging_, output_staging_;
  std::vector<DeviceTensor> readback_;  // by output: contiguous copies of non-contiguous ones
  cuda::PinnedPool error_staging_;
  std::vector<std::shared_ptr<cuda::PinnedSlot>> fed_slots_;
  std::vector<std::pair<Input*, int>> staged_now_;  // inputs staged this run, and their stage
  std::unique_ptr<cuda::CopyStream> copy_stream_;
  // A run queued on the device: its error check (and fence), and the feeds it copies
  // straight from the caller's memory, held until it has completed.
  struct RunInFlight {
    std::shared_ptr<RunCheck> run;
    std::vector<Tensor> pinned_feeds;
    std::vector<DeviceArray> array_feeds;
  };
  RunInFlight next_run_;  // filled while a run is issued
  std::deque<RunInFlight> in_flight_;
  static constexpr size_t kMaxRunsInFlight = 3;
  // Feeds up to this size (a learning rate, labels) go straight from pinned staging into
  // the input on the device stream: the copy stream's events cost more than they hide.
  static constexpr size_t kSmallFeedBytes = 64 << 10;
  mutable ExecutableStats stats_;  // runs_not_applied refreshed by stats()
};

}  // namespace

std::unique_ptr<Executable> compile_cuda(const Graph& g, const CompileOptions& options) {
  return std::make_unique<CudaExecutable>(g, options);
}

}  // namespace fusebox::runtime
