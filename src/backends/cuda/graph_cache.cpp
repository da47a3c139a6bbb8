#include "backends/cuda/graph_cache.h"

#include <cstdio>
#include <vector>

#include "backends/cuda/check.h"
#include "fusebox/core/error.h"

namespace fusebox::cuda {

GraphCache::GraphCache(size_t capacity, size_t warn_every_instantiations)
    : capacity_(capacity), warn_every_(warn_every_instantiations) {}

GraphCache::~GraphCache() {
  // Status ignored: a destructor must not throw.
  for (Entry& entry : entries_) (void)cudaGraphExecDestroy(entry.exec);
  if (uncached_ != nullptr) (void)cudaGraphExecDestroy(uncached_);
}

cudaGraphExec_t GraphCache::instantiate(cudaGraph_t graph) {
  size_t nodes = 0;
  FUSEBOX_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  cudaGraphExec_t exec = nullptr;
  FUSEBOX_CUDA_CHECK_AS(cudaGraphInstantiate(&exec, graph, 0),
                        cat("cudaGraphInstantiate(graph of ", nodes, " nodes)"));
  return exec;
}

cudaGraphExec_t GraphCache::prepare(std::string_view key, cudaGraph_t graph, Outcome* outcome) {
  Outcome result = Outcome::instantiated;
  ++stats_.lookups;
  ++window_lookups_;
  cudaGraphExec_t exec = nullptr;
  auto found = index_.find(key);
  if (found != index_.end()) {
    ++stats_.hits;
    entries_.splice(entries_.begin(), entries_, found->second);  // now most recent
    Entry& entry = entries_.front();
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(entry.exec, graph, &info) == cudaSuccess) {
      ++stats_.updates;
      result = Outcome::updated;
    } else {
      // Refused (the topology key cannot capture every rule of the update). The exec is
      // unchanged; replace it. A sticky error would resurface in instantiate() below.
      (void)cudaGetLastError();
      ++stats_.refusals;
      cudaGraphExec_t fresh = instantiate(graph);
      (void)cudaGraphExecDestroy(entry.exec);
      entry.exec = fresh;
      note_instantiation();
      result = Outcome::reinstantiated;
    }
    exec = entry.exec;
  } else {
    ++stats_.misses;
    exec = instantiate(graph);
    note_instantiation();
    if (capacity_ == 0) {
      if (uncached_ != nullptr) (void)cudaGraphExecDestroy(uncached_);
      uncached_ = exec;
    } else {
      entries_.push_front(Entry{std::string(key), exec});
      index_.emplace(entries_.front().key, entries_.begin());
      while (entries_.size() > capacity_) {
        index_.erase(entries_.back().key);
        (void)cudaGraphExecDestroy(entries_.back().exec);
        entries_.pop_back();
        ++stats_.evictions;
      }
    }
  }
  if (outcome != nullptr) *outcome = result;
  return exec;
}

void GraphCache::note_instantiation() {
  ++stats_.instantiations;
  ++window_instantiations_;
  if (warn_every_ == 0 || window_instantiations_ < warn_every_) return;
  // Most commits in this window paid for an instantiation: the cache is not working.
  // A warning, never an error: the results are still right, only slower.
  if (2 * window_instantiations_ > window_lookups_) {
    ++stats_.warnings;
    std::fprintf(stderr,
                 "[cuda] graph cache: %llu of the last %llu commits had to instantiate a "
                 "graph (cache capacity %zu); the graph topologies vary more than the cache "
                 "holds. Raise FUSEBOX_CUDA_GRAPH_CACHE, or make steps more uniform.\n",
                 static_cast<unsigned long long>(window_instantiations_),
                 static_cast<unsigned long long>(window_lookups_), capacity_);
  }
  window_instantiations_ = 0;
  window_lookups_ = 0;
}

namespace {

void append_topology(std::string& key, cudaGraph_t graph) {
  size_t count = 0;
  FUSEBOX_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  if (count > 0) FUSEBOX_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  std::unordered_map<cudaGraphNode_t, uint32_t> ordinal;
  append_key(key, uint32_t(count));
  for (size_t i = 0; i < count; ++i) {
    cudaGraphNode_t node = nodes[i];
    ordinal.emplace(node, uint32_t(i));
    cudaGraphNodeType type{};
    FUSEBOX_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    append_key(key, uint8_t(type));
    if (type == cudaGraphNodeTypeKernel) {
      cudaKernelNodeParams params{};
      // Kernels launched through the driver API (by a library) may not map back to a
      // runtime function; then the node is keyed by its kind only, and an update that
      // cannot follow the change is refused and re-instantiated.
      if (cudaGraphKernelNodeGetParams(node, &params) == cudaSuccess) {
        append_key(key, reinterpret_cast<uintptr_t>(params.func));
        append_key(key, params.gridDim);
        append_key(key, params.blockDim);
        append_key(key, params.sharedMemBytes);
      } else {
        (void)cudaGetLastError();
        append_key(key, '?');
      }
    } else if (type == cudaGraphNodeTypeMemset) {
      cudaMemsetParams params{};
      FUSEBOX_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &params));
      append_key(key, params.elementSize);
      append_key(key, params.width);
      append_key(key, params.height);
    } else if (type == cudaGraphNodeTypeMemcpy) {
      cudaMemcpy3DParms params{};
      FUSEBOX_CUDA_CHECK(cudaGraphMemcpyNodeGetParams(node, &params));
      append_key(key, params.extent);
      append_key(key, params.kind);
    } else if (type == cudaGraphNodeTypeGraph) {
      cudaGraph_t child = nullptr;
      FUSEBOX_CUDA_CHECK(cudaGraphChildGraphNodeGetGraph(node, &child));
      key += '(';
      append_topology(key, child);
      key += ')';
    }
  }
  size_t edge_count = 0;
  FUSEBOX_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edge_count));
  // Edge data too: a library may use programmatic (early-launch) edges, and querying
  // edges without their data fails when any edge has some.
  std::vector<cudaGraphNode_t> from(edge_count), to(edge_count);
  std::vector<cudaGraphEdgeData> data(edge_count);
  if (edge_count > 0) {
    FUSEBOX_CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &edge_count));
  }
  append_key(key, uint32_t(edge_count));
  for (size_t i = 0; i < edge_count; ++i) {
    append_key(key, ordinal.at(from[i]));
    append_key(key, ordinal.at(to[i]));
    append_key(key, data[i].from_port);
    append_key(key, data[i].to_port);
    append_key(key, data[i].type);
  }
}

}  // namespace

std::string graph_topology(cudaGraph_t graph) {
  std::string key;
  append_topology(key, graph);
  return key;
}

}  // namespace fusebox::cuda
