// A fixed pool of worker threads for the CPU backend.
#pragma once

#include <cstdint>
#include <functional>

namespace fusebox {

// Number of threads parallel_for uses: FUSEBOX_NUM_THREADS (at most 256), else the hardware
// count; read at the first call. A value that is not a positive integer is an Error.
int num_threads();

// Runs body(begin, end) over [0, n) split into contiguous chunks of at least
// `grain` items, on the pool and the calling thread. Returns when all chunks
// are done; the first exception thrown by any chunk is rethrown here. Nested
// calls from inside a body run serially.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

}  // namespace fusebox
