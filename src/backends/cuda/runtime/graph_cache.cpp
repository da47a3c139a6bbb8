#include "backends/cuda/runtime/graph_cache.h"

#include <cuda.h>  // driver types only: the entry points are looked up at run time

#include <atomic>
#include <cstdio>
#include <vector>

#include "backends/cuda/runtime/check.h"
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

// The driver's node queries, looked up once through the runtime (the project does not
// link libcuda: test binaries must start on machines without a driver).
struct DriverGraphApi {
  CUresult (*get_params)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS*) = nullptr;
  CUresult (*get_attribute)(CUgraphNode, CUkernelNodeAttrID, CUkernelNodeAttrValue*) = nullptr;
};

const DriverGraphApi& driver_graph_api() {
  static const DriverGraphApi api = [] {
    DriverGraphApi a;
    cudaDriverEntryPointQueryResult found{};
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuGraphKernelNodeGetParams", &fn, 12000,
                                         cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      a.get_params = reinterpret_cast<decltype(a.get_params)>(fn);
    fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuGraphKernelNodeGetAttribute", &fn, 12000,
                                         cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      a.get_attribute = reinterpret_cast<decltype(a.get_attribute)>(fn);
    (void)cudaGetLastError();
    return a;
  }();
  return api;
}

// A kernel node's part of the key: its function, launch shape and cluster shape. Read
// through the driver, because kernels a library launched through the driver API (cuDNN)
// do not map back to a runtime function: keyed by kind only, two graphs differing only in
// cuDNN's kernels shared a key, and cudaGraphExecUpdate, which does not update cluster
// dimensions, ran the second with the first's clusters (wrong results on the H100, conv
// test config 191). A node that cannot be read gets a key no other graph has: it is
// instantiated, never updated.
void append_kernel_node(std::string& key, cudaGraphNode_t node) {
  const DriverGraphApi& api = driver_graph_api();
  CUDA_KERNEL_NODE_PARAMS params{};
  const auto driver_node = reinterpret_cast<CUgraphNode>(node);
  if (api.get_params == nullptr || api.get_params(driver_node, &params) != CUDA_SUCCESS) {
    static std::atomic<uint64_t> unreadable{0};
    append_key(key, '?');
    append_key(key, unreadable.fetch_add(1));
    return;
  }
  append_key(key, reinterpret_cast<uintptr_t>(params.func));
  append_key(key, reinterpret_cast<uintptr_t>(params.kern));
  append_key(key, params.gridDimX);
  append_key(key, params.gridDimY);
  append_key(key, params.gridDimZ);
  append_key(key, params.blockDimX);
  append_key(key, params.blockDimY);
  append_key(key, params.blockDimZ);
  append_key(key, params.sharedMemBytes);
  CUkernelNodeAttrValue cluster{};
  if (api.get_attribute != nullptr &&
      api.get_attribute(driver_node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &cluster) ==
          CUDA_SUCCESS) {
    append_key(key, cluster.clusterDim.x);
    append_key(key, cluster.clusterDim.y);
    append_key(key, cluster.clusterDim.z);
  } else {
    append_key(key, '-');
  }
}

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
      append_kernel_node(key, node);
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
