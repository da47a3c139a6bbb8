#include "kernel_bench.h"

#include <algorithm>
#include <cstdlib>
#include <random>

#include "backends/cuda/runtime/settings.h"

namespace fusebox::bench {

Table::Columns Bandwidth::columns() {
  return {{"us", 10}, {"GB/s", 8}, {"copy", 8}, {"% copy", 8}};
}

Cells Bandwidth::cells() const {
  return {fixed(us, 1), fixed(gbps, 0), fixed(copy_gbps, 0), fixed(pct_copy(), 1) + "%"};
}

Json Bandwidth::appended_to(Json row) const {
  row.set("us", us).set("gbps", gbps).set("copy_gbps", copy_gbps).set("pct_copy", pct_copy());
  return row;
}

void set_setting(const char* name, const char* value) {
  if (value != nullptr)
    setenv(name, value, 1);
  else
    unsetenv(name);
  cuda::reread_settings();
}

Tensor random_host(DType dtype, const Shape& shape, uint64_t seed, double lo, double hi) {
  Tensor host = Tensor::empty(DType::f32, shape);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist{float(lo), float(hi)};
  float* p = host.data<float>();
  for (int64_t i = 0; i < host.numel(); ++i) p[i] = dist(rng);
  return host.cast(dtype);
}

cuda::CommandEncoder::Options KernelBench::direct_launches() {
  cuda::CommandEncoder::Options options;
  options.use_graphs = false;
  return options;
}

KernelBench::KernelBench(cuda::CommandEncoder::Options options)
    : device_(cuda::Device::get(0)),
      allocator_(cuda::CachingAllocator::for_device(0)),
      encoder_(device_, options, &allocator_),
      ctx_{device_, encoder_, allocator_} {}

KernelBench::~KernelBench() {
  encoder_.synchronize();
}

cuda::DeviceTensor KernelBench::upload(const Tensor& host, MemoryFormat format) {
  cuda::DeviceTensor d = cuda::DeviceTensor::empty(allocator_, host.dtype(), host.shape(), format);
  encoder_.copy_to_device(d.range(), host.raw());
  return d;
}

cuda::DeviceTensor KernelBench::empty(DType dtype, const Shape& shape, MemoryFormat format) {
  return cuda::DeviceTensor::empty(allocator_, dtype, shape, format);
}

Bandwidth KernelBench::bandwidth(const TimingOptions& timing, size_t bytes, double us,
                                 size_t rotation_bytes) {
  return {us, double(bytes) / us / 1e3, copy_gbps(timing, bytes, rotation_bytes)};
}

double KernelBench::copy_gbps(const TimingOptions& timing, size_t bytes, size_t rotation_bytes) {
  auto [it, fresh] = copy_cache_.try_emplace(bytes, 0.0);
  if (!fresh) return it->second;
  const size_t half = bytes / 2;
  const size_t copies = std::max<size_t>(1, rotation_bytes / std::max<size_t>(bytes, 1));
  std::vector<cuda::DeviceBuffer> src, dst;
  for (size_t i = 0; i < copies; ++i) {
    src.push_back(allocator_.allocate(half));
    dst.push_back(allocator_.allocate(half));
    encoder_.memset(src.back(), 1);
  }
  const double us = time_us(timing, [&](int i) {
    const size_t k = size_t(i) % copies;
    FUSEBOX_CUDA_CHECK(cudaMemcpyAsync(dst[k].data(), src[k].data(), half, cudaMemcpyDeviceToDevice,
                                       encoder_.stream()));
  });
  it->second = double(2 * half) / us / 1e3;
  return it->second;
}

}  // namespace fusebox::bench
