#include "timing.h"

#include <algorithm>

#include "fusebox/core/error.h"

namespace fusebox::bench {

EventTimer::EventTimer() {
  FUSEBOX_CUDA_CHECK(cudaEventCreate(&start_));
  FUSEBOX_CUDA_CHECK(cudaEventCreate(&stop_));
}

EventTimer::~EventTimer() {
  (void)cudaEventDestroy(start_);
  (void)cudaEventDestroy(stop_);
}

double EventTimer::wait_ms() {
  FUSEBOX_CUDA_CHECK(cudaEventSynchronize(stop_));
  float ms = 0;
  FUSEBOX_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
  return double(ms);
}

double median(std::vector<double> samples) {
  FUSEBOX_CHECK(!samples.empty(), "bench timing", "median of no samples");
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace fusebox::bench
