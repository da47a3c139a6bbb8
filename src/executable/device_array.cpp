#include "executable/device_array.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "backends/cuda/kernels.h"
#include "executable/io_plan.h"

namespace fusebox {
namespace runtime {

cuda::Context cuda_context() {
  const int device = cuda_device();
  return cuda::Context{cuda::Device::get(device), cuda::CommandEncoder::for_device(device),
                       cuda::CachingAllocator::for_device(device)};
}

cuda::DeviceTensor upload(cuda::Context& ctx, const Tensor& t) {
  cuda::DeviceTensor d = cuda::DeviceTensor::empty(ctx.allocator, t.dtype(), t.shape());
  if (t.nbytes() > 0) ctx.encoder.copy_to_device(d.buffer, t.raw());
  return d;
}

Tensor download(cuda::Context& ctx, const cuda::DeviceTensor& d) {
  Tensor t = Tensor::empty(d.dtype, d.shape);
  if (t.nbytes() == 0) return t;
  if (d.is_contiguous()) {
    ctx.encoder.copy_to_host(
        t.raw(), cuda::BufferRange(d.buffer, size_t(d.offset) * dtype_size(d.dtype), t.nbytes()));
    return t;
  }
  cuda::DeviceTensor c = cuda::DeviceTensor::empty(ctx.allocator, d.dtype, d.shape);
  cuda::copy_strided(ctx, d, c);
  ctx.encoder.copy_to_host(t.raw(), c.buffer);
  return t;
}

std::shared_ptr<DeviceArray::Storage> cuda_storage(cuda::DeviceTensor t) {
  auto s = std::make_shared<DeviceArray::Storage>();
  s->device = Device::cuda;
  s->dtype = t.dtype;
  s->shape = t.shape;
  s->tensor = std::move(t);
  return s;
}

std::shared_ptr<DeviceArray::Storage> cpu_storage(DType dtype, Shape shape) {
  auto s = std::make_shared<DeviceArray::Storage>();
  s->device = Device::cpu;
  s->dtype = dtype;
  s->shape = std::move(shape);
  return s;
}

bool is_pinned(const void* p) {
  if (p == nullptr || !cuda_available()) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    (void)cudaGetLastError();  // not a pointer CUDA knows: pageable
    return false;
  }
  return attributes.type == cudaMemoryTypeHost;
}

}  // namespace runtime

Tensor pinned_host_tensor(DType dtype, const Shape& shape) {
  if (!cuda_available()) return Tensor::empty(dtype, shape);
  return Tensor::adopt(dtype, shape,
                       cuda::allocate_pinned(size_t(numel(shape)) * dtype_size(dtype)));
}

namespace {

void check_cuda_present(const char* what) {
  FUSEBOX_CHECK(cuda_available(), what, "no CUDA device is available on this machine");
}

}  // namespace

DeviceArray DeviceArray::empty(DType dtype, const Shape& shape, Device device) {
  if (device == Device::cpu) {
    auto s = runtime::cpu_storage(dtype, shape);
    s->host = Tensor::empty(dtype, shape);
    return DeviceArray(std::move(s));
  }
  check_cuda_present("device array");
  cuda::Context ctx = runtime::cuda_context();
  return DeviceArray(runtime::cuda_storage(cuda::DeviceTensor::empty(ctx.allocator, dtype, shape)));
}

DeviceArray DeviceArray::upload(const Tensor& t, Device device) {
  DeviceArray a = empty(t.dtype(), t.shape(), device);
  a.copy_from(t);
  return a;
}

Device DeviceArray::device() const {
  return storage_->device;
}
DType DeviceArray::dtype() const {
  return storage_->dtype;
}
const Shape& DeviceArray::shape() const {
  return storage_->shape;
}
size_t DeviceArray::nbytes() const {
  return size_t(numel(shape())) * dtype_size(dtype());
}

Tensor DeviceArray::to_host() const {
  FUSEBOX_CHECK(defined(), "device array", "to_host of an empty array");
  if (storage_->device == Device::cpu) {
    FUSEBOX_CHECK(storage_->host.defined(), "device array", "to_host of an array never filled");
    return storage_->host;  // never written in place
  }
  cuda::Context ctx = runtime::cuda_context();
  return runtime::download(ctx, storage_->tensor);
}

void DeviceArray::copy_from(const Tensor& t) const {
  FUSEBOX_CHECK(defined(), "device array", "copy_from into an empty array");
  FUSEBOX_CHECK(t.dtype() == dtype() && t.shape() == shape(), "device array", "cannot copy ",
                runtime::type_str(t.dtype(), t.shape()), " into an array of ",
                runtime::type_str(dtype(), shape()));
  if (storage_->device == Device::cpu) {
    storage_->host = t.clone();
    return;
  }
  cuda::Context ctx = runtime::cuda_context();
  const cuda::DeviceTensor& d = storage_->tensor;
  if (d.is_contiguous()) {
    if (t.nbytes() > 0) ctx.encoder.copy_to_device(d.range(), t.raw());
    return;
  }
  cuda::copy_strided(ctx, runtime::upload(ctx, t), d);
  ctx.encoder.commit();
}

DeviceArray DeviceArray::clone() const {
  if (storage_->device == Device::cpu) return DeviceArray::upload(storage_->host, Device::cpu);
  cuda::Context ctx = runtime::cuda_context();
  auto s = runtime::cuda_storage(cuda::DeviceTensor::empty(ctx.allocator, dtype(), shape()));
  cuda::copy_strided(ctx, storage_->tensor, s->tensor);
  ctx.encoder.commit();
  return DeviceArray(std::move(s));
}

std::string release_halt(HaltState& halt, int64_t index) {
  cuda::Context ctx = runtime::cuda_context();
  // The runs issued after this one read the word too: all must be done before it clears.
  FUSEBOX_CUDA_CHECK(cudaStreamSynchronize(ctx.encoder.stream()));
  int32_t word = 0;
  FUSEBOX_CUDA_CHECK(cudaMemcpy(&word, halt.word.data(), sizeof word, cudaMemcpyDeviceToHost));
  if (word == 0) return "";
  FUSEBOX_CUDA_CHECK(cudaMemset(halt.word.data(), 0, sizeof word));
  const int64_t later = std::max<int64_t>(halt.issued - index - 1, 0);
  halt.not_applied += 1 + later;
  return later == 0
             ? "; the training state is kept as it was before this run (not applied)"
             : cat("; the training state is kept as it was before this run: it and the ", later,
                   later == 1 ? " run" : " runs", " queued after it were not applied");
}

void RunCheck::check() {
  if (checked) return;
  fence.wait();
  checked = true;
  if (!reserved || reserved->pending.empty()) return;
  const auto* raised = reinterpret_cast<const cuda::ErrorRecord*>(records->bytes.get());
  if (!halt) return cuda::ErrorFlags::throw_first_raised(*reserved, raised, label);
  try {
    cuda::ErrorFlags::throw_first_raised(*reserved, raised, label);
  } catch (const Error& e) {
    throw Error(e.where(), runtime::error_message(e) + release_halt(*halt, index));
  }
}

bool PendingTensor::ready() const {
  if (state_->value) return true;
  return state_->run->fence.done() && state_->copied.done();
}

// At or past this size get() hands over the pinned copy itself rather than copying it.
constexpr size_t kAdoptPinnedBytes = size_t(1) << 20;

Tensor PendingTensor::get() const {
  FUSEBOX_CHECK(defined(), "pending tensor", "get() of an empty handle");
  if (state_->value) return *state_->value;
  state_->run->check();
  state_->copied.wait();
  Tensor t;
  const size_t nbytes = size_t(numel(state_->shape)) * dtype_size(state_->dtype);
  if (nbytes >= kAdoptPinnedBytes) {
    // The pinned copy itself, no second copy (a 3 GB f32 logits tensor took ~1 s to copy
    // into fresh pageable memory): the tensor keeps the slot, so the pool does not hand it
    // out again until the last handle goes.
    std::shared_ptr<std::byte[]> bytes(state_->slot, state_->slot->bytes.get());
    t = Tensor::adopt(state_->dtype, state_->shape, std::move(bytes));
  } else {
    // Small outputs (a loss, a batch of class scores) are copied: a caller that keeps every
    // step's loss would otherwise hold a pinned slot per step.
    t = Tensor::empty(state_->dtype, state_->shape);
    if (nbytes > 0) std::memcpy(t.raw(), state_->slot->bytes.get(), nbytes);
  }
  state_->value = t;
  state_->slot.reset();  // back to the pool (or held by the tensor, above)
  return t;
}

}  // namespace fusebox
