// The CPU executable: the reference backend runs node by node, in the graph's order,
// releasing each intermediate after its last reader. With the fast kernels
// (CompileOptions::cpu_kernels), each node oneDNN takes gets its kernel made here, at compile
// (fusebox/backends/cpu_fast.h), and runs on it; the others on the reference kernels. Inputs and
// outputs are host tensors held by DeviceArrays; an aliased output replaces its input's tensor
// handle (tensors are never written once made, so a handle taken earlier, a checkpoint's say, keeps
// its values).
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <mutex>

#include "executable/device_array.h"
#include "executable/executables.h"
#include "executable/io_plan.h"
#include "executable/memory_plan.h"
#include "fusebox/backends/cpu.h"
#include "fusebox/backends/cpu_fast.h"
#include "fusebox/core/memory.h"
#include "fusebox/ir/op_groups.h"

namespace fusebox::runtime {

namespace {

class CpuExecutable final : public Executable {
 public:
  CpuExecutable(const Graph& g, const CompileOptions& options)
      : graph_(g), options_(options), where_("run " + g.name()) {
    const auto start = std::chrono::steady_clock::now();
    io_ = plan_io(graph_, options_, where_);
    life_ = liveness(graph_);
    for (size_t i = 0; i < io_.input_names.size(); ++i) {
      const std::string& name = io_.input_names[i];
      const TensorType& t = graph_.value(graph_.inputs()[i]).type;
      inputs_.push_back(io_.bound[i] ? options_.bound.at(name)
                                     : DeviceArray(cpu_storage(t.dtype, t.shape)));
    }
    for (size_t i = 0; i < io_.output_names.size(); ++i) {
      const int alias = io_.alias_of_output[i];
      const TensorType& t = graph_.value(graph_.outputs()[i]).type;
      outputs_.push_back(alias >= 0 ? inputs_[size_t(alias)]
                                    : DeviceArray(cpu_storage(t.dtype, t.shape)));
    }
    stats_.nodes = graph_.nodes().size();
    for (const auto& [v, t] : graph_.constants()) stats_.constant_bytes += t.nbytes();
    if (options_.cpu_kernels == CpuKernels::fast) plan_fast_kernels();
    check_memory_budget();
    stats_.compile_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  StepResult run_async(const Feeds& feeds, const std::set<std::string>& to_host,
                       const std::string& label) override {
    try {
      return run_now(feeds, to_host);
    } catch (const Error& e) {
      if (label.empty()) throw;
      throw Error(e.where(), label + ": " + error_message(e));
    }
  }

  std::vector<NodeTime> profile(int repeats) override {
    FUSEBOX_CHECK(repeats >= 1, where_, "profile: repeats must be at least 1, got ", repeats);
    FUSEBOX_CHECK(options_.aliases.empty(), where_,
                  "profile: not for a step with aliased state (repeating would change it)");
    std::vector<NodeTime> times;
    run_now({}, {}, &times, repeats);
    return times;
  }

  // The oneDNN kernel of every node it takes; the summary says, per op, how many nodes run on
  // it and why the others do not (the first reason met).
  void plan_fast_kernels() {
    fast_.resize(graph_.nodes().size());
    std::map<std::string, std::pair<size_t, size_t>> by_op;  // op -> (fast, reference)
    std::map<std::string, std::string> why_not;
    for (size_t k = 0; k < graph_.nodes().size(); ++k) {
      const Node& n = graph_.nodes()[k];
      cpu_fast::Planned p = cpu_fast::plan(graph_, n);
      auto& [fast, reference] = by_op[op_name(n.op)];
      if (p.kernel) {
        ++fast;
        fast_[k] = std::move(p.kernel);
      } else {
        ++reference;
        why_not.emplace(op_name(n.op), p.why_not);
      }
    }
    plan_own_layouts();
    std::string summary;
    for (const auto& [op, counts] : by_op) {
      summary += cat("  ", op, ": ", counts.first, " fast");
      if (counts.second > 0) summary += cat(", ", counts.second, " reference (", why_not[op], ")");
      summary += "\n";
      stats_.fast_nodes += counts.first;
    }
    size_t own = 0;
    for (bool b : own_writer_) own += b;
    stats_.fast_summary =
        cat("fast CPU kernels: ", stats_.fast_nodes, " of ", graph_.nodes().size(), " nodes; ", own,
            " values stay in their writer's layout (oneDNN's) for readers that "
            "take it\n",
            summary);
  }

  // Which nodes leave output 0 in their kernel's own layout: where the kernel can, and every
  // reader's kernel reads that input in it (cpu_fast::Kernel), and it is no graph output.
  void plan_own_layouts() {
    own_writer_.assign(graph_.nodes().size(), false);
    std::vector<bool> taken(graph_.values().size(), true);  // every reader takes it, so far
    std::vector<bool> read(graph_.values().size(), false);
    for (const Node& n : graph_.nodes()) {
      const cpu_fast::Kernel* k = fast_[size_t(n.id)].get();
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const ValueId v = n.inputs[i];
        if (v == kNoValue) continue;
        read[size_t(v)] = true;
        if (!k || !k->reads_own_layout(i)) taken[size_t(v)] = false;
      }
    }
    for (ValueId v : graph_.outputs()) taken[size_t(v)] = false;
    for (const Node& n : graph_.nodes()) {
      const cpu_fast::Kernel* k = fast_[size_t(n.id)].get();
      if (!k || !k->writes_own_layout() || n.outputs.empty()) continue;
      const ValueId v = n.outputs[0];
      own_writer_[size_t(n.id)] = read[size_t(v)] && taken[size_t(v)];
    }
  }

  // The most host memory a run holds at once (what the memory plan counts: every node's
  // outputs from the node that writes them to their last reader; graph outputs to the end),
  // against what the host budget has left: a run that cannot fit is refused now, naming its
  // largest value, not part way through with the host's memory taken.
  void check_memory_budget() {
    const size_t values = graph_.values().size();
    std::vector<size_t> bytes(values, 0);
    for (const Node& n : graph_.nodes())
      for (ValueId v : n.outputs) {
        const TensorType& t = graph_.value(v).type;
        bytes[size_t(v)] = size_t(numel(t.shape)) * dtype_size(t.dtype);
      }
    const MemoryPlan plan = plan_memory(graph_, life_, bytes, /*reuse=*/false);
    stats_.arena_bytes = plan.peak_live_bytes;  // the CPU's "arena": what a run holds at most
    stats_.unshared_bytes = plan.unshared_bytes;
    note_peak(graph_, plan, bytes, stats_);
    if (plan.largest != kNoValue) {
      stats_.largest_value = graph_.value(plan.largest).name;
      stats_.largest_value_bytes = bytes[size_t(plan.largest)];
    }
    const HostMemoryStats host = host_memory_stats();
    const size_t free = host.limit > host.in_use ? host.limit - host.in_use : 0;
    if (plan.peak_live_bytes <= free) return;
    throw OutOfMemory(
        where_, cat("a run needs ", format_bytes(plan.peak_live_bytes),
                    " of host memory for its intermediates at once (the largest, '",
                    stats_.largest_value, "', ", format_bytes(stats_.largest_value_bytes), "), ",
                    host_memory_summary(), "; try a smaller batch"));
  }

  // With `times`: each node runs `repeats` times (its outputs are new tensors each time, so
  // repeating changes nothing), timed by the host clock.
  StepResult run_now(const Feeds& feeds, const std::set<std::string>& to_host,
                     std::vector<NodeTime>* times = nullptr, int repeats = 1) {
    check_request(io_, feeds, to_host, where_);
    std::vector<Tensor> slots(graph_.values().size());
    for (const auto& [v, t] : graph_.constants()) slots[size_t(v)] = t;
    std::vector<Tensor> fed(io_.input_names.size());  // this run's feeds, by input
    for (size_t i = 0; i < io_.input_names.size(); ++i) {
      const ValueId v = graph_.inputs()[i];
      const std::string& name = io_.input_names[i];
      if (auto it = feeds.find(name); it != feeds.end()) {
        fed[i] = std::holds_alternative<Tensor>(it->second)
                     ? std::get<Tensor>(it->second)
                     : std::get<DeviceArray>(it->second).to_host();
      }
      const Tensor t = fed[i].defined() ? fed[i] : inputs_[i].storage()->host;
      FUSEBOX_CHECK(t.defined(), where_, "no tensor given for input '", name, "' (",
                    dtype_name(graph_.value(v).type.dtype), shape_str(graph_.value(v).type.shape),
                    ")");
      check_feed(graph_.value(v).type, name, t.dtype(), t.shape(), where_);
      slots[size_t(v)] = t;
    }

    std::vector<const Tensor*> in_ptrs;
    std::vector<Tensor> outs;
    // Values held in their writer's own layout (plan_own_layouts), by ValueId.
    std::vector<std::shared_ptr<cpu_fast::OwnLayout>> own(
        own_writer_.empty() ? 0 : graph_.values().size());
    for (size_t k = 0; k < graph_.nodes().size(); ++k) {
      const Node& n = graph_.nodes()[k];
      try {
        execute_node(n, slots, own, in_ptrs, outs, times, repeats);
      } catch (const OutOfMemory& e) {
        throw OutOfMemory(node_label(n), error_message(e));
      } catch (const std::bad_alloc&) {  // a kernel's own scratch (a std::vector), say
        throw OutOfMemory(node_label(n), cat("out of host memory in the kernel (std::bad_alloc), ",
                                             host_memory_summary()));
      }
      // An output nobody reads (e.g. batch_norm's saved statistics) is dropped at once.
      for (size_t i = 0; i < n.outputs.size(); ++i)
        if (life_.last[size_t(n.outputs[i])] >= 0) slots[size_t(n.outputs[i])] = std::move(outs[i]);
      for (ValueId v : n.inputs)
        if (v != kNoValue && life_.last[size_t(v)] == int(k) && !graph_.is_constant(v)) {
          slots[size_t(v)] = Tensor();
          if (!own.empty()) own[size_t(v)].reset();
        }
    }

    // Only now, the whole run having succeeded, do inputs and outputs change.
    for (size_t i = 0; i < io_.input_names.size(); ++i)
      if (fed[i].defined()) inputs_[i].storage()->host = fed[i];
    StepResult result;
    for (size_t i = 0; i < io_.output_names.size(); ++i) {
      const std::string& name = io_.output_names[i];
      outputs_[i].storage()->host = slots[size_t(graph_.outputs()[i])];
      result.outputs[name] = outputs_[i];
      if (to_host.count(name)) {
        auto state = std::make_shared<PendingTensor::State>();
        state->value = outputs_[i].storage()->host;
        result.host[name] = PendingTensor(std::move(state));
      }
    }
    return result;
  }

  // A tensor for value v's output. One of kPooledBytes or more takes a block of its size that
  // an earlier output had and nothing holds any more (its value died, or nobody kept the run's
  // tensor): glibc served such blocks from fresh mappings (past its 32 MiB heap limit:
  // keep_freed_host_memory; and, strace showed, GPT-2's 9 MB products too, run after run), so a
  // run paid a page fault for every 4 KiB of them it touched. GPT-2 at batch 8 writes
  // [8, 128, 50257] f32 logits twice (the LM head's product, then the classes-first transpose
  // the graph outputs): 206 MB, ~50,000 faults, each. (Transparent huge pages instead made
  // those faults slower still on this machine: direct compaction.) The pool keeps what a run
  // held of each size at once, between runs, as an allocator arena keeps it.
  Tensor output_tensor(ValueId v) {
    const TensorType& t = graph_.value(v).type;
    const size_t bytes = size_t(numel(t.shape)) * dtype_size(t.dtype);
    if (bytes < kPooledBytes) return Tensor::empty(t.dtype, t.shape);
    const std::lock_guard<std::mutex> lock(pool_mutex_);  // a check and a take, together
    std::vector<std::shared_ptr<std::byte[]>>& blocks = pool_[bytes];
    for (const std::shared_ptr<std::byte[]>& block : blocks)
      if (block.use_count() == 1) return Tensor::adopt(t.dtype, t.shape, block);
    blocks.push_back(allocate_host(bytes, cat(dtype_name(t.dtype), shape_str(t.shape))));
    return Tensor::adopt(t.dtype, t.shape, blocks.back());
  }

  // Node `n`'s outputs into `outs` (and `own`), from its inputs in `slots` and `own` (timed
  // into `times` when given).
  void execute_node(const Node& n, const std::vector<Tensor>& slots,
                    std::vector<std::shared_ptr<cpu_fast::OwnLayout>>& own,
                    std::vector<const Tensor*>& in_ptrs, std::vector<Tensor>& outs,
                    std::vector<NodeTime>* times, int repeats) {
    in_ptrs.clear();
    for (ValueId v : n.inputs) in_ptrs.push_back(v == kNoValue ? nullptr : &slots[size_t(v)]);
    // A reshape is its input's bytes under another shape (tensors are never written once
    // made, so sharing them is safe): no copy, on either kernel set.
    if (is_reshape_family(n.op) && n.outputs.size() == 1 && in_ptrs[0] && in_ptrs[0]->defined()) {
      outs.assign(1, in_ptrs[0]->reshaped(graph_.value(n.outputs[0]).type.shape));
      if (times) times->push_back({n.name, n.op, 0.0});
      return;
    }
    const bool own_output = !own_writer_.empty() && own_writer_[size_t(n.id)];
    outs.clear();
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      outs.emplace_back();
      if (i == 0 && own_output) continue;  // left in the kernel's layout, in `own`
      outs.back() = output_tensor(n.outputs[i]);
      if (options_.poison) outs.back().poison();
    }
    std::vector<const cpu_fast::OwnLayout*> own_in;
    uint32_t consumable = 0;  // own inputs this node reads last, and once
    if (!own.empty()) {
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const ValueId v = n.inputs[i];
        own_in.push_back(v == kNoValue ? nullptr : own[size_t(v)].get());
        // Not when the node runs more than once (a profile's repeats): its first run would
        // have consumed the input. A profile of one run times what a run does.
        if (own_in.back() && life_.last[size_t(v)] == int(n.id) && repeats == 1 &&
            std::count(n.inputs.begin(), n.inputs.end(), v) == 1 && i < 32)
          consumable |= 1u << i;
      }
    }
    cpu_fast::Kernel* fast = fast_.empty() ? nullptr : fast_[size_t(n.id)].get();
    auto run = [&] {
      if (fast) {
        try {
          fast->run_own(in_ptrs, own_in, consumable, outs,
                        own_output ? &own[size_t(n.outputs[0])] : nullptr);
        } catch (const OutOfMemory&) {
          throw;                    // named by the run loop
        } catch (const Error& e) {  // a oneDNN failure: name the node it ran
          throw Error(node_label(n), error_message(e));
        }
      } else {
        cpu::run_node(graph_, n, in_ptrs, outs, options_.communicator.get());
      }
    };
    if (times == nullptr) {
      run();
    } else {
      std::vector<double> ms;
      for (int r = 0; r < repeats; ++r) {
        const auto start = std::chrono::steady_clock::now();
        run();
        ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count());
      }
      std::sort(ms.begin(), ms.end());
      times->push_back({n.name, n.op, ms[ms.size() / 2]});
    }
  }

  void check_errors() override {}  // kernels throw where they find bad data
  DeviceArray input(const std::string& name) const override {
    auto it = io_.input_index.find(name);
    FUSEBOX_CHECK(it != io_.input_index.end(), where_, "'", name, "' is not an input");
    return inputs_[it->second];
  }
  const Graph& graph() const override { return graph_; }
  const ExecutableStats& stats() const override { return stats_; }
  const ExecutableReport& report() const override { return report_; }  // nothing to report
  Device device() const override { return Device::cpu; }

 private:
  Graph graph_;
  CompileOptions options_;
  std::string where_;
  IoPlan io_;
  Liveness life_;
  std::vector<DeviceArray> inputs_, outputs_;
  ExecutableStats stats_;
  std::vector<std::unique_ptr<cpu_fast::Kernel>> fast_;  // by node; null: the reference's
  std::vector<bool> own_writer_;  // by node: output 0 stays in its kernel's layout
  ExecutableReport report_;
  static constexpr size_t kPooledBytes = size_t(1) << 20;
  std::mutex pool_mutex_;
  std::map<size_t, std::vector<std::shared_ptr<std::byte[]>>> pool_;  // output_tensor's, by size
};

// The host allocator (glibc's) told to keep the blocks a run frees for the next run, once per
// process. Why: a step allocates and frees the same sizes run after run (its intermediates, the
// fast kernels' oneDNN temporaries), and by default blocks past the adaptive mmap threshold are
// unmapped on free and the heap's free top is returned to the kernel, so every run paid the page
// faults of touching that memory afresh: ViT-B/16 at batch 8 on 2 cores ran 2336 ms a step, 1956
// with blocks up to 32 MiB (the most glibc allows) served from the heap and the heap not trimmed
// (glibc's tunables, same binary). The process keeps its peak of freed memory (what an
// allocator arena, onnxruntime's included, keeps); blocks past 32 MiB are still unmapped.
void keep_freed_host_memory() {
#ifdef __GLIBC__
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  });
#endif
}

}  // namespace

std::unique_ptr<Executable> compile_cpu(const Graph& g, const CompileOptions& options) {
  keep_freed_host_memory();
  return std::make_unique<CpuExecutable>(g, options);
}

}  // namespace fusebox::runtime
