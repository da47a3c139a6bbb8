// What the kernel benchmarks (bench_norms, bench_batch_norm) share: a kernel Context on
// device 0 whose encoder launches directly, random host data, CUDA-event timing and the
// device-to-device copy bandwidth the results are compared with.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <vector>

#include "backends/cuda/check.h"
#include "backends/cuda/kernels.h"

namespace fusebox::cuda::bench {

// Uniform [lo, hi) values in `dtype`, generated on the host (never zeros).
inline Tensor random_host(DType dtype, const Shape& shape, uint64_t seed, double lo, double hi) {
  Tensor host = Tensor::empty(DType::f32, shape);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist{float(lo), float(hi)};
  float* p = host.data<float>();
  for (int64_t i = 0; i < host.numel(); ++i) p[i] = dist(rng);
  return host.cast(dtype);
}

class KernelBench {
 public:
  KernelBench()
      : device_(Device::get(0)),
        allocator_(CachingAllocator::for_device(0)),
        encoder_(device_, direct_launches(), &allocator_),
        ctx_{device_, encoder_, allocator_} {
    FUSEBOX_CUDA_CHECK(cudaEventCreate(&start_));
    FUSEBOX_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~KernelBench() {
    encoder_.synchronize();
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }

  Context& ctx() { return ctx_; }
  const DeviceProperties& properties() const { return device_.properties(); }

  // `host` in a fresh device tensor of `format`; the values' order in memory does not
  // matter to the timing, so the host data is uploaded as it lies.
  DeviceTensor upload(const Tensor& host, MemoryFormat format = MemoryFormat::contiguous) {
    DeviceTensor d = DeviceTensor::empty(allocator_, host.dtype(), host.shape(), format);
    encoder_.copy_to_device(d.range(), host.raw());
    return d;
  }
  DeviceTensor empty(DType dtype, const Shape& shape,
                     MemoryFormat format = MemoryFormat::contiguous) {
    return DeviceTensor::empty(allocator_, dtype, shape, format);
  }

  // Median microseconds per call of body(i) over `repeats` timed runs of `iters` calls.
  template <class Body>
  double time_us(int iters, int repeats, Body&& body) {
    // Warm-up: module load, occupancy queries, and the clocks, which drop while the host
    // makes a shape's inputs (the first case timed after that once ran 5% slow): calls until
    // 50 ms have passed, at least 3.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    for (int i = 0; i < 3 || std::chrono::steady_clock::now() < until; ++i) {
      body(i);
      if (i % 8 == 7) encoder_.synchronize();
    }
    encoder_.synchronize();
    std::vector<double> per_iter;
    for (int r = 0; r < repeats; ++r) {
      FUSEBOX_CUDA_CHECK(cudaEventRecord(start_, encoder_.stream()));
      for (int i = 0; i < iters; ++i) body(i);
      encoder_.commit();
      FUSEBOX_CUDA_CHECK(cudaEventRecord(stop_, encoder_.stream()));
      FUSEBOX_CUDA_CHECK(cudaEventSynchronize(stop_));
      float ms = 0;
      FUSEBOX_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
      per_iter.push_back(1000.0 * ms / iters);
      encoder_.synchronize();  // release what the launches held
    }
    std::sort(per_iter.begin(), per_iter.end());
    return per_iter[per_iter.size() / 2];
  }

  // Device-to-device copy bandwidth (read + write) for `bytes` of traffic, measured once per
  // byte count. With rotation_bytes, the copy rotates over as many buffer pairs as fit in
  // it, as a benchmark rotating its operands past the L2 does.
  double copy_gbps(int iters, int repeats, size_t bytes, size_t rotation_bytes = 0) {
    auto [it, fresh] = copy_cache_.try_emplace(bytes, 0.0);
    if (!fresh) return it->second;
    const size_t half = bytes / 2;
    const size_t copies = std::max<size_t>(1, rotation_bytes / std::max<size_t>(bytes, 1));
    std::vector<DeviceBuffer> src, dst;
    for (size_t i = 0; i < copies; ++i) {
      src.push_back(allocator_.allocate(half));
      dst.push_back(allocator_.allocate(half));
      encoder_.memset(src.back(), 1);
    }
    const double us = time_us(iters, repeats, [&](int i) {
      const size_t k = size_t(i) % copies;
      FUSEBOX_CUDA_CHECK(cudaMemcpyAsync(dst[k].data(), src[k].data(), half,
                                         cudaMemcpyDeviceToDevice, encoder_.stream()));
    });
    it->second = double(2 * half) / us / 1e3;
    return it->second;
  }

 private:
  static CommandEncoder::Options direct_launches() {
    CommandEncoder::Options options;
    options.use_graphs = false;
    return options;
  }

  Device& device_;
  CachingAllocator& allocator_;
  CommandEncoder encoder_;
  Context ctx_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  std::map<size_t, double> copy_cache_;
};

}  // namespace fusebox::cuda::bench
