// Launch overhead of a long chain of tiny pointwise kernels: 400 nodes alternating
// y = x + a and y = x * b (a, b scalar tensors) on a 1024-element f32 tensor, through the
// CUDA kernels (cuda::binary) and the CommandEncoder, in five modes:
//   eager    FUSEBOX_CUDA_GRAPHS=0: every node a cudaLaunchKernel on the stream as it is
//            recorded, then commit()
//   first    what a first run costs: record the chain, finish_recording() (instantiates a
//            new exec), replay it once; every iteration anew
//   update   the session-1 path: record the chain and commit(); the encoder's graph cache
//            finds the exec and updates it in place (cudaGraphExecUpdate), then launches
//   replay   the chain recorded once; every iteration is replay(): one cudaGraphLaunch,
//            nothing recorded (the target: <= 1.5 us per node on an H100)
//   run      the whole executor: the chain as an IR graph, compiled once (Executable),
//            feeds uploaded and the output downloaded every run (its compiled step replays)
// us/node is the wall time of many iterations (synchronised once at the end) over their
// node count: host and GPU overlap as they would in a loop of steps. The host columns split
// the time the host spends per node (record, instantiate or commit, launch); gpu is the GPU
// time of one iteration (CUDA events around its launch, median of 20) per node.
//
//   bench_pointwise_chain [--nodes 400] [--elements 1024] [--iters 200] [--json FILE]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "common/cli.h"
#include "common/report.h"
#include "common/table.h"
#include "common/timing.h"
#include "fusebox/runtime/executable.h"

namespace fb = fusebox;
namespace fc = fusebox::cuda;

namespace {

struct Config {
  int nodes = 400;
  int64_t elements = 1024;
  int iters = 200;
  std::string json;
};

constexpr double kTargetUsPerNode = 1.5;  // replay, on an H100

struct Result {
  std::string mode;
  double us_per_node = 0;          // wall, steady state
  double record_us_per_node = 0;   // host: recording the chain (eager: also launching it)
  double prepare_us_per_node = 0;  // host: commit() (update) or finish_recording() (first)
  double launch_us_per_node = 0;   // host: replay() (first, replay)
  double gpu_us_per_node = 0;      // CUDA events around one iteration's launch; 0: not taken
  uint64_t instantiations = 0, updates = 0, nodes_recorded = 0, replays = 0;
  bool correct = false;

  double host_us_per_node() const {
    return record_us_per_node + prepare_us_per_node + launch_us_per_node;
  }
};

const float kAdd = 0.5f, kMul = 0.75f;  // x -> (x + 0.5) * 0.75 converges to 1.5

// The chain as an IR graph: real, normalised Nodes for the kernels, and a graph to run.
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
    graph.mark_output(x);
    for (const fb::Node& n : graph.nodes()) nodes.push_back(&n);
  }
};

std::vector<float> chain_input(int64_t elements) {
  std::vector<float> x(static_cast<size_t>(elements));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(double(i)) * 3.0);
  return x;
}

bool chain_correct(const std::vector<float>& x, const std::vector<float>& got, int nodes) {
  for (size_t i = 0; i < x.size(); ++i) {
    float v = x[i];
    for (int k = 0; k < nodes; ++k) v = k % 2 == 0 ? v + kAdd : v * kMul;
    if (!(std::fabs(got[i] - v) <= 1e-5f * std::max(1.0f, std::fabs(v)))) return false;
  }
  return true;
}

// Median GPU time of `launch` (which puts one iteration's work on the stream), per node.
double gpu_us_per_node(fc::CommandEncoder& encoder, int nodes, const std::function<void()>& before,
                       const std::function<void()>& launch) {
  fb::bench::EventTimer timer;
  std::vector<double> ms;
  for (int it = 0; it < 20; ++it) {
    encoder.synchronize();
    before();
    ms.push_back(timer.ms(encoder.stream(), launch));
  }
  return fb::bench::median(ms) * 1000.0 / nodes;
}

enum class Mode { eager, first, update, replay };

Result run_encoder_mode(const Config& cfg, Mode mode) {
  fc::Device& device = fc::Device::get(0);
  fc::CachingAllocator& allocator = fc::CachingAllocator::for_device(0);
  fc::CommandEncoder::Options options = fc::CommandEncoder::Options::from_env();
  options.use_graphs = mode != Mode::eager;
  fc::CommandEncoder encoder(device, options, &allocator);
  fc::Context ctx{device, encoder, allocator};
  Chain chain(cfg.nodes, cfg.elements);

  // Values: x, a, b, then one buffer per node output (a static plan, as a compiled step's).
  const std::vector<float> x_host = chain_input(cfg.elements);
  fc::DeviceTensor x = fc::DeviceTensor::empty(allocator, fb::DType::f32, {cfg.elements});
  fc::DeviceTensor a = fc::DeviceTensor::empty(allocator, fb::DType::f32, {});
  fc::DeviceTensor b = fc::DeviceTensor::empty(allocator, fb::DType::f32, {});
  encoder.copy_to_device(x.range(), x_host.data());
  encoder.copy_to_device(a.range(), &kAdd);
  encoder.copy_to_device(b.range(), &kMul);
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

  Result r;
  double record_us = 0, prepare_us = 0, launch_us = 0;
  fc::RecordedGraph step;
  // One iteration, with the host time of each part added up.
  auto iteration = [&] {
    fb::bench::Stopwatch watch;
    switch (mode) {
      case Mode::eager:  // the encoders differ: direct launches, or graphs
      case Mode::update:
        record();
        record_us += watch.lap_us();
        encoder.commit();
        prepare_us += watch.lap_us();
        break;
      case Mode::first: {
        record();
        record_us += watch.lap_us();
        fc::RecordedGraph fresh = encoder.finish_recording();
        prepare_us += watch.lap_us();
        encoder.replay(fresh);  // `fresh` may go: the launch holds it
        launch_us += watch.lap_us();
        break;
      }
      case Mode::replay:
        encoder.replay(step);
        launch_us += watch.lap_us();
        break;
    }
  };

  if (mode == Mode::replay) {
    record();
    step = encoder.finish_recording();
  }
  const int warmup = mode == Mode::first ? 2 : 5;
  for (int i = 0; i < warmup; ++i) iteration();
  encoder.synchronize();
  record_us = prepare_us = launch_us = 0;

  // Instantiating every iteration is slow: fewer of them.
  const int iters = mode == Mode::first ? std::max(1, cfg.iters / 10) : cfg.iters;
  const fb::bench::Stopwatch wall;
  for (int it = 0; it < iters; ++it) iteration();
  encoder.synchronize();
  const double nodes_run = double(iters) * cfg.nodes;
  r.us_per_node = wall.us() / nodes_run;
  r.record_us_per_node = record_us / nodes_run;
  r.prepare_us_per_node = prepare_us / nodes_run;
  r.launch_us_per_node = launch_us / nodes_run;

  // GPU time: the events bracket what one iteration puts on the stream. Launching directly,
  // the kernels are launched while recording, so the events include the gaps the host
  // leaves between them.
  switch (mode) {
    case Mode::eager:
      r.gpu_us_per_node = gpu_us_per_node(
          encoder, cfg.nodes, [] {},
          [&] {
            record();
            encoder.commit();
          });
      break;
    case Mode::update:
      r.gpu_us_per_node = gpu_us_per_node(encoder, cfg.nodes, record, [&] { encoder.commit(); });
      break;
    case Mode::first: {
      fc::RecordedGraph fresh;
      r.gpu_us_per_node = gpu_us_per_node(
          encoder, cfg.nodes,
          [&] {
            record();
            fresh = encoder.finish_recording();
          },
          [&] { encoder.replay(fresh); });
      break;
    }
    case Mode::replay:
      r.gpu_us_per_node = gpu_us_per_node(
          encoder, cfg.nodes, [] {}, [&] { encoder.replay(step); });
      break;
  }

  std::vector<float> got(x_host.size());
  encoder.copy_to_host(got.data(), values.back().range());
  r.correct = chain_correct(x_host, got, cfg.nodes);
  const fc::CommandEncoder::Stats stats = encoder.stats();
  r.instantiations = stats.graph_cache.instantiations + stats.recordings_finished;
  r.updates = stats.graph_cache.updates;
  r.nodes_recorded = stats.nodes_recorded;
  r.replays = stats.replays;
  static const char* const names[] = {"eager", "first", "update", "replay"};
  r.mode = names[int(mode)];
  return r;
}

// The executor end to end: feeds in, one replay of the compiled step, the output out.
Result run_executor(const Config& cfg) {
  Chain chain(cfg.nodes, cfg.elements);
  const std::vector<float> x_host = chain_input(cfg.elements);
  fb::NamedTensors feeds = {{"x", fb::Tensor::from_vector<float>({cfg.elements}, x_host)},
                            {"a", fb::Tensor::scalar(fb::DType::f32, kAdd)},
                            {"b", fb::Tensor::scalar(fb::DType::f32, kMul)}};
  fc::CommandEncoder& encoder = fc::CommandEncoder::for_device(0);
  const fc::CommandEncoder::Stats before = encoder.stats();
  auto exe = fb::Executable::compile(chain.graph, {.device = fb::Device::cuda});
  fb::NamedTensors out;
  for (int i = 0; i < 3; ++i) out = exe->run(feeds);
  const int iters = std::max(1, cfg.iters / 4);
  const fb::bench::Stopwatch wall;
  for (int it = 0; it < iters; ++it) out = exe->run(feeds);
  Result r;
  r.mode = "run";
  r.us_per_node = wall.us() / (double(iters) * cfg.nodes);
  const fb::Tensor& y = out.begin()->second;
  r.correct = chain_correct(
      x_host, std::vector<float>(y.values<float>().begin(), y.values<float>().end()), cfg.nodes);
  const fc::CommandEncoder::Stats after = encoder.stats();
  r.instantiations = (after.graph_cache.instantiations - before.graph_cache.instantiations) +
                     (after.recordings_finished - before.recordings_finished);
  r.updates = after.graph_cache.updates - before.graph_cache.updates;
  r.nodes_recorded = after.nodes_recorded - before.nodes_recorded;
  r.replays = after.replays - before.replays;
  return r;
}

void write_json(const Config& cfg, const std::vector<Result>& results, bool target_met) {
  fb::bench::Json rows = fb::bench::Json::array();
  for (const Result& r : results) {
    rows.push(fb::bench::Json::object({{"mode", r.mode},
                                       {"us_per_node", r.us_per_node},
                                       {"host_us_per_node", r.host_us_per_node()},
                                       {"record_us_per_node", r.record_us_per_node},
                                       {"prepare_us_per_node", r.prepare_us_per_node},
                                       {"launch_us_per_node", r.launch_us_per_node},
                                       {"gpu_us_per_node", r.gpu_us_per_node},
                                       {"instantiations", r.instantiations},
                                       {"updates", r.updates},
                                       {"nodes_recorded", r.nodes_recorded},
                                       {"replays", r.replays},
                                       {"correct", r.correct}}));
  }
  fb::bench::Json report = fb::bench::report("pointwise_chain");
  report.set("benchmark", "pointwise_chain")
      .set("nodes", cfg.nodes)
      .set("elements", cfg.elements)
      .set("iters", cfg.iters)
      .set("target_us_per_node", kTargetUsPerNode)
      .set("target_met", target_met)
      .set("results", std::move(rows));
  fb::bench::write_report(cfg.json, report);
}

int run(const Config& cfg) {
  if (fc::device_count() == 0) {
    std::printf("bench_pointwise_chain: no CUDA device\n");
    return 1;
  }
  std::vector<Result> results;
  for (Mode mode : {Mode::eager, Mode::first, Mode::update, Mode::replay})
    results.push_back(run_encoder_mode(cfg, mode));
  results.push_back(run_executor(cfg));

  std::printf(
      "pointwise chain: %d nodes (add/mul scalar), %lld f32 elements, %d iterations on %s\n",
      cfg.nodes, static_cast<long long>(cfg.elements), cfg.iters,
      fc::Device::get(0).properties().name.c_str());
  const fb::bench::Table table({{"mode", 8, true},
                                {"us/node", 9},
                                {"host", 9},
                                {"record", 9},
                                {"prepare", 9},
                                {"launch", 9},
                                {"gpu", 9},
                                {"inst", 8},
                                {"updates", 8},
                                {"replays", 8},
                                {"correct", 8}});
  table.print_header();
  for (const Result& r : results) {
    using fb::bench::fixed;
    table.print_row({r.mode, fixed(r.us_per_node, 3), fixed(r.host_us_per_node(), 3),
                     fixed(r.record_us_per_node, 3), fixed(r.prepare_us_per_node, 3),
                     fixed(r.launch_us_per_node, 3), fixed(r.gpu_us_per_node, 3),
                     std::to_string(r.instantiations), std::to_string(r.updates),
                     std::to_string(r.replays), r.correct ? "yes" : "NO"});
  }
  std::printf("(run: the executor end to end, host and GPU not split; gpu 0: not taken)\n");
  const bool target_met = results[3].us_per_node <= kTargetUsPerNode;
  std::printf("target: replay <= %.1f us/node: %s (%.3f)\n", kTargetUsPerNode,
              target_met ? "met" : "NOT met", results[3].us_per_node);
  write_json(cfg, results, target_met);
  bool ok = true;
  for (const Result& r : results) ok = ok && r.correct;
  return ok ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  fb::bench::Cli cli("bench_pointwise_chain",
                     "Launch overhead of a long chain of tiny pointwise kernels", cfg.json);
  cli.add_count("--nodes", cfg.nodes, "Nodes in the chain");
  cli.add_count("--elements", cfg.elements, "f32 elements of each tensor");
  cli.add_iters(cfg.iters, "Timed iterations of the chain (first: a tenth of them)");
  return cli.run(argc, argv, [&] { return run(cfg); });
}
