// Executable::compile (the pipeline its options name, then the backend's compile),
// Executable::run, and run_graph: compile, run once.
#include "fusebox/runtime/executor.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <optional>

#include "backends/cuda/kernels/conv/report.h"
#include "backends/cuda/runtime/allocator.h"
#include "backends/cuda/runtime/check.h"
#include "backends/cuda/runtime/device.h"
#include "executable/executables.h"
#include "fusebox/backends/cpu_fast.h"
#include "fusebox/passes/simplify.h"
#include "fusebox/runtime/executable.h"

namespace fusebox {

const char* device_name(Device d) {
  return d == Device::cuda ? "cuda" : "cpu";
}

bool cuda_available() {
  static const bool present = cuda::device_present();
  return present;
}

namespace {
std::atomic<int> g_cuda_device{0};
}

int cuda_device_count() {
  return cuda_available() ? cuda::device_count() : 0;
}

void use_cuda_device(int index) {
  const int count = cuda_device_count();
  FUSEBOX_CHECK(index >= 0 && index < count, "cuda device",
                cat("GPU ", index, " does not exist: this machine has ", count));
  FUSEBOX_CUDA_CHECK(cudaSetDevice(index));
  g_cuda_device.store(index, std::memory_order_relaxed);
}

int cuda_device() {
  return g_cuda_device.load(std::memory_order_relaxed);
}

void set_conv_autotune(std::optional<bool> autotune) {
  cuda::set_conv_autotune_override(autotune);
}

Device parse_device(const std::string& s) {
  if (s == "cpu" || s == "cpu-ref") return Device::cpu;
  if (s == "cuda") return Device::cuda;
  if (s == "auto") return cuda_available() ? Device::cuda : Device::cpu;
  throw Error("device", cat("unknown device '", s, "' (expected cpu, cpu-ref, cuda or auto)"));
}

const char* cpu_kernels_name(CpuKernels k) {
  return k == CpuKernels::fast ? "fast" : "reference";
}

CpuKernels cpu_kernels_for(const std::string& device) {
  return device == "cpu-ref" ? CpuKernels::reference : CpuKernels::fast;
}

namespace {

// The graph the backend compiles: the pipeline's (nullopt: PipelineKind::none, the graph as is).
std::optional<Graph> pipeline_graph(const Graph& graph, const CompileOptions& options) {
  if (options.device == Device::cuda)
    FUSEBOX_CHECK(cuda_available(), "run " + graph.name(),
                  "no CUDA device is available on this machine; use --device cpu");
  if (options.pipeline.kind == PipelineKind::none) return std::nullopt;
  PipelineOptions pipeline = options.pipeline;
  const bool onednn = options.device == Device::cpu && options.cpu_kernels == CpuKernels::fast &&
                      cpu_fast::built_with_onednn();
  // The CPU's fast kernels run f32 attention on oneDNN (fused: the scores written and read
  // once); the GPU's f32 products are faster unfused, on cuBLASLt.
  pipeline.fusion.f32_attention = onednn;
  Graph prepared = prepare_graph(graph, pipeline);
  // oneDNN's matmul writes the classes-first logits itself (passes/simplify.h).
  if (onednn) swap_transposed_products(prepared);
  return prepared;
}

std::unique_ptr<Executable> compile_for_device(const Graph& g, const CompileOptions& options) {
  return options.device == Device::cuda ? runtime::compile_cuda(g, options)
                                        : runtime::compile_cpu(g, options);
}

}  // namespace

std::unique_ptr<Executable> Executable::compile(const Graph& graph, const CompileOptions& options) {
  const std::optional<Graph> prepared = pipeline_graph(graph, options);
  return compile_for_device(prepared ? *prepared : graph, options);
}

std::unique_ptr<Executable> Executable::compile(Graph&& graph, const CompileOptions& options) {
  Graph source = std::move(graph);
  std::optional<Graph> prepared = pipeline_graph(source, options);
  if (!prepared) return compile_for_device(source, options);
  // The source's constants the pipeline replaced (folded weights) go before the backend makes
  // its own copies of the pipeline's (ResNet-50 on the CPU: 100 MB less at the peak).
  source = Graph(source.name());
  return compile_for_device(*prepared, options);
}

NamedTensors Executable::run(const NamedTensors& feeds) {
  Feeds in;
  for (const auto& [name, t] : feeds) in.emplace(name, t);
  std::set<std::string> all;
  for (ValueId v : graph().outputs()) all.insert(graph().value(v).name);
  StepResult r = run_async(in, all);
  check_errors();  // this run's (and any earlier run's) kernel errors, as an Error
  NamedTensors out;
  for (auto& [name, pending] : r.host) out[name] = pending.get();
  return out;
}

DeviceMemoryStats device_memory_stats(Device device) {
  if (device != Device::cuda || !cuda_available()) return {};
  const cuda::AllocatorStats s = cuda::CachingAllocator::for_device(cuda_device()).stats();
  return {.in_use = s.bytes_in_use, .peak = s.peak_bytes_in_use, .cached = s.bytes_cached};
}

void reset_peak_device_memory(Device device) {
  if (device == Device::cuda && cuda_available())
    cuda::CachingAllocator::for_device(cuda_device()).reset_peak();
}

NamedTensors run_graph(const Graph& g, const NamedTensors& feeds, const RunOptions& opts) {
  // Missing feeds are found before the (expensive) compile; the run checks the rest.
  for (ValueId v : g.inputs()) {
    const Value& val = g.value(v);
    FUSEBOX_CHECK(feeds.count(val.name), "run " + g.name(), "no tensor given for input '", val.name,
                  "' (", dtype_name(val.type.dtype), shape_str(val.type.shape), ")");
  }
  return Executable::compile(g, {.device = opts.device,
                                 .cpu_kernels = opts.cpu_kernels,
                                 .poison = opts.poison_outputs})
      ->run(feeds);
}

}  // namespace fusebox
