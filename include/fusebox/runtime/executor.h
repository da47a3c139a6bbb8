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
// "cpu" | "cuda" | "auto" (cuda when a GPU is present and the CUDA backend is built, else cpu).
Device parse_device(const std::string& s);
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
  bool poison_outputs = true;  // fill each node's outputs with NaN bytes before it runs
};

// Compiles `g` (fusebox/runtime/executable.h) and runs it once: feeds every graph input
// by name (dtype and shape must match exactly; a missing, extra or mismatched feed is an
// Error naming the input) and returns the graph outputs by name. A graph run many times
// should be compiled once instead.
NamedTensors run_graph(const Graph& g, const NamedTensors& feeds, const RunOptions& opts = {});

}  // namespace fusebox
