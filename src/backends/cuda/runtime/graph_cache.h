// Executable CUDA graphs reused across commits that share a topology.
//
// The key is a topology string (built by the CommandEncoder, or by graph_topology() for a
// graph recorded elsewhere): node kinds, kernel functions, launch dimensions, memset and
// memcpy sizes, child-graph topologies and edges; never pointers or argument values. A
// repeated step with new pointers and values therefore finds its exec and only updates it.
//
//   GraphCache cache(64);
//   cudaGraphExec_t exec = cache.prepare(key, graph);   // update, or instantiate
//   cudaGraphLaunch(exec, stream);
//
// Not thread-safe: one cache per encoder.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <string_view>
#include <unordered_map>

namespace fusebox::cuda {

class GraphCache {
 public:
  enum class Outcome {
    instantiated,    // key not cached: a new exec
    updated,         // key cached: cudaGraphExecUpdate accepted the new graph
    reinstantiated,  // key cached, update refused: a new exec replaced the entry
  };
  struct Stats {
    uint64_t lookups = 0;
    uint64_t hits = 0;  // updated + refused
    uint64_t misses = 0;
    uint64_t updates = 0;         // successful cudaGraphExecUpdate
    uint64_t refusals = 0;        // refused updates (each re-instantiated)
    uint64_t instantiations = 0;  // misses + refusals
    uint64_t evictions = 0;
    uint64_t warnings = 0;  // miss-rate warnings printed
  };

  // capacity 0 caches nothing (every commit instantiates). When at least
  // `warn_every_instantiations` instantiations happened since the last check and they are
  // most of the lookups in that window, one warning goes to stderr (0 disables it).
  explicit GraphCache(size_t capacity, size_t warn_every_instantiations = 100);
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // An exec ready to run `graph` (see Outcome). The exec belongs to the cache and stays
  // valid until the next prepare() or the cache's destruction; destroying one whose launch
  // is still running is safe (the driver frees it when that launch completes).
  cudaGraphExec_t prepare(std::string_view key, cudaGraph_t graph, Outcome* outcome = nullptr);

  size_t size() const { return entries_.size(); }
  size_t capacity() const { return capacity_; }
  bool contains(std::string_view key) const { return index_.count(key) != 0; }
  const Stats& stats() const { return stats_; }

 private:
  struct Entry {
    std::string key;
    cudaGraphExec_t exec;
  };
  static cudaGraphExec_t instantiate(cudaGraph_t graph);
  void note_instantiation();

  size_t capacity_;
  size_t warn_every_;
  std::list<Entry> entries_;  // most recently used first
  std::unordered_map<std::string_view, std::list<Entry>::iterator> index_;  // views of keys
  cudaGraphExec_t uncached_ = nullptr;  // the last exec when capacity_ is 0
  Stats stats_;
  uint64_t window_lookups_ = 0;
  uint64_t window_instantiations_ = 0;
};

// Appends `value`'s bytes to a topology key.
template <class T>
void append_key(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// The topology of a graph built elsewhere (a stream capture): each node's kind, with the
// kernel function and launch dimensions, memset and memcpy sizes, and child graphs
// recursively, then the edges as node ordinals.
std::string graph_topology(cudaGraph_t graph);

}  // namespace fusebox::cuda
