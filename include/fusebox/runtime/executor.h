// Runs a whole graph on a backend, once (see executable.h for compiling it once and running
// it many times).
#pragma once

#include <map>
#include <optional>
#include <string>

#include "fusebox/ir/graph.h"

namespace fusebox {

enum class Device : uint8_t { cpu, cuda };
const char* device_name(Device d);
// "cpu" | "cpu-ref" | "cuda" | "auto" (cuda when a GPU is present and the CUDA backend is
// built, else cpu); "cpu-ref" is the CPU too, with the reference kernels (cpu_kernels_for).
Device parse_device(const std::string& s);

// Which kernels a CPU executable runs: the reference backend's (exact and simple: the oracle
// every test compares against, and the library's default), or oneDNN's where it has the node
// and the reference's elsewhere (fast; within a documented tolerance of the reference:
// docs/cpu_fast.md). The CLI's `--device cpu` is fast, `--device cpu-ref` the reference.
enum class CpuKernels : uint8_t { reference, fast };
const char* cpu_kernels_name(CpuKernels k);  // "reference", "fast"
// The kernels a CLI `--device` value selects: reference for "cpu-ref", else fast.
CpuKernels cpu_kernels_for(const std::string& device);
bool cuda_available();
int cuda_device_count();  // 0 without a usable GPU
// The GPU this process runs on (0 unless set): each data-parallel rank on a machine uses its
// own (its local rank), seeing every GPU, as NCCL needs for its peer-to-peer paths. Set it
// before the first CUDA use (it also becomes the calling thread's current device); an Error
// when the index is not a device of this machine.
void use_cuda_device(int index);
int cuda_device();
// `fusebox run --autotune`: the CUDA backend times cuDNN's candidate plans for each convolution
// problem it plans from now on and keeps the fastest, as FUSEBOX_AUTOTUNE=1 would (false: never;
// nullopt: FUSEBOX_AUTOTUNE decides again). Process-wide.
void set_conv_autotune(std::optional<bool> autotune);

using NamedTensors = std::map<std::string, Tensor>;

struct RunOptions {
  Device device = Device::cpu;
  CpuKernels cpu_kernels = CpuKernels::reference;
  bool poison_outputs = true;  // fill each node's outputs with NaN bytes before it runs
};

// Compiles `g` (fusebox/runtime/executable.h) and runs it once: feeds every graph input
// by name (dtype and shape must match exactly; a missing, extra or mismatched feed is an
// Error naming the input) and returns the graph outputs by name. A graph run many times
// should be compiled once instead.
NamedTensors run_graph(const Graph& g, const NamedTensors& feeds, const RunOptions& opts = {});

}  // namespace fusebox
