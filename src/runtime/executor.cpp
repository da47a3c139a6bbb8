// Runs a graph node by node in its stored (topological) order, releasing each
// intermediate tensor after its last reader.
#include "fusebox/runtime/executor.h"

#include <algorithm>

#include "backends/cuda/runtime/device.h"
#include "fusebox/backends/cpu.h"
#include "runtime/cuda_executor.h"

namespace fusebox {

const char* device_name(Device d) {
  return d == Device::cuda ? "cuda" : "cpu";
}

bool cuda_available() {
  static const bool present = cuda::device_present();
  return present;
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu;
  if (s == "cuda") return Device::cuda;
  if (s == "auto") return cuda_available() ? Device::cuda : Device::cpu;
  throw Error("device", cat("unknown device '", s, "' (expected cpu, cuda or auto)"));
}

std::vector<int> count_reads(const Graph& g) {
  std::vector<int> reads(g.values().size(), 0);
  for (const Node& n : g.nodes())
    for (ValueId v : n.inputs)
      if (v != kNoValue) ++reads[size_t(v)];
  for (ValueId v : g.outputs()) reads[size_t(v)] += 1 << 20;  // outputs are never released
  return reads;
}

void check_feeds(const Graph& g, const NamedTensors& feeds, const std::string& where) {
  for (ValueId v : g.inputs()) {
    const Value& val = g.value(v);
    auto it = feeds.find(val.name);
    FUSEBOX_CHECK(it != feeds.end(), where, "no tensor given for input '", val.name, "' (",
                  dtype_name(val.type.dtype), shape_str(val.type.shape), ")");
    FUSEBOX_CHECK(it->second.dtype() == val.type.dtype && it->second.shape() == val.type.shape,
                  where, "input '", val.name, "' expects ", dtype_name(val.type.dtype),
                  shape_str(val.type.shape), " but was given ", dtype_name(it->second.dtype()),
                  shape_str(it->second.shape()));
  }
  for (const auto& [name, t] : feeds) {
    auto v = g.find_value(name);
    bool is_input = v && std::find(g.inputs().begin(), g.inputs().end(), *v) != g.inputs().end();
    FUSEBOX_CHECK(is_input, where, "a tensor was given for '", name,
                  "', which is not an input of the graph");
  }
}

NamedTensors run_graph(const Graph& g, const NamedTensors& feeds, const RunOptions& opts) {
  const std::string where = "run " + g.name();
  check_feeds(g, feeds, where);
  if (opts.device == Device::cuda) {
    FUSEBOX_CHECK(cuda_available(), where,
                  "no CUDA device is available on this machine; use --device cpu");
    return run_graph_cuda(g, feeds, opts);
  }
  std::vector<Tensor> slots(g.values().size());
  std::vector<int> remaining_reads = count_reads(g);
  for (const auto& [v, t] : g.constants()) slots[size_t(v)] = t;
  for (ValueId v : g.inputs()) slots[size_t(v)] = feeds.at(g.value(v).name);

  std::vector<const Tensor*> in_ptrs;
  std::vector<Tensor> outs;
  for (const Node& n : g.nodes()) {
    in_ptrs.clear();
    for (ValueId v : n.inputs) in_ptrs.push_back(v == kNoValue ? nullptr : &slots[size_t(v)]);
    outs.clear();
    for (ValueId v : n.outputs) {
      const TensorType& t = g.value(v).type;
      outs.push_back(Tensor::empty(t.dtype, t.shape));
      if (opts.poison_outputs) outs.back().poison();
    }
    cpu::run_node(g, n, in_ptrs, outs);
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      // An output nobody reads (e.g. batch_norm's saved statistics) is dropped at once.
      if (remaining_reads[size_t(n.outputs[i])] > 0)
        slots[size_t(n.outputs[i])] = std::move(outs[i]);
    }
    for (ValueId v : n.inputs)
      if (v != kNoValue && --remaining_reads[size_t(v)] == 0) slots[size_t(v)] = Tensor();
  }

  NamedTensors result;
  for (ValueId v : g.outputs()) result[g.value(v).name] = slots[size_t(v)];
  return result;
}

}  // namespace fusebox
