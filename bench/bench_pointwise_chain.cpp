// Launch overhead of a long chain of tiny pointwise kernels: 400 nodes alternating
// y = x + a and y = x * b (a, b scalars) on a 1024-element f32 tensor, run through the
// CUDA kernels (cuda::binary) and the CommandEncoder:
//   direct  FUSEBOX_CUDA_GRAPHS=0 behaviour: every node a cudaLaunchKernel on the stream
//   graph   every iteration records the chain and commits it: the first commit
//           instantiates a graph, later ones hit the cache and update the exec in place
//           (the update path), then launch it
// Per iteration the host records all 400 nodes (dispatch, argument packing, hazard
// tracking) and commits; the time per node is the wall time of many iterations (the
// stream synchronised at the end) over their node count, i.e. what a training step of
// tiny ops costs end to end. Also reported: host record time and commit time per node,
// and the GPU time of one iteration (CUDA events), so that host and device costs can be
// told apart. Target: <= 1.5 us per node replayed.
//
//   bench_pointwise_chain [--nodes 400] [--elements 1024] [--iters 200] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "backends/cuda/check.h"
#include "backends/cuda/kernels.h"

namespace fb = fusebox;
namespace fc = fusebox::cuda;

namespace {

struct Config {
  int nodes = 400;
  int64_t elements = 1024;
  int iters = 200;
  std::string json;
};

struct Result {
  std::string mode;
  double us_per_node = 0;         // wall: record + commit + GPU, steady state
  double record_us_per_node = 0;  // host time recording the chain
  double commit_us_per_node = 0;  // host time in commit()
  double gpu_us_per_node = 0;     // CUDA events around one committed iteration
  uint64_t instantiations = 0, updates = 0, refusals = 0;
  bool correct = false;
};

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

// The chain as a graph of binary nodes, so that the kernels get real, normalised Nodes.
struct Chain {
  fb::Graph graph{"pointwise_chain"};
  std::vector<const fb::Node*> nodes;

  Chain(int count, int64_t elements) {
    fb::ValueId x = graph.add_input("x", fb::DType::f32, {elements});
    fb::ValueId a = graph.add_input("a", fb::DType::f32, {});
    fb::ValueId b = graph.add_input("b", fb::DType::f32, {});
    for (int i = 0; i < count; ++i) {
      const fb::OpKind op = i % 2 == 0 ? fb::OpKind::add : fb::OpKind::mul;
      x = graph.add_node(op, {}, {x, i % 2 == 0 ? a : b})[0];
    }
    for (const fb::Node& n : graph.nodes()) nodes.push_back(&n);
  }
};

Result run_mode(const Config& cfg, bool use_graphs) {
  fc::Device& device = fc::Device::get(0);
  fc::CachingAllocator& allocator = fc::CachingAllocator::for_device(0);
  fc::CommandEncoder::Options options = fc::CommandEncoder::Options::from_env();
  options.use_graphs = use_graphs;
  fc::CommandEncoder encoder(device, options, &allocator);
  fc::Context ctx{device, encoder, allocator};
  Chain chain(cfg.nodes, cfg.elements);

  // Values: x, a, b, then one buffer per node output (a static plan, as an executor's).
  const float add = 0.5f, mul = 0.75f;  // x -> (x + 0.5) * 0.75 converges to 1.5
  std::vector<float> x_host(size_t(cfg.elements));
  for (size_t i = 0; i < x_host.size(); ++i) x_host[i] = float(std::sin(double(i)) * 3.0);
  fc::DeviceTensor x = fc::DeviceTensor::empty(allocator, fb::DType::f32, {cfg.elements});
  fc::DeviceTensor a = fc::DeviceTensor::empty(allocator, fb::DType::f32, {});
  fc::DeviceTensor b = fc::DeviceTensor::empty(allocator, fb::DType::f32, {});
  encoder.copy_to_device(x.range(), x_host.data());
  encoder.copy_to_device(a.range(), &add);
  encoder.copy_to_device(b.range(), &mul);
  std::vector<fc::DeviceTensor> values;
  values.reserve(size_t(cfg.nodes));
  for (int i = 0; i < cfg.nodes; ++i)
    values.push_back(fc::DeviceTensor::empty(allocator, fb::DType::f32, {cfg.elements}));

  auto record = [&] {
    for (int i = 0; i < cfg.nodes; ++i) {
      const fc::DeviceTensor* in[2] = {i == 0 ? &x : &values[size_t(i - 1)], i % 2 == 0 ? &a : &b};
      fc::binary(ctx, *chain.nodes[size_t(i)], in,
                 std::span<fc::DeviceTensor>(&values[size_t(i)], 1));
    }
  };

  // Warm-up: module load, instantiation, the first update.
  for (int i = 0; i < 5; ++i) {
    record();
    encoder.commit();
  }
  encoder.synchronize();

  Result r;
  r.mode = use_graphs ? "graph replay (update)" : "direct launches";
  double record_us = 0, commit_us = 0;
  const Clock::time_point start = Clock::now();
  for (int it = 0; it < cfg.iters; ++it) {
    Clock::time_point t = Clock::now();
    record();
    record_us += us_since(t);
    t = Clock::now();
    encoder.commit();
    commit_us += us_since(t);
  }
  encoder.synchronize();
  const double total_us = us_since(start);
  const double nodes_run = double(cfg.iters) * cfg.nodes;
  r.us_per_node = total_us / nodes_run;
  r.record_us_per_node = record_us / nodes_run;
  r.commit_us_per_node = commit_us / nodes_run;

  // GPU time of one iteration (median of 20), CUDA events on the stream. With graphs the
  // chain is recorded first and the events bracket the commit, which launches the whole
  // graph; launching directly, the launches happen while recording, so the events bracket
  // record + commit and include the gaps the host leaves between kernels.
  cudaEvent_t begin, end;
  FUSEBOX_CUDA_CHECK(cudaEventCreate(&begin));
  FUSEBOX_CUDA_CHECK(cudaEventCreate(&end));
  std::vector<float> gpu_ms;
  for (int it = 0; it < 20; ++it) {
    encoder.synchronize();
    if (use_graphs) record();
    FUSEBOX_CUDA_CHECK(cudaEventRecord(begin, encoder.stream()));
    if (!use_graphs) record();
    encoder.commit();
    FUSEBOX_CUDA_CHECK(cudaEventRecord(end, encoder.stream()));
    FUSEBOX_CUDA_CHECK(cudaEventSynchronize(end));
    float ms = 0;
    FUSEBOX_CUDA_CHECK(cudaEventElapsedTime(&ms, begin, end));
    gpu_ms.push_back(ms);
  }
  std::sort(gpu_ms.begin(), gpu_ms.end());
  r.gpu_us_per_node = double(gpu_ms[gpu_ms.size() / 2]) * 1000.0 / cfg.nodes;
  FUSEBOX_CUDA_CHECK(cudaEventDestroy(begin));
  FUSEBOX_CUDA_CHECK(cudaEventDestroy(end));

  // Correctness: the chain's last output against the same float arithmetic on the host.
  std::vector<float> got(x_host.size());
  encoder.copy_to_host(got.data(), values.back().range());
  r.correct = true;
  for (size_t i = 0; i < x_host.size(); ++i) {
    float v = x_host[i];
    for (int k = 0; k < cfg.nodes; ++k) v = k % 2 == 0 ? v + add : v * mul;
    if (std::fabs(got[i] - v) > 1e-5f * std::max(1.0f, std::fabs(v))) r.correct = false;
  }
  const fc::CommandEncoder::Stats stats = encoder.stats();
  r.instantiations = stats.graph_cache.instantiations;
  r.updates = stats.graph_cache.updates;
  r.refusals = stats.graph_cache.refusals;
  return r;
}

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw fb::Error("bench_pointwise_chain", arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--nodes")
      c.nodes = std::stoi(next());
    else if (arg == "--elements")
      c.elements = std::stoll(next());
    else if (arg == "--iters")
      c.iters = std::stoi(next());
    else if (arg == "--json")
      c.json = next();
    else
      throw fb::Error("bench_pointwise_chain", "unknown argument " + arg);
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Config cfg = parse(argc, argv);
    if (fc::device_count() == 0) {
      std::printf("bench_pointwise_chain: no CUDA device\n");
      return 1;
    }
    std::vector<Result> results = {run_mode(cfg, false), run_mode(cfg, true)};
    std::printf("pointwise chain: %d nodes (add/mul scalar), %lld f32 elements, %d iterations\n",
                cfg.nodes, static_cast<long long>(cfg.elements), cfg.iters);
    std::printf("%-24s %10s %10s %10s %10s %8s\n", "mode", "us/node", "record", "commit", "gpu",
                "correct");
    for (const Result& r : results)
      std::printf("%-24s %10.3f %10.3f %10.3f %10.3f %8s\n", r.mode.c_str(), r.us_per_node,
                  r.record_us_per_node, r.commit_us_per_node, r.gpu_us_per_node,
                  r.correct ? "yes" : "NO");
    std::printf("graph cache: %llu instantiations, %llu updates, %llu refused updates\n",
                static_cast<unsigned long long>(results[1].instantiations),
                static_cast<unsigned long long>(results[1].updates),
                static_cast<unsigned long long>(results[1].refusals));
    std::printf("target: graph replay <= 1.5 us/node: %s\n",
                results[1].us_per_node <= 1.5 ? "met" : "NOT met");
    if (!cfg.json.empty()) {
      std::ofstream out(cfg.json);
      out << "{\n  \"benchmark\": \"pointwise_chain\",\n  \"device\": \""
          << fc::Device::get(0).properties().name << "\",\n  \"nodes\": " << cfg.nodes
          << ",\n  \"elements\": " << cfg.elements << ",\n  \"iters\": " << cfg.iters
          << ",\n  \"results\": [\n";
      for (size_t i = 0; i < results.size(); ++i) {
        const Result& r = results[i];
        out << "    {\"mode\": \"" << (i == 0 ? "direct" : "graph")
            << "\", \"us_per_node\": " << r.us_per_node
            << ", \"record_us_per_node\": " << r.record_us_per_node
            << ", \"commit_us_per_node\": " << r.commit_us_per_node
            << ", \"gpu_us_per_node\": " << r.gpu_us_per_node
            << ", \"instantiations\": " << r.instantiations << ", \"updates\": " << r.updates
            << ", \"refusals\": " << r.refusals
            << ", \"correct\": " << (r.correct ? "true" : "false") << "}"
            << (i + 1 < results.size() ? "," : "") << "\n";
      }
      out << "  ]\n}\n";
    }
    bool ok = true;
    for (const Result& r : results) ok = ok && r.correct;
    return ok ? 0 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pointwise_chain: %s\n", e.what());
    return 1;
  }
}
