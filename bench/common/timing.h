// Timing the benchmarks share: GPU time between two CUDA events, the median of repeated
// runs, and host wall time.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <vector>

#include "backends/cuda/runtime/check.h"

namespace fusebox::bench {

// --iters and --repeats: each timed run makes `iters` calls; the median of `repeats` runs.
struct TimingOptions {
  int iters = 20;
  int repeats = 5;
};

// The GPU time of the work a call issues on a stream, between two CUDA events.
class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  // Milliseconds between an event recorded on `stream` before issue() and one after it;
  // waits for the second.
  template <class Issue>
  double ms(cudaStream_t stream, Issue&& issue) {
    FUSEBOX_CUDA_CHECK(cudaEventRecord(start_, stream));
    issue();
    FUSEBOX_CUDA_CHECK(cudaEventRecord(stop_, stream));
    return wait_ms();
  }

 private:
  double wait_ms();

  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// The upper median (the middle after sorting; of an even count, the larger of the two), as
// the benchmarks have always reported, so that figures stay comparable across runs.
double median(std::vector<double> samples);

// Host wall time since construction or the last lap.
class Stopwatch {
 public:
  double us() const {
    return std::chrono::duration<double, std::micro>(Clock::now() - start_).count();
  }
  double ms() const { return us() / 1e3; }
  double seconds() const { return us() / 1e6; }
  // us(), then starts again: for adding up the parts of a loop.
  double lap_us() {
    const double elapsed = us();
    start_ = Clock::now();
    return elapsed;
  }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_ = Clock::now();
};

}  // namespace fusebox::bench
