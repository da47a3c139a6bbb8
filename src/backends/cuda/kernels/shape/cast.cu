// cast and constant on the GPU.
//
// cast: y[i] = convert<To>(x[i]) for every pair of dtypes, with the one conversion rule
// (device/math.cuh, identical to the CPU's): float narrowing rounds to nearest even
// (__float2half_rn, __float2bfloat16_rn; f64 converts directly, without double rounding),
// float -> integer truncates toward zero with NaN -> 0 and saturation, integer -> integer
// wraps, -> bool is (x != 0). x is contiguous (run_node makes it so). Each thread step
// moves W = 16 / max(sizeof(From), sizeof(To)) elements with one aligned load and one
// aligned store (16 bytes on the wider side) when both pointers allow, else one element.
//
// constant: the attribute's host bytes are uploaded once per value (a blocking
// copy into a fresh buffer, at record time: the buffer is new, so no recorded work
// can race with it) and kept in a process-wide cache keyed by the value's host buffer,
// which the cache holds (so the key cannot be reused while cached: constant values are
// immutable in the IR). Each run then records a device-to-device memcpy into the output,
// which a replayed graph repeats at no host cost. The cache drops everything when it holds
// more than 256 MiB (buffers still in use are held by the encoders until their work ends).
#include <map>
#include <mutex>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"
#include "backends/cuda/runtime/check.h"

namespace fusebox::cuda {

namespace {

template <class T, int W>
struct alignas(sizeof(T) * W) Pack {
  T v[W];
};

template <class From, class To>
constexpr int kCastWidth = kVecBytes / int(sizeof(From) > sizeof(To) ? sizeof(From) : sizeof(To));

// W elements per step (W = 1: unaligned pointers).
template <class From, class To, int W>
__global__ void cast_kernel(const From* x, To* y, int64_t n) {
  const int64_t packs = n / W;
  for (int64_t p = global_thread_index(); p < packs; p += grid_stride()) {
    const Pack<From, W> in = reinterpret_cast<const Pack<From, W>*>(x)[p];
    Pack<To, W> out;
#pragma unroll
    for (int j = 0; j < W; ++j) out.v[j] = convert<To>(in.v[j]);
    reinterpret_cast<Pack<To, W>*>(y)[p] = out;
  }
  for (int64_t i = packs * W + global_thread_index(); i < n; i += grid_stride())
    y[i] = convert<To>(x[i]);
}

struct ConstantCache {
  struct Entry {
    Tensor host;  // held: keeps the key's bytes from being freed and reused
    DeviceBuffer device;
  };
  static constexpr size_t kMaxBytes = size_t(256) << 20;
  std::mutex mutex;
  std::map<std::pair<int, const void*>, Entry> entries;
  size_t bytes = 0;
};

ConstantCache& constant_cache() {
  static ConstantCache* cache = new ConstantCache;  // never destroyed: see encoder lifetimes
  return *cache;
}

// The device copy of `value` on ctx's device, uploaded on first use.
DeviceBuffer upload_constant(Context& ctx, const Tensor& value) {
  ConstantCache& cache = constant_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  const auto key = std::make_pair(ctx.device.id(), value.raw());
  auto found = cache.entries.find(key);
  if (found != cache.entries.end()) return found->second.device;
  if (cache.bytes + value.nbytes() > ConstantCache::kMaxBytes) {
    cache.entries.clear();
    cache.bytes = 0;
  }
  DeviceBuffer buffer = ctx.allocator.allocate(value.nbytes());
  DeviceGuard guard(ctx.device.id());
  // A pageable-memory cudaMemcpy may return before the copy lands: wait for its stream.
  FUSEBOX_CUDA_CHECK_AS(cudaMemcpyAsync(buffer.data(), value.raw(), value.nbytes(),
                                        cudaMemcpyHostToDevice, cudaStreamLegacy),
                        cat("cudaMemcpyAsync(", value.nbytes(), " bytes, constant upload)"));
  FUSEBOX_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  cache.entries.emplace(key, ConstantCache::Entry{value, buffer});
  cache.bytes += value.nbytes();
  return buffer;
}

}  // namespace

void cast(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const DeviceTensor& x = *in[0];
  const DeviceTensor& y = out[0];
  FUSEBOX_CHECK(x.is_contiguous() && x.shape == y.shape, node_label(n), "expects a contiguous ",
                shape_str(y.shape), " input, got ", shape_str(x.shape));
  const int64_t count = y.numel();
  if (count == 0) return;
  visit_device_dtype(x.dtype, [&](auto from_tag) {
    using From = decltype(from_tag);
    visit_device_dtype(y.dtype, [&](auto to_tag) {
      using To = decltype(to_tag);
      constexpr int W = kCastWidth<From, To>;
      const From* px = x.as<From>();
      To* py = y.as<To>();
      const BufferList reads{x.range()}, writes{y.range()};
      if (is_aligned(px, sizeof(From) * W) && is_aligned(py, sizeof(To) * W))
        ctx.encoder.launch(cast_kernel<From, To, W>, launch_blocks(count / W + 1), kDefaultThreads,
                           0, reads, writes, px, py, count);
      else
        ctx.encoder.launch(cast_kernel<From, To, 1>, launch_blocks(count), kDefaultThreads, 0,
                           reads, writes, px, py, count);
    });
  });
}

void constant(Context& ctx, const Node& n, Inputs /*in*/, Outputs out) {
  const Tensor& value = std::get<ConstantAttrs>(n.attrs).value;
  const DeviceTensor& y = out[0];
  FUSEBOX_CHECK(value.defined() && value.dtype() == y.dtype && value.shape() == y.shape,
                node_label(n), "value does not match the output type ", dtype_name(y.dtype),
                shape_str(y.shape));
  if (y.nbytes() == 0) return;
  DeviceBuffer source = upload_constant(ctx, value);
  ctx.encoder.memcpy(y.range(), BufferRange(source, 0, y.nbytes()));
}

}  // namespace fusebox::cuda
