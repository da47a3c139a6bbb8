// fusebox bench: how fast a whole model trains or runs, as a user sees it.
//
//   fusebox bench resnet50 --mode train --batch-size 256 --precision bf16 --device cuda
//
// Method (every figure is in the table and the JSON):
//   compile   the first step, from nothing to its result on the host: building the
//             training session or the executable (layouts, memory plan, convolution plans,
//             the CUDA graph) and running it once;
//   warm-up   --warmup steps, not timed;
//   timed     --steps steps queued back to back as a training loop or a serving loop
//             would (the host never waits for a step), one wait at the end: images/s is
//             steps x batch / that wall time;
//   per step  --steps more steps, each waited for (its result on the host): ms/step
//             median, min and max (a step's whole latency, host included), and host time
//             per step: the median time the call takes to issue a step onto an idle GPU;
//   memory    the peak of the device memory fusebox held, compile included (CUDA).
// Data: synthetic, seeded, never zeros: images U(-1, 1) and labels 0..classes-1. Training
// feeds them from device memory (uploaded once: the input pipeline is not measured);
// inference copies the images in from pinned host memory and the outputs back every step,
// as serving does. Inference runs the inference pipeline's graph (passes/pipeline.h: batch
// norms folded, conv epilogues, batch-norm fusions; FUSEBOX_FUSION=0: none); --report prints
// its fusion groups and what each became, and after the timed steps each node's time
// (Executable::profile: the slowest nodes, the time by op; also in the JSON); --dot FILE
// draws it. Training with --report: each node of the step's time, profiled on a copy of the
// step whose state updates are not applied in place (TrainingSession::profiled_step).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>

#include "common.h"
#include "fusebox/backends/cuda.h"
#include "fusebox/core/build_info.h"
#include "fusebox/core/parallel.h"
#include "fusebox/io/json.h"
#include "fusebox/io/tensor_file.h"
#include "fusebox/passes/layout.h"
#include "fusebox/passes/mixed_precision.h"
#include "fusebox/runtime/executable.h"
#include "fusebox/train/session.h"

namespace fusebox::cli {
namespace {

struct BenchArgs {
  std::string model;
  std::string mode = "infer";
  int64_t batch = 32;
  std::string precision = "tf32";
  std::string device = "auto";
  int64_t steps = 30;
  int64_t warmup = 5;
  int64_t image_size = 224;
  int64_t num_classes = 1000;
  std::vector<std::string> shapes;
  std::string json;
  bool report = false;
  std::string dot;
  std::string memory_limit;
  std::string optimizer = "sgd";  // --mode train: train's --optimizer and its defaults
  CLI::App* app = nullptr;
  bool given(const std::string& option) const { return app->count(option) > 0; }
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Figures {
  int64_t batch = 0;  // the batch the model ran (an ONNX model's own; --batch for a zoo model)
  double compile_s = 0;
  double images_per_s = 0;
  double host_us_per_step = 0;
  double ms_median = 0, ms_min = 0, ms_max = 0;
  size_t peak_bytes = 0;
  // The peak split at the end of the first step (compile + that step; the steps after it):
  // a peak above the plan (arena, inputs/outputs, constants, workspaces) is then placed.
  size_t first_step_peak_bytes = 0, steps_peak_bytes = 0;
  double final_loss = 0;            // training
  std::optional<TimeReport> times;  // inference with --report
  ExecutableStats exe;
  // FUSEBOX_TIME_RUNS=1 (CUDA): the queued steps' device time and the device's idle time
  // between them, per step (runs timed: 0 when the setting is off).
  size_t timed_runs = 0;
  double run_device_ms = 0, run_idle_ms = 0;
  double waited_device_ms = 0;  // the waited steps' device time each (FUSEBOX_TIME_RUNS)
};

// The per-step latencies' median, min and max.
void summarise(std::vector<double> ms, Figures& f) {
  std::sort(ms.begin(), ms.end());
  f.ms_median = ms[ms.size() / 2];
  f.ms_min = ms.front();
  f.ms_max = ms.back();
}

Graph load_model(const BenchArgs& args, bool training) {
  return load_model_argument(args.model, args.shapes,
                             {.batch = args.batch,
                              .image_size = args.image_size,
                              .num_classes = args.num_classes,
                              .training = training},
                             args.given("--image-size") || args.given("--num-classes"), training);
}

// Runs `steps` steps through `step` (which queues one and returns its result's handle) on
// `exe`; `settle` waits for every step queued and checks them (what stats() then counts).
template <class Step, class Settle>
void time_steps(const BenchArgs& args, int64_t batch, const std::string& what, Step&& step,
                Settle&& settle, const Executable& exe, Figures& f) {
  f.batch = batch;
  Progress progress(1, args.steps * 2, std::max<int64_t>(1, args.steps / 5));
  settle();
  const ExecutableStats before = exe.stats();
  const auto start = Clock::now();
  PendingTensor last;
  for (int64_t i = 0; i < args.steps; ++i) {
    last = step();
    if (last.ready()) progress.update(i + 1, what + " (queued)");
  }
  const Tensor result = last.get();
  const double wall = seconds_since(start);
  settle();
  const ExecutableStats after = exe.stats();
  if (after.timed_runs > before.timed_runs) {
    // The first queued run's idle time is the wait for the bench itself: left out.
    const double runs = double(after.timed_runs - before.timed_runs);
    f.timed_runs = after.timed_runs - before.timed_runs;
    f.run_device_ms = (after.run_device_ms - before.run_device_ms) / runs;
    f.run_idle_ms = (after.run_idle_ms - before.run_idle_ms) / std::max(1.0, runs - 1);
  }
  f.images_per_s = double(args.steps * batch) / wall;
  if (result.numel() == 1) f.final_loss = result.get(0);
  progress.update(args.steps, cat(what, " (queued)  ", fixed(f.images_per_s, 1), " images/s"));

  // Each step waited for: its latency, and the host's time to issue it onto an idle GPU
  // (no wait for an earlier step inside the call).
  std::vector<double> ms, host_us;
  const ExecutableStats before_waited = exe.stats();
  for (int64_t i = 0; i < args.steps; ++i) {
    const auto t = Clock::now();
    PendingTensor result = step();
    host_us.push_back(seconds_since(t) * 1e6);
    result.get();
    ms.push_back(seconds_since(t) * 1e3);
    progress.update(args.steps + i + 1,
                    cat(what, " (each waited for)  ", fixed(ms.back(), 3), " ms"));
  }
  const ExecutableStats after_waited = exe.stats();
  if (after_waited.timed_runs > before_waited.timed_runs)
    f.waited_device_ms = (after_waited.run_device_ms - before_waited.run_device_ms) /
                         double(after_waited.timed_runs - before_waited.timed_runs);
  summarise(std::move(ms), f);
  std::sort(host_us.begin(), host_us.end());
  f.host_us_per_step = host_us[host_us.size() / 2];
}

Figures bench_train(const BenchArgs& args, Device device, Precision precision) {
  Figures f;
  reset_peak_device_memory(device);
  const auto start = Clock::now();
  const Graph g = load_model(args, true);
  FUSEBOX_CHECK(g.inputs().size() == 1 && g.outputs().size() == 1, "fusebox bench",
                "training needs a model with one input and one output (logits), got ",
                g.inputs().size(), " and ", g.outputs().size());
  const Value& input = g.value(g.inputs()[0]);
  const Value& logits = g.value(g.outputs()[0]);
  const int64_t classes = logits.type.shape.at(1);
  const OptimizerSpec optimizer = args.optimizer == "adamw"
                                      ? OptimizerSpec(AdamWOptions{})
                                      : OptimizerSpec(SgdOptions{.lr = 0.05, .momentum = 0.9});
  TrainingSession session(
      g, LossSpec{}, optimizer,
      {.device = device, .cpu_kernels = cpu_kernels_for(args.device), .precision = precision});
  // cross_entropy's labels: logits [N, C, D...] -> [N, D...] (a decoder's [N, vocab, tokens]:
  // one label per token).
  Shape label_shape = logits.type.shape;
  label_shape.erase(label_shape.begin() + 1);
  Tensor labels = Tensor::empty(DType::i64, label_shape);
  for (int64_t i = 0; i < labels.numel(); ++i) labels.set(i, double((i * 7 + 3) % classes));
  const Tensor images = random_input(input.type.dtype, input.type.shape, 0, input.name);
  Feeds batch;
  batch[input.name] = DeviceArray::upload(images, device);
  batch["labels"] = DeviceArray::upload(labels, device);
  session.step_async(batch).get();
  f.compile_s = seconds_since(start);
  f.exe = session.step_executable().stats();
  f.first_step_peak_bytes = device_memory_stats(device).peak;
  reset_peak_device_memory(device);
  for (int64_t i = 0; i < args.warmup; ++i) session.step_async(batch);
  session.synchronize();
  time_steps(
      args, input.type.shape[0], "train", [&] { return session.step_async(batch); },
      [&] { session.synchronize(); }, session.step_executable(), f);
  f.steps_peak_bytes = device_memory_stats(device).peak;
  f.peak_bytes = std::max(f.first_step_peak_bytes, f.steps_peak_bytes);
  if (args.report) {
    // The step updates its state in place, so repeating a node would change it: the step is
    // compiled again with its updates as outputs of their own, and that one is profiled.
    const std::unique_ptr<Executable> exe = session.profiled_step(batch);
    std::cout << exe->stats().fast_summary;
    const std::vector<NodeTime> times = exe->profile(device == Device::cuda ? 10 : 1);
    f.times = time_report(exe->graph(), times, device, exe->report().convolutions);
    std::cout << format_time_report(*f.times, f.ms_median);
  }
  return f;
}

Figures bench_infer(const BenchArgs& args, Device device, Precision precision) {
  Figures f;
  reset_peak_device_memory(device);
  const auto start = Clock::now();
  PipelineLog pipeline_log;
  auto exe = Executable::compile(load_model(args, false),
                                 {.device = device,
                                  .cpu_kernels = cpu_kernels_for(args.device),
                                  .pipeline = {.kind = PipelineKind::inference,
                                               .precision = precision,
                                               .fusion = InferenceFusionOptions::from_env(),
                                               .log = &pipeline_log}});
  const Graph& g = exe->graph();  // the inference pipeline's
  const FusionLog& fusion_log = pipeline_log.fusion;
  const LoweringDescriber lowering = device == Device::cuda
                                         ? LoweringDescriber(cuda::describe_lowering)
                                         : cpu_lowering(g, cpu_kernels_for(args.device));
  if (!args.dot.empty()) write_file_atomic(args.dot, fusion_dot(g, fusion_log, lowering));
  // Inputs in pinned host memory, as a data loader hands them over (copied to the GPU
  // asynchronously, straight from there: executable.h).
  Feeds feeds;
  for (ValueId v : g.inputs()) {
    const Value& in = g.value(v);
    const Tensor data = random_input(in.type.dtype, in.type.shape, 0, in.name);
    Tensor pinned = pinned_host_tensor(in.type.dtype, in.type.shape);
    if (data.nbytes() > 0) std::memcpy(pinned.raw(), data.raw(), data.nbytes());
    feeds[in.name] = pinned;
  }
  std::set<std::string> outputs;
  for (ValueId v : g.outputs()) outputs.insert(g.value(v).name);
  const std::string first_output = *outputs.begin();
  exe->run_async(feeds, outputs).host.at(first_output).get();
  f.compile_s = seconds_since(start);
  f.exe = exe->stats();
  f.first_step_peak_bytes = device_memory_stats(device).peak;
  reset_peak_device_memory(device);
  for (int64_t i = 0; i < args.warmup; ++i) exe->run_async(feeds, outputs);
  exe->check_errors();
  time_steps(
      args, g.value(g.inputs().at(0)).type.shape.at(0), "infer",
      [&] { return exe->run_async(feeds, outputs).host.at(first_output); },
      [&] { exe->check_errors(); }, *exe, f);
  f.steps_peak_bytes = device_memory_stats(device).peak;
  f.peak_bytes = std::max(f.first_step_peak_bytes, f.steps_peak_bytes);
  if (args.report) {
    std::cout << (device == Device::cuda ? fusion_outcome(g, fusion_log, exe->report().convolutions)
                                         : describe_fusion(g, fusion_log, lowering))
              << exe->stats().fast_summary;
    if (device == Device::cuda)
      std::cout << describe_copies(
          layout_copies(g, plan_layouts(g, layout_policy_from_env()), exe->stats().read_through));
    // After the timed steps, so that profiling cannot disturb them.
    const std::vector<NodeTime> times = exe->profile(device == Device::cuda ? 10 : 1);
    f.times = time_report(g, times, device, exe->report().convolutions);
    std::cout << format_time_report(*f.times, f.ms_median);
  }
  return f;
}

std::string mib(size_t bytes) {
  return fixed(double(bytes) / double(1 << 20), 1) + " MiB";
}

int bench(const BenchArgs& args) {
  apply_memory_limit(args.memory_limit);
  const bool train = args.mode == "train";
  if (train && !args.dot.empty())
    throw UsageError("--dot is for --mode infer: it draws the inference pipeline's fusion groups");
  if (!train && args.given("--optimizer")) throw UsageError("--optimizer is for --mode train");
  // The figures' file is checked before the minutes of benchmarking, not after.
  if (!args.json.empty()) check_writable(args.json, "--json " + args.json);
  const Precision precision = parse_precision(args.precision);
  set_float_math(precision);  // before the backend reads its settings
  const Device device = parse_device(args.device);
  // An ONNX model runs its own batch (--batch sizes zoo models): the figures below say which.
  const bool onnx = args.model.ends_with(".onnx");
  std::cout << "bench " << args.model << ": " << args.mode << ", "
            << (onnx ? std::string("the model's batch") : cat("batch ", args.batch)) << ", "
            << precision_name(precision) << ", " << device_name(device)
            << (train ? ", " + args.optimizer : std::string()) << ", " << args.warmup
            << " warm-up + " << args.steps << " queued + " << args.steps << " waited steps\n";
  const Figures f =
      train ? bench_train(args, device, precision) : bench_infer(args, device, precision);

  std::cout << "batch                 " << f.batch << "\n"
            << "compile (first step)  " << fixed(f.compile_s, 2) << " s\n"
            << "images/s              " << fixed(f.images_per_s, 1) << "\n"
            << "ms/step               median " << fixed(f.ms_median, 3) << "  min "
            << fixed(f.ms_min, 3) << "  max " << fixed(f.ms_max, 3) << "\n"
            << "host time per step    " << fixed(f.host_us_per_step, 1) << " us\n"
            << "peak device memory    "
            << (device == Device::cuda
                    ? mib(f.peak_bytes) + " (first step " + mib(f.first_step_peak_bytes) +
                          ", the steps after it " + mib(f.steps_peak_bytes) + ")"
                    : std::string("n/a (cpu)"))
            << "\n"
            << "memory plan           arena " << mib(f.exe.arena_bytes)
            << (f.exe.peak_live_bytes ? " (live at once at most " + mib(f.exe.peak_live_bytes) + ")"
                                      : std::string())
            << " (unshared " << mib(f.exe.unshared_bytes) << "), inputs/outputs "
            << mib(f.exe.io_bytes) << ", constants " << mib(f.exe.constant_bytes) << ", workspaces "
            << mib(f.exe.temporary_bytes) << ", " << f.exe.views
            << " views (layout ops read through: no copy)\n";
  if (!f.exe.peak_values.empty()) {
    // What the intermediates' peak holds: the values a smaller peak has to do without.
    std::cout << "intermediates' peak   at "
              << (f.exe.peak_node.empty() ? std::string("the end")
                                          : "node '" + f.exe.peak_node + "'")
              << ", the largest live:";
    for (size_t i = 0; i < f.exe.peak_values.size() && i < 4; ++i)
      std::cout << (i ? ", " : " ") << f.exe.peak_values[i].first << " "
                << mib(f.exe.peak_values[i].second);
    std::cout << "\n";
  }
  if (!f.exe.temporary_holders.empty()) {
    std::cout << "workspaces held by    ";
    for (size_t i = 0; i < f.exe.temporary_holders.size(); ++i)
      std::cout << (i ? ", " : "") << f.exe.temporary_holders[i].first << " "
                << mib(f.exe.temporary_holders[i].second);
    std::cout << "\n";
  }
  if (train) std::cout << "final loss            " << fixed(f.final_loss, 4) << "\n";
  if (f.timed_runs > 0)
    std::cout << "queued steps (timed)  device " << fixed(f.run_device_ms, 3) << " ms each, idle "
              << fixed(f.run_idle_ms, 3) << " ms between; waited steps device "
              << fixed(f.waited_device_ms, 3) << " ms each (" << f.timed_runs
              << " runs, FUSEBOX_TIME_RUNS)\n";

  if (!args.json.empty()) {
    Json j = Json::object({{"schema_version", 1},
                           {"bench", "fusebox_bench"},
                           {"model", args.model},
                           {"mode", args.mode},
                           {"batch", f.batch},
                           {"precision", precision_name(precision)},
                           {"device", device_name(device)},
                           {"steps", args.steps},
                           {"warmup", args.warmup},
                           {"compile_s", f.compile_s},
                           {"images_per_s", f.images_per_s},
                           {"step_ms_median", f.ms_median},
                           {"step_ms_min", f.ms_min},
                           {"step_ms_max", f.ms_max},
                           {"host_us_per_step", f.host_us_per_step},
                           {"peak_device_bytes", f.peak_bytes},
                           {"peak_device_bytes_first_step", f.first_step_peak_bytes},
                           {"peak_device_bytes_steps", f.steps_peak_bytes},
                           {"arena_bytes", f.exe.arena_bytes},
                           {"unshared_bytes", f.exe.unshared_bytes},
                           {"io_bytes", f.exe.io_bytes},
                           {"constant_bytes", f.exe.constant_bytes},
                           {"workspace_bytes", f.exe.temporary_bytes},
                           {"operations", f.exe.operations},
                           {"views", f.exe.views}});
    // Where and what ran: a figure is read against these.
    j.set("version", kVersion);
    j.set("commit", source_commit());
    j.set("cpu", cpu_model());
    j.set("threads", num_threads());
    if (device == Device::cuda) j.set("gpu", cuda::device_name());
    if (device == Device::cpu) {
      j.set("cpu_kernels", cpu_kernels_name(cpu_kernels_for(args.device)));
      j.set("fast_nodes", f.exe.fast_nodes);
    }
    if (train) {
      j.set("final_loss", f.final_loss);
      j.set("optimizer", args.optimizer);
    }
    if (f.times) j.set("time_by_node", time_report_json(*f.times));
    if (f.timed_runs > 0) {
      j.set("queued_device_ms_per_step", f.run_device_ms);
      j.set("queued_idle_ms_between_steps", f.run_idle_ms);
      j.set("waited_device_ms_per_step", f.waited_device_ms);
    }
    std::ofstream out(args.json);
    FUSEBOX_CHECK(out.good(), "fusebox bench", "cannot write --json ", args.json);
    out << j.dump() << "\n";
    FUSEBOX_CHECK(out.good(), "fusebox bench", "writing --json ", args.json, " failed");
  }
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& parent) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* app = parent.add_subcommand(
      "bench",
      "Time a whole model's training or inference steps (compile, images/s, latency, "
      "host time, peak memory)");
  args->app = app;
  app->add_option("model", args->model,
                  "A zoo model name (see `fusebox zoo --list`) or an .onnx file")
      ->required()
      ->type_name("MODEL.onnx|ZOO_NAME");
  app->add_option("--mode", args->mode, "infer (default) or train")
      ->check(CLI::IsMember({"infer", "train"}));
  app->add_option("--batch-size,--batch", args->batch,
                  "Samples per step (zoo models; an ONNX model runs its own); default 32")
      ->check(integer_range(1));
  app->add_option("--precision", args->precision,
                  "f32, tf32 (default), bf16 or f16 (see docs/mixed_precision.md)")
      ->check(CLI::IsMember({"f32", "tf32", "bf16", "f16"}));
  app->add_option("--device", args->device,
                  "cpu (the fast kernels where they take a node: oneDNN, the pointwise "
                  "interpreter; inference), cpu-ref (the "
                  "reference kernels), cuda, or auto (default)")
      ->check(CLI::IsMember({"cpu", "cpu-ref", "cuda", "auto"}));
  app->add_option("--steps", args->steps, "Timed steps (each of the two passes); default 30")
      ->check(integer_range(1));
  app->add_option("--warmup", args->warmup, "Untimed steps after the first; default 5")
      ->check(integer_range(0));
  app->add_option("--image-size", args->image_size, "Zoo models; default 224")
      ->check(integer_range(1));
  app->add_option("--num-classes", args->num_classes, "Zoo models; default 1000")
      ->check(integer_range(1));
  app->add_option("--optimizer", args->optimizer,
                  "--mode train: sgd (default: momentum 0.9, lr 0.05) or adamw (lr 0.001, "
                  "weight decay 0.01), train's defaults")
      ->check(CLI::IsMember({"sgd", "adamw"}));
  add_shape_option(*app, &args->shapes);
  app->add_option("--json", args->json, "Also write the figures here")->type_name("FILE");
  app->add_flag("--report", args->report,
                "Inference: print the fusion groups and what each became on this GPU, then "
                "each node's time (the slowest nodes with what ran, the time by op); training: "
                "each node of the step's time");
  app->add_option("--dot", args->dot, "Inference: write the fused graph as Graphviz to FILE")
      ->type_name("FILE");
  add_memory_limit_option(*app, &args->memory_limit);
  return {app, [args] { return bench(*args); }};
}

}  // namespace fusebox::cli
