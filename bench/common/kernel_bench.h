// What the kernel benchmarks share: a kernel Context on device 0, random host data, CUDA-event
// timing (direct launches, or a replayed graph) and the device-to-device copy bandwidth the
// results are compared with.
#pragma once

#include <chrono>
#include <map>
#include <vector>

#include "backends/cuda/kernels.h"
#include "report.h"
#include "table.h"
#include "timing.h"

namespace fusebox::bench {

// A bandwidth-bound op's time against the device's copy bandwidth for the same bytes.
struct Bandwidth {
  double us = 0;         // per call
  double gbps = 0;       // bytes read + written per second
  double copy_gbps = 0;  // cudaMemcpy device-to-device of the same bytes

  double pct_copy() const { return 100.0 * gbps / copy_gbps; }
  static Table::Columns columns();  // us, GB/s, copy, % copy
  Cells cells() const;
  // `row` followed by us, gbps, copy_gbps and pct_copy (the keys the results scripts read).
  Json appended_to(Json row) const;
};

// Uniform [lo, hi) values in `dtype`, generated on the host (never zeros).
Tensor random_host(DType dtype, const Shape& shape, uint64_t seed, double lo, double hi);

// Sets (value non-null) or unsets environment variable `name` and has the CUDA backend read its
// settings again (they are read once per process): a knob changed between timed runs.
void set_setting(const char* name, const char* value);

class KernelBench {
 public:
  // Direct launches (no graph), so that the events bracket only GPU work (each launch takes far
  // less host time than the kernel runs); replay_us needs an encoder that records graphs.
  static cuda::CommandEncoder::Options direct_launches();

  explicit KernelBench(cuda::CommandEncoder::Options options = direct_launches());
  ~KernelBench();
  KernelBench(const KernelBench&) = delete;
  KernelBench& operator=(const KernelBench&) = delete;

  cuda::Context& ctx() { return ctx_; }
  cuda::CommandEncoder& encoder() { return encoder_; }
  const cuda::DeviceProperties& properties() const { return device_.properties(); }

  // `host` in a fresh device tensor of `format`; the values' order in memory does not matter
  // to the timing, so the host data is uploaded as it lies.
  cuda::DeviceTensor upload(const Tensor& host, MemoryFormat format = MemoryFormat::contiguous);
  cuda::DeviceTensor empty(DType dtype, const Shape& shape,
                           MemoryFormat format = MemoryFormat::contiguous);

  // Median microseconds per call of body(i) over `repeats` timed runs of `iters` calls.
  template <class Body>
  double time_us(const TimingOptions& timing, Body&& body) {
    // Warm-up: module load, occupancy queries, and the clocks, which drop while the host
    // makes a shape's inputs (the first case timed after that once ran 5% slow): calls until
    // 50 ms have passed, at least 3.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    for (int i = 0; i < 3 || std::chrono::steady_clock::now() < until; ++i) {
      body(i);
      if (i % 8 == 7) encoder_.synchronize();
    }
    encoder_.synchronize();
    std::vector<double> per_call;
    for (int r = 0; r < timing.repeats; ++r) {
      const double ms = timer_.ms(encoder_.stream(), [&] {
        for (int i = 0; i < timing.iters; ++i) body(i);
        encoder_.commit();
      });
      per_call.push_back(1000.0 * ms / timing.iters);
      encoder_.synchronize();  // release what the launches held
    }
    return median(per_call);
  }

  // Median microseconds per call of record() (one call of the op), `iters` calls recorded
  // into one graph, replayed once to warm up, then `repeats` times between events.
  template <class Record>
  double replay_us(const TimingOptions& timing, Record&& record) {
    encoder_.synchronize();
    for (int i = 0; i < timing.iters; ++i) record();
    const cuda::RecordedGraph graph = encoder_.finish_recording();
    encoder_.replay(graph);
    encoder_.synchronize();
    std::vector<double> per_call;
    for (int r = 0; r < timing.repeats; ++r) {
      const double ms = timer_.ms(encoder_.stream(), [&] { encoder_.replay(graph); });
      per_call.push_back(1000.0 * ms / timing.iters);
    }
    encoder_.synchronize();
    return median(per_call);
  }

  // `us` for `bytes` of traffic (read + written), and the copy bandwidth for as many bytes.
  // With rotation_bytes, the copy rotates over as many buffer pairs as fit in it, as a
  // benchmark rotating its operands past the L2 does.
  Bandwidth bandwidth(const TimingOptions& timing, size_t bytes, double us,
                      size_t rotation_bytes = 0);

 private:
  // Measured once per byte count.
  double copy_gbps(const TimingOptions& timing, size_t bytes, size_t rotation_bytes);

  cuda::Device& device_;
  cuda::CachingAllocator& allocator_;
  cuda::CommandEncoder encoder_;
  cuda::Context ctx_;
  EventTimer timer_;
  std::map<size_t, double> copy_cache_;
};

}  // namespace fusebox::bench
