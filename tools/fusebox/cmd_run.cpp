// fusebox run: import an ONNX model, feed it (files or seeded random data), run it
// on a device, print and optionally save each output. On CUDA the model is compiled as
// an inference graph (the inference pipeline, passes/pipeline.h: batch norms folded, conv
// epilogues and batch-norm fusions; FUSEBOX_FUSION=0 turns the fusions off); the CPU backend, the
// reference, runs the model's own graph. --report lists the fusion groups and what each became,
// each convolution with the path (cuDNN or the project's kernels) and plan it got, and each node's
// time (Executable::profile, after the run: tools/fusebox/time_report.cpp); --autotune times
// cuDNN's candidate plans for each convolution problem and keeps the fastest; --dot FILE
// writes the fused graph as Graphviz; --precision bf16|f16 runs the pipeline's mixed precision
// (the outputs keep the model's dtypes).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <set>

#include "common.h"
#include "fusebox/backends/cuda.h"
#include "fusebox/frontends/onnx.h"
#include "fusebox/io/tensor_file.h"
#include "fusebox/passes/layout.h"
#include "fusebox/runtime/executable.h"
#include "fusebox/runtime/executor.h"
#include "fusebox/runtime/report.h"

namespace fusebox::cli {
namespace {

struct RunArgs {
  std::string model;
  std::string device = "cpu";
  std::vector<std::string> inputs;  // NAME=FILE
  std::vector<std::string> shapes;  // NAME=DIMS
  std::string output_dir;
  uint64_t seed = 0;
  bool report = false;
  bool autotune = false;
  std::string dot;
  std::string memory_limit;
  std::string precision;  // empty: f32, the backend's own TF32 settings
};

// Imports with the --shape shapes. A model with symbolic dims may need the shapes of
// the --input files too; they are added only on a second try, so that a file given
// for a name the model does not have is reported as such (run below).
Graph import_model(const std::string& path, std::map<std::string, Shape> shapes,
                   const NamedTensors& given) {
  OnnxImportOptions opts;
  opts.input_shapes = std::move(shapes);
  try {
    return import_onnx_file(path, opts);
  } catch (const Error&) {
    bool more = false;
    for (const auto& [name, t] : given)
      more = opts.input_shapes.emplace(name, t.shape()).second || more;
    if (!more) throw;
  }
  return import_onnx_file(path, opts);
}

void make_directory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  FUSEBOX_CHECK(!ec, "fusebox run", "cannot create output directory '", dir, "': ", ec.message());
}

// Writes each output to DIR/<sanitised name>.npy; two names that sanitise alike get
// "_1", "_2", ... so that no output overwrites another.
void write_outputs(const std::vector<std::string>& names, const NamedTensors& outputs,
                   const std::string& dir) {
  std::set<std::string> used;
  for (const std::string& name : names) {
    std::string base = sanitize_file_name(name), file = base;
    for (int i = 1; !used.insert(file).second; ++i) file = cat(base, "_", i);
    std::string path = (std::filesystem::path(dir) / (file + ".npy")).string();
    write_npy(path, outputs.at(name));
    std::cout << "wrote " << path << "\n";
  }
}

int run(const RunArgs& args) {
  apply_memory_limit(args.memory_limit);
  // Inputs given as files; their shapes also fix symbolic dims in the model.
  NamedTensors given;
  std::map<std::string, std::string> given_paths;
  for (const std::string& spec : args.inputs) {
    auto [name, path] = split_assignment(spec, "--input");
    if (given.count(name)) throw UsageError(cat("--input given twice for '", name, "'"));
    given[name] = read_tensor_any(path);
    given_paths[name] = path;
  }
  Graph g = import_model(args.model, parse_shape_specs(args.shapes), given);
  const Device device = parse_device(args.device);
  const Precision precision =
      args.precision.empty() ? Precision::f32 : parse_precision(args.precision);
  // The reference kernels run the model as imported: no pipeline, so no mixed precision.
  if (cpu_kernels_for(args.device) == CpuKernels::reference && device == Device::cpu &&
      (precision == Precision::bf16 || precision == Precision::f16))
    throw UsageError(cat("--precision ", args.precision,
                         " needs the inference pipeline: --device cpu or cuda (cpu-ref runs the "
                         "model as imported, in its own dtypes)"));
  if (!args.precision.empty()) set_float_math(precision);  // before the backend reads it
  if (args.autotune) set_conv_autotune(true);
  if (!args.output_dir.empty()) make_directory(args.output_dir);
  std::string input_names;
  for (ValueId v : g.inputs()) input_names += (input_names.empty() ? "" : ", ") + g.value(v).name;
  for (const auto& [name, t] : given) {
    auto v = g.find_value(name);
    bool is_input = v && std::find(g.inputs().begin(), g.inputs().end(), *v) != g.inputs().end();
    FUSEBOX_CHECK(is_input, "fusebox run", "--input names '", name,
                  "', which is not an input of the model (its inputs: ", input_names, ")");
  }

  NamedTensors feeds = given;
  for (ValueId v : g.inputs()) {
    const Value& in = g.value(v);
    std::cout << "input  " << in.name << ": ";
    auto it = given.find(in.name);
    if (it != given.end()) {
      std::cout << type_str(it->second) << " from " << given_paths[in.name] << "\n";
      continue;
    }
    feeds[in.name] = random_input(in.type.dtype, in.type.shape, args.seed, in.name);
    std::cout << type_str(feeds[in.name]) << " random (seed " << args.seed << ")\n";
  }

  // The graph the device runs: on CUDA and the fast CPU kernels the inference pipeline's
  // (folded, fused: the executable's graph()); on the reference CPU kernels the model as
  // imported.
  PipelineLog pipeline_log;
  const CpuKernels cpu_kernels = cpu_kernels_for(args.device);
  CompileOptions compile_opts{.device = device, .cpu_kernels = cpu_kernels, .poison = true};
  if (device == Device::cuda || cpu_kernels == CpuKernels::fast)
    compile_opts.pipeline = {.kind = PipelineKind::inference,
                             .precision = precision,
                             .fusion = InferenceFusionOptions::from_env(),
                             .log = &pipeline_log};
  const FusionLog& fusion_log = pipeline_log.fusion;
  auto start = std::chrono::steady_clock::now();
  // The executable stays, with --report to time each node after the run. The imported graph
  // goes into it (its weights freed once the pipeline has its own): only its names stay here.
  std::vector<std::string> output_names;
  for (ValueId v : g.outputs()) output_names.push_back(g.value(v).name);
  const std::string model_name = g.name();
  const std::unique_ptr<Executable> exe = Executable::compile(std::move(g), compile_opts);
  const Graph& run_g = exe->graph();
  if (!args.dot.empty())
    write_file_atomic(args.dot,
                      fusion_dot(run_g, fusion_log,
                                 device == Device::cuda ? LoweringDescriber(cuda::describe_lowering)
                                                        : cpu_lowering(run_g, cpu_kernels)));
  NamedTensors outputs = exe->run(feeds);
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  for (const std::string& name : output_names) {
    const Tensor& t = outputs.at(name);
    std::cout << "output " << name << ": " << type_str(t) << "  " << summarize(t) << "\n";
  }
  std::cout << "ran " << model_name << " on " << device_name(device) << " in " << std::fixed
            << std::setprecision(1) << ms << " ms (import excluded)\n";
  std::cout.unsetf(std::ios::floatfield);
  if (!args.output_dir.empty()) write_outputs(output_names, outputs, args.output_dir);
  if (args.report && device == Device::cuda) {
    std::cout << fusion_outcome(run_g, fusion_log, exe->report().convolutions);
    const LayoutPlan plan = plan_layouts(run_g, layout_policy_from_env());
    std::cout << plan.describe(run_g)
              << describe_copies(layout_copies(run_g, plan, exe->stats().read_through));
  }
  if (args.report && device == Device::cpu) std::cout << exe->stats().fast_summary;
  if (args.report) {
    const std::string table = format_conv_report(exe->report());
    std::cout << (table.empty() ? "no convolution ran on the GPU\n" : table);
    const std::vector<NodeTime> times = exe->profile(device == Device::cuda ? 10 : 1);
    std::cout << format_time_report(time_report(run_g, times, device, exe->report().convolutions),
                                    -1);
  }
  return 0;
}

}  // namespace

Command add_run_command(CLI::App& parent) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* app = parent.add_subcommand("run", "Run an ONNX model and print its outputs");
  app->add_option("model", args->model, "The model (.onnx)")->required()->type_name("MODEL.onnx");
  app->add_option("--device", args->device,
                  "cpu (the fast kernels where they take a node: oneDNN, the pointwise "
                  "interpreter), cpu-ref (the reference kernels "
                  "alone, exact), cuda, or auto (cuda when available, else cpu); default cpu")
      ->check(CLI::IsMember({"cpu", "cpu-ref", "cuda", "auto"}));
  app->add_option("--input", args->inputs,
                  "Feed an input from a .npy (or TensorProto .pb) file (repeatable). Inputs "
                  "not given get seeded random data: floats U(-1,1), integers 0..9, bools 0/1")
      ->type_name("NAME=FILE");
  add_shape_option(*app, &args->shapes);
  app->add_option("--output-dir", args->output_dir,
                  "Write each output to DIR/<name>.npy (name sanitised to [A-Za-z0-9._-])")
      ->type_name("DIR");
  app->add_option("--seed", args->seed, "Seed for the random inputs; default 0")
      ->check(seed_number());
  app->add_flag(
      "--report", args->report,
      "After the run, list the fusion groups and what each became (cuDNN graph, "
      "epilogue kernel and why), the values stored channels-last and the layout "
      "conversions, and each convolution with the path (cuDNN or the project's "
      "kernels: implicit GEMM, depthwise, direct), plan, workspace and reason it got; then "
      "each node's time, run again node by node (the slowest nodes, the time by op)");
  app->add_option("--dot", args->dot,
                  "Write the graph the device runs (fused on CUDA) as Graphviz to FILE")
      ->type_name("FILE");
  app->add_flag("--autotune", args->autotune,
                "Time cuDNN's candidate plans for each convolution and keep the fastest "
                "(as FUSEBOX_AUTOTUNE=1; tuned plans go to the disk plan cache)");
  app->add_option("--precision", args->precision,
                  "f32, tf32, bf16 or f16 (docs/mixed_precision.md): the inference pipeline's "
                  "precision, outputs in the model's dtypes; default f32 with the backend's own "
                  "TF32 settings (FUSEBOX_ALLOW_TF32)")
      ->check(CLI::IsMember({"f32", "tf32", "bf16", "f16"}));
  add_memory_limit_option(*app, &args->memory_limit);
  return {app, [args] { return run(*args); }};
}

}  // namespace fusebox::cli
