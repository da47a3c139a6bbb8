// split_over_threads (backends/cpu_fast/threads.h).
#include "backends/cpu_fast/threads.h"

#include <algorithm>
#include <exception>

#include "fusebox/core/parallel.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace fusebox::cpu_fast {

void split_over_threads(int64_t count, int64_t min_per_thread,
                        const std::function<void(int64_t, int64_t)>& body) {
  if (count <= 0) return;
#if defined(_OPENMP)
  const int threads =
      int(std::clamp<int64_t>(count / std::max<int64_t>(1, min_per_thread), 1, num_threads()));
  if (threads == 1) return body(0, count);
  std::exception_ptr failure;
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    try {
      body(count * t / n, count * (t + 1) / n);
    } catch (...) {
#pragma omp critical
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
#else
  parallel_for(count, std::max<int64_t>(1, min_per_thread), body);
#endif
}

}  // namespace fusebox::cpu_fast
