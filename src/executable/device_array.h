// What a DeviceArray and a PendingTensor hold, for the executables (runtime/*.cpp).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "backends/cuda/runtime/context.h"
#include "backends/cuda/runtime/error_flags.h"
#include "backends/cuda/runtime/pinned.h"
#include "backends/cuda/runtime/tensor.h"
#include "fusebox/runtime/executable.h"

namespace fusebox {

struct DeviceArray::Storage {
  Device device = Device::cpu;
  DType dtype = DType::f32;
  Shape shape;
  // CPU: the tensor (replaced, never written, when an executable updates it).
  Tensor host;
  // CUDA: dense, contiguous or channels-last (an executable keeps state in the order its
  // step computes it in); DeviceArray converts on the way to and from the host.
  cuda::DeviceTensor tensor;
};

// A compiled training step's halt word (cuda/runtime/error_flags.h): set by a kernel that
// finds a bad label, it stops every state update from that run on. Once the error has been
// reported the word is cleared, and the runs it stopped are counted (ExecutableStats).
struct HaltState {
  cuda::DeviceBuffer word;
  int64_t issued = 0;       // runs issued so far (a run's index is its number among them)
  int64_t not_applied = 0;  // runs whose state updates the word stopped, once reported
};
// After run `index` reported an error: waits for every run issued, and when the halt word
// is set clears it, counts the runs it stopped and returns a note for the error's message
// (else "").
std::string release_halt(HaltState& halt, int64_t index);

// The checks of one run's kernel error records: its pinned copy of them and the fence
// after the copy. Shared by the run's pending outputs and the executable.
struct RunCheck {
  std::shared_ptr<const cuda::ErrorFlags::Reserved> reserved;  // null: nothing to check
  std::shared_ptr<cuda::PinnedSlot> records;
  cuda::Fence fence;
  std::string label;                // prefixes an error's message ("step 12")
  std::shared_ptr<HaltState> halt;  // null: the executable updates no state in place
  int64_t index = 0;                // the run's number (HaltState::issued)
  bool checked = false;
  // Waits for the run and throws the first raised record's Error (once).
  void check();
};

struct PendingTensor::State {
  // CPU: the value, already there.
  std::optional<Tensor> value;
  // CUDA: the pinned copy, the run's check, and the type to rebuild.
  std::shared_ptr<cuda::PinnedSlot> slot;
  std::shared_ptr<RunCheck> run;
  cuda::Fence copied;  // after the copy, where it ran on the readback stream (else empty)
  DType dtype = DType::f32;
  Shape shape;
};

namespace runtime {

// The process's GPU 0: its encoder and allocator (what every CUDA executable records on).
cuda::Context cuda_context();
cuda::DeviceTensor upload(cuda::Context& ctx, const Tensor& t);
// A host copy in the logical (row-major) order, whatever the tensor's strides (blocking).
Tensor download(cuda::Context& ctx, const cuda::DeviceTensor& t);
// Storage for a CUDA tensor / a CPU tensor of this type (not yet filled: host undefined).
std::shared_ptr<DeviceArray::Storage> cuda_storage(cuda::DeviceTensor t);
std::shared_ptr<DeviceArray::Storage> cpu_storage(DType dtype, Shape shape);
// Whether `p` is page-locked host memory (cudaMallocHost / cudaHostRegister).
bool is_pinned(const void* p);

}  // namespace runtime
}  // namespace fusebox
