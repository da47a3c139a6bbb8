// Pieces shared by the fusebox subcommands.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fusebox/core/tensor.h"
#include "fusebox/io/json.h"
#include "fusebox/passes/fusion.h"
#include "fusebox/passes/mixed_precision.h"
#include "fusebox/runtime/executable.h"
#include "fusebox/runtime/report.h"
#include "fusebox/zoo.h"

namespace fusebox::cli {

// project(VERSION) of the top-level CMakeLists.txt (tools/CMakeLists.txt passes it).
constexpr const char* kVersion = FUSEBOX_VERSION;

// A registered subcommand and what to do when it is the one given.
struct Command {
  CLI::App* app = nullptr;   // owned by the parent CLI::App
  std::function<int()> run;  // called after a successful parse; returns the exit code
};
Command add_run_command(CLI::App& parent);
Command add_inspect_command(CLI::App& parent);
Command add_zoo_command(CLI::App& parent);
Command add_train_command(CLI::App& parent);  // cmd_train.cpp
Command add_bench_command(CLI::App& parent);  // cmd_bench.cpp

// A usage mistake found after parsing (e.g. a missing NAME=VALUE '='): reported
// like CLI11's own parse errors, exit status 2.
struct UsageError : CLI::ParseError {
  explicit UsageError(const std::string& message) : CLI::ParseError("UsageError", message, 2) {}
};

// Whether a MODEL argument names an ONNX file (".onnx", or a path) rather than a zoo model.
bool is_onnx_path(const std::string& model);
// The MODEL argument's graph: the ONNX file imported with the --shape specs (`onnx_batch`: the
// extent of a symbolic batch dim they do not give, OnnxImportOptions::batch; for `training`,
// keeping the initializers' transforms as nodes: OnnxImportOptions::keep_parameter_transforms),
// or the zoo model built with `zoo`. Usage errors for options of the other kind: --shape for a
// zoo model, or `zoo_options_given` (--image-size, --num-classes) for an ONNX file.
Graph load_model_argument(const std::string& model, const std::vector<std::string>& shapes,
                          const ZooOptions& zoo, bool zoo_options_given, bool training = false,
                          std::optional<int64_t> onnx_batch = std::nullopt);

// Checks for numeric options (->check(...)) whose errors print plain numbers: "--steps: must be
// an integer from 1 to 2^63 - 1, got '0'" (CLI::PositiveNumber prints the largest double: 309
// digits). Integers are read strictly as decimal (CLI11 alone reads "010" as octal, "-1" as
// 2^64 - 1 for an unsigned option, and a number past 64 bits as the largest one) and handed on
// to CLI11 rewritten as plain decimal. An int option takes max <= INT_MAX.
CLI::Validator integer_range(int64_t min, int64_t max = std::numeric_limits<int64_t>::max());
CLI::Validator seed_number();  // an unsigned 64-bit integer: 0 to 2^64 - 1
// A finite number > 0 and <= max.
CLI::Validator positive_real(int64_t max);
// 2^63 - 1 as "2^63 - 1", 2^31 - 1 as "2^31 - 1", a power of two from 2^20 up as "2^30",
// anything else in decimal.
std::string plain_number(int64_t n);

// Adds the repeatable "--shape NAME=D0,D1,..." option (concrete shapes for inputs
// whose ONNX shapes have symbolic dims).
void add_shape_option(CLI::App& app, std::vector<std::string>* specs);
// Adds "--memory-limit BYTES" (512M, 8G, ...); apply_memory_limit sets it, for the host and
// the GPUs, before anything is allocated (a malformed value is a UsageError).
void add_memory_limit_option(CLI::App& app, std::string* limit);
void apply_memory_limit(const std::string& limit);
// Parses the --shape values; a malformed one is a UsageError.
std::map<std::string, Shape> parse_shape_specs(const std::vector<std::string>& specs);
// Splits "NAME=VALUE" at the first '='; `option` names the option for the error.
std::pair<std::string, std::string> split_assignment(const std::string& spec,
                                                     const std::string& option);

// Reads a tensor file: ONNX TensorProto for ".pb", numpy for anything else.
Tensor read_tensor_any(const std::string& path);

// Seeded random contents for an input that was not given: floats U(-1, 1), integers
// 0..9 (valid as indices or labels for any dim of extent >= 10), bools 0/1. The
// stream depends on the seed and the input's name only, so inputs are independent.
Tensor random_input(DType dtype, const Shape& shape, uint64_t seed, const std::string& name);

// A file name made from a value name: [A-Za-z0-9._-] kept, anything else '_', never
// empty and never starting with '.'.
std::string sanitize_file_name(const std::string& name);

// "min -1.2 max 3.4 mean 0.05 first [0.1, -0.2, 0.3, 0.4, 0.5, ...]"; also counts
// NaNs and infinities when there are any.
std::string summarize(const Tensor& t);

// "f32[1, 3, 224, 224]"
std::string type_str(const Tensor& t);
// 25557032 -> "25,557,032"
std::string with_commas(int64_t n);

// This machine's CPU as /proc/cpuinfo names it ("Intel(R) Xeon(R) ..."); "unknown" elsewhere.
std::string cpu_model();

// --precision's float math: f32 turns TF32 off for the CUDA backend's f32 convolutions and
// matmuls, tf32 (and bf16/f16, for what stays f32) turns it on (FUSEBOX_ALLOW_TF32 and
// FUSEBOX_ALLOW_TF32_MATMUL, read once per process: call before anything runs).
void set_float_math(Precision p);

// Each planned fusion group of `g` (prepared by passes/fusion.h with `log`) and what it
// became on the GPU: its convolution's row of `decisions` (Executable::report)
// (tools/fusebox/fusion_report.cpp).
std::string fusion_outcome(const Graph& g, const FusionLog& log,
                           const std::vector<ConvDecision>& decisions);

// What the CPU executable runs a node of `g` (prepared; kept alive by the caller) on, for
// `--report` and `--dot` on the CPU: the fast kernel's own words (oneDNN's primitive and the
// implementation it chose) where one takes the node, else the reference kernel and why not
// (cpu_fast::plan, made again for the report) (tools/fusebox/fusion_report.cpp).
LoweringDescriber cpu_lowering(const Graph& g, CpuKernels kernels);

// The time part of --report (tools/fusebox/time_report.cpp): Executable::profile()'s
// node times with what ran for each (a convolution: its row of `decisions`, Executable::report).
struct TimeRow {
  std::string node, op;
  double ms = 0;
  std::string ran;  // a convolution's path and plan, "generated kernel", ...
};
struct TimeReport {
  std::vector<TimeRow> rows;  // in the graph's order
  double total_ms = 0;
};
TimeReport time_report(const Graph& g, const std::vector<NodeTime>& times, Device device,
                       const std::vector<ConvDecision>& decisions);
// The `top` slowest nodes, the time by op, and the sum (beside `step_ms` when > 0).
std::string format_time_report(const TimeReport& r, double step_ms, size_t top = 25);
Json time_report_json(const TimeReport& r);

// "3.1416" for fixed(3.14159, 4)
std::string fixed(double value, int digits);

// Progress over steps first..last: one updating line with a bar on a terminal, else a line
// every `every` steps (and the last).
class Progress {
 public:
  Progress(int64_t first, int64_t last, int64_t every);
  // "step  12/100 [#####.....]  <text>"
  void update(int64_t step, const std::string& text);

 private:
  int64_t first_, last_, every_;
  bool tty_;
};

}  // namespace fusebox::cli
