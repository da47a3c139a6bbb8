// How the fast CPU kernels of the project's own (the pointwise block interpreter, the tiled
// copies) split their work across threads.
#pragma once

#include <cstdint>
#include <functional>

namespace fusebox::cpu_fast {

// Runs body(first, last) over [0, count) split evenly over at most num_threads() threads,
// each with at least `min_per_thread` items (one thread runs it all below twice that). Where
// the build has OpenMP, on OpenMP's threads: libgomp is the runtime of oneDNN's threads, and
// fusebox's own pool woke threads that competed with OpenMP's workers still spinning after a
// convolution (libgomp was 31% of MobileNetV3-S's batch-1 profile); else on parallel_for's
// pool. The first exception a thread throws is rethrown.
void split_over_threads(int64_t count, int64_t min_per_thread,
                        const std::function<void(int64_t, int64_t)>& body);

}  // namespace fusebox::cpu_fast
