// ResNet-50's convolutions on the CUDA backend (cuDNN through the graph API): forward,
// backward-data and backward-filter, bf16 and f32 (TF32), channels-last tensors, with the
// heuristics' plan and with the autotuned plan; then the plan-setup time for all of them
// cold (empty cache dir), with autotuning, and warm (disk cache: in this process with the
// in-memory cache cleared, and in a fresh process).
//
//   bench_conv [--json FILE] [--iters N] [--repeats N] [--targets] [--shapes NAME,...]
//              [--ops fprop,dgrad,wgrad] [--dtypes bf16,f32] [--knobs] [--no-autotune]
//              [--no-setup] [--own | --own-tiles] [--select]
//
// --depthwise: depthwise shapes (groups == C == K) instead: issue 14's 3x3 C256 at 56^2 and
// ConvNeXt-T's 7x7 layers.
// Shapes: the 23 distinct convolutions of torchvision's ResNet-50 (v1.5: stride on the 3x3)
// at N = 64, 224x224 input; names as in bench/torch_conv.py (which times PyTorch on the same
// shapes). --targets keeps the 8 shapes the issue has targets for; --shapes the named ones
// (e.g. --shapes l4_1x1s2_c1024k2048_14); --ops and --dtypes narrow further.
// --knobs: instead of heuristic vs autotuned, every plan-choice setting of the convolution
// path, each with empty caches (memory cleared, a fresh cache dir), with the plan chosen:
//   heuristic          FUSEBOX_AUTOTUNE=0 FUSEBOX_CONV_SUBSAMPLE_1X1=0
//   tuned_a_fb         autotuned over heuristics modes A+FALLBACK (MODE_B=0), SUBSAMPLE=0
//   tuned_a_b_fb       autotuned over modes A+B+FALLBACK (MODE_B=1), SUBSAMPLE=0
//   view_heuristic     SUBSAMPLE_1X1=1 (strided 1x1: stride-1 over a strided view), not tuned
//   view_tuned         SUBSAMPLE_1X1=1, autotuned (A+B+FALLBACK)
//   auto_tuned         SUBSAMPLE_1X1=auto, autotuned: both lowerings tuned, the faster kept
//   (the library's default with --autotune).
// Timing: `iters` calls of one op recorded into one CUDA graph (finish_recording), replayed
// `repeats` times between CUDA events; the median per call. The same tensors every call
// (as PyTorch's loop), random values; outputs separate from inputs.
// --own: each op also on the project's engines (FUSEBOX_CONV_BACKEND=own), with its ratio to
// cuDNN's fastest plan (heuristic or tuned; > 1: ours is faster) and a per-op summary
// (geometric mean, worst); --own-tiles times every engine and tile forced
// (FUSEBOX_CONV_ENGINE) too, skipping those that cannot run the problem.
// --select: each op also as the library runs it under autotuning with the backend unset
// (cuDNN's engines and our kernel timed, the faster recorded): which won, its time.
// FLOPs: 2 * N * K * Ho * Wo * C/g * R * S for each of the three ops.
// Setup: the wall time to record one call of each of the 69 problems (23 shapes x 3 ops,
// bf16), after synchronising: heuristics, plan builds, disk reads, warm-up runs. Counts of
// heuristics queries, autotuned problems and disk hits are printed with each phase.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/conv/report.h"
#include "common/cli.h"
#include "common/kernel_bench.h"
#include "common/report.h"
#include "fusebox/ir/graph.h"

namespace fusebox::cuda {
namespace {

using bench::KernelBench;

struct Options {
  std::string json;
  bench::TimingOptions timing{.iters = 20, .repeats = 7};
  bool targets_only = false;
  std::vector<std::string> shapes;  // --shapes: only these (empty: all, or the targets)
  std::vector<std::string> ops = {"fprop", "dgrad", "wgrad"};
  std::vector<std::string> dtypes = {"bf16", "f32"};
  bool knobs = false;
  bool setup = true;
  bool autotune = true;
  bool depthwise = false;  // --depthwise: the depthwise shapes instead of ResNet-50's
  bool own = false;        // --own: also the project's implicit GEMM (FUSEBOX_CONV_BACKEND=own)
  bool select = false;     // --select: also the autotuned choice between cuDNN and ours
  bool own_tiles = false;  // --own-tiles: ... with each of its tiles too
  std::string setup_child_dir;  // internal: measure warm setup in this fresh process
};

struct ConvShape {
  const char* name;
  int64_t c, k, hw, r, stride, pad;
  bool target;  // the issue names a PyTorch time for it
  int64_t groups = 1;
};

// The distinct convolutions of ResNet-50 (input 224x224): name, C, K, input H=W, R=S,
// stride, pad.
const ConvShape kShapes[] = {
    {"conv1_7x7s2_c3k64_224", 3, 64, 224, 7, 2, 3, true},
    {"l1_1x1_c64k64_56", 64, 64, 56, 1, 1, 0, false},
    {"l1_3x3_c64k64_56", 64, 64, 56, 3, 1, 1, true},
    {"l1_1x1_c64k256_56", 64, 256, 56, 1, 1, 0, true},
    {"l1_1x1_c256k64_56", 256, 64, 56, 1, 1, 0, false},
    {"l2_1x1_c256k128_56", 256, 128, 56, 1, 1, 0, false},
    {"l2_3x3s2_c128k128_56", 128, 128, 56, 3, 2, 1, false},
    {"l2_1x1_c128k512_28", 128, 512, 28, 1, 1, 0, false},
    {"l2_1x1s2_c256k512_56", 256, 512, 56, 1, 2, 0, false},
    {"l2_1x1_c512k128_28", 512, 128, 28, 1, 1, 0, false},
    {"l2_3x3_c128k128_28", 128, 128, 28, 3, 1, 1, true},
    {"l3_1x1_c512k256_28", 512, 256, 28, 1, 1, 0, false},
    {"l3_3x3s2_c256k256_28", 256, 256, 28, 3, 2, 1, false},
    {"l3_1x1_c256k1024_14", 256, 1024, 14, 1, 1, 0, false},
    {"l3_1x1s2_c512k1024_28", 512, 1024, 28, 1, 2, 0, false},
    {"l3_1x1_c1024k256_14", 1024, 256, 14, 1, 1, 0, true},
    {"l3_3x3_c256k256_14", 256, 256, 14, 3, 1, 1, true},
    {"l4_1x1_c1024k512_14", 1024, 512, 14, 1, 1, 0, false},
    {"l4_3x3s2_c512k512_14", 512, 512, 14, 3, 2, 1, false},
    {"l4_1x1_c512k2048_7", 512, 2048, 7, 1, 1, 0, false},
    {"l4_1x1s2_c1024k2048_14", 1024, 2048, 14, 1, 2, 0, false},
    {"l4_1x1_c2048k512_7", 2048, 512, 7, 1, 1, 0, false},
    {"l4_3x3_c512k512_7", 512, 512, 7, 3, 1, 1, true},
    // --depthwise: groups == C == K (issue 14's targets: the 3x3 at 56^2, ConvNeXt-T's 7x7s).
    {"dw3x3_c256_56", 256, 256, 56, 3, 1, 1, true, 256},
    {"dw3x3s2_c256_56", 256, 256, 56, 3, 2, 1, false, 256},
    {"dw7x7_c96_56", 96, 96, 56, 7, 1, 3, true, 96},
    {"dw7x7_c192_28", 192, 192, 28, 7, 1, 3, true, 192},
    {"dw7x7_c384_14", 384, 384, 14, 7, 1, 3, true, 384},
    {"dw7x7_c768_7", 768, 768, 7, 7, 1, 3, true, 768},
};
constexpr int64_t kBatch = 64;
const char* const kOpLabels[] = {"fprop", "dgrad", "wgrad"};  // the ops, in record_op's order

int64_t out_extent(const ConvShape& s) {
  return (s.hw + 2 * s.pad - s.r) / s.stride + 1;
}

double conv_flops(const ConvShape& s) {
  const double o = double(out_extent(s));
  return 2.0 * kBatch * double(s.k) * o * o * double(s.c / s.groups) * double(s.r * s.r);
}

struct Variant {
  std::string name;
  double ms = -1;
  std::string plan;
};

struct Result {
  std::string shape, op, dtype;
  double flops = 0;
  double heuristic_ms = -1, tuned_ms = -1;  // -1: not timed
  std::string heuristic_plan, tuned_plan;
  std::vector<Variant> variants;  // --knobs
  double own_ms = -1;             // --own: the implicit GEMM's fastest (heuristic tile or any)
  std::string own_plan;
  std::vector<Variant> own_variants;
  // --select: the library's default under autotuning (backend unset): cuDNN's engines and our
  // kernel timed, the faster run (kernels/conv/selection.h); which won and its time.
  double selected_ms = -1;
  std::string selected_path, selected_reason;

  double cudnn_best_ms() const {
    return tuned_ms > 0 && tuned_ms < heuristic_ms ? tuned_ms : heuristic_ms;
  }

  // TFLOP/s of a time in ms (-1 when not timed).
  double tflops(double ms) const { return ms > 0 ? flops / ms / 1e9 : -1; }
};

// A plan-choice setting of --knobs: environment values (nullptr: unset).
struct KnobSetting {
  const char* name;
  const char* autotune;
  const char* mode_b;
  const char* subsample;
};
const KnobSetting kKnobs[] = {
    {"heuristic", "0", "1", "0"},    {"tuned_a_fb", "1", "0", "0"},
    {"tuned_a_b_fb", "1", "1", "0"}, {"view_heuristic", "0", "1", "1"},
    {"view_tuned", "1", "1", "1"},   {"auto_tuned", "1", "1", "auto"},
};

bool contains(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

bool selected(const Options& o, const ConvShape& s) {
  if (!o.shapes.empty()) return contains(o.shapes, s.name);
  if (o.depthwise != (s.groups > 1)) return false;  // ResNet-50's, or --depthwise's
  return !o.targets_only || s.target;
}

const bench::Table::Columns kCaseColumns = {
    {"shape", 24, true}, {"op", 5, true}, {"dtype", 5, true}};

// The kernel-time tables: heuristic against autotuned, or every --knobs setting.
const bench::Table kTimesTable(bench::joined(kCaseColumns,
                                             {{"heuristic ms", 12},
                                              {"TFLOP/s", 8},
                                              {"tuned ms", 9},
                                              {"TFLOP/s", 8},
                                              {"plans: heuristic | tuned", 0, true}}));
const bench::Table kKnobsTable(bench::joined(
    kCaseColumns, {{"setting", 15, true}, {"ms", 9}, {"TFLOP/s", 8}, {"plan", 0, true}}));

struct SetupPhase {
  std::string name;
  double seconds = 0;
  ConvPlanStats stats;
};

// The tensors and nodes of one shape in one dtype.
struct ShapeSetup {
  DeviceTensor x, w, y, dx, dw, dy;
  Node nodes[3];
};

ShapeSetup make_setup(KernelBench& b, const ConvShape& s, DType dtype) {
  ShapeSetup st;
  const int64_t o = out_extent(s);
  const Shape xs = {kBatch, s.c, s.hw, s.hw}, ws = {s.k, s.c / s.groups, s.r, s.r},
              ys = {kBatch, s.k, o, o};
  ConvAttrs a;
  a.strides = {s.stride, s.stride};
  a.dilations = {1, 1};
  a.pads_begin = {s.pad, s.pad};
  a.pads_end = {s.pad, s.pad};
  a.groups = s.groups;
  Graph g("bench_conv");
  const ValueId x = g.add_input("x", dtype, xs), w = g.add_input("w", dtype, ws),
                dy = g.add_input("dy", dtype, ys);
  g.add_node(OpKind::conv, a, {x, w}, cat(s.name, ".fprop"));
  st.nodes[0] = g.nodes().back();
  g.add_node(OpKind::conv_backward_data, ConvBackwardDataAttrs{a, {s.hw, s.hw}}, {dy, w},
             cat(s.name, ".dgrad"));
  st.nodes[1] = g.nodes().back();
  g.add_node(OpKind::conv_backward_filter, ConvBackwardFilterAttrs{a, {s.r, s.r}}, {x, dy},
             cat(s.name, ".wgrad"));
  st.nodes[2] = g.nodes().back();
  // Channels-last tensors of random values in [-1, 1).
  auto random = [&](const Shape& shape, uint64_t seed) {
    return b.upload(bench::random_host(dtype, shape, seed, -1, 1), MemoryFormat::channels_last);
  };
  st.x = random(xs, 1);
  st.w = random(ws, 2);
  st.dy = random(ys, 3);
  st.y = random(ys, 4);
  st.dx = random(xs, 5);
  st.dw = random(ws, 6);
  return st;
}

void record_op(KernelBench& b, ShapeSetup& st, int op) {
  switch (op) {
    case 0: {
      std::vector<DeviceTensor> out = {st.y};
      conv_forward(b.ctx(), st.nodes[0], std::vector<const DeviceTensor*>{&st.x, &st.w}, out);
      break;
    }
    case 1: {
      std::vector<DeviceTensor> out = {st.dx};
      conv_backward_data(b.ctx(), st.nodes[1], std::vector<const DeviceTensor*>{&st.dy, &st.w},
                         out);
      break;
    }
    default: {
      std::vector<DeviceTensor> out = {st.dw};
      conv_backward_filter(b.ctx(), st.nodes[2], std::vector<const DeviceTensor*>{&st.x, &st.dy},
                           out);
      break;
    }
  }
}

// Median ms per call of one op, recorded `iters` times into a replayed graph.
double time_op_ms(KernelBench& b, const Options& o, ShapeSetup& st, int op) {
  return b.replay_us(o.timing, [&] { record_op(b, st, op); }) / 1e3;
}

// The plan (or path) the last call of `node_name` got.
std::string plan_of(const std::string& node_name) {
  std::string plan = "?";
  for (const ConvDecision& d : conv_decisions()) {
    if (d.node.find("'" + node_name + "'") != std::string::npos) {
      plan = d.plan == "direct" ? "direct: " + d.reason : d.plan;
    }
  }
  return plan;
}

// Records one call of every problem (all shapes x 3 ops, bf16), timing the plan setup.
SetupPhase setup_phase(KernelBench& b, const char* name, const Options& o) {
  std::vector<ShapeSetup> setups;
  for (const ConvShape& s : kShapes) {
    if (!selected(o, s)) continue;
    setups.push_back(make_setup(b, s, DType::bf16));
  }
  b.encoder().synchronize();
  reset_conv_plan_stats();
  const bench::Stopwatch watch;
  for (ShapeSetup& st : setups)
    for (int op = 0; op < 3; ++op) record_op(b, st, op);
  b.encoder().synchronize();
  SetupPhase phase;
  phase.name = name;
  phase.seconds = watch.seconds();
  phase.stats = conv_plan_stats();
  std::printf(
      "setup %-22s %8.3f s  (%llu heuristics queries, %llu autotuned, %llu disk hits, "
      "%llu memory hits)\n",
      name, phase.seconds, (unsigned long long)phase.stats.heuristics_queries,
      (unsigned long long)phase.stats.autotune_runs, (unsigned long long)phase.stats.disk_hits,
      (unsigned long long)phase.stats.memory_hits);
  return phase;
}

// Runs this program again in setup-child mode on `dir`; its warm setup phase.
SetupPhase fresh_process_setup(const std::string& dir, const Options& o) {
  SetupPhase phase;
  phase.name = "warm_fresh_process";
  phase.seconds = -1;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string shapes;
  for (const std::string& name : o.shapes) shapes += (shapes.empty() ? "" : ",") + name;
  const std::string command =
      cat("'", exe, "' --setup-child '", dir, "'", o.targets_only ? " --targets" : "",
          shapes.empty() ? "" : " --shapes " + shapes);
  std::fflush(nullptr);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return phase;
  char line[512];
  while (std::fgets(line, sizeof line, pipe)) {
    unsigned long long h = 0, a = 0, d = 0;
    double seconds = 0;
    if (std::sscanf(line, "SETUP_CHILD %lf %llu %llu %llu", &seconds, &h, &a, &d) == 4) {
      phase.seconds = seconds;
      phase.stats.heuristics_queries = h;
      phase.stats.autotune_runs = a;
      phase.stats.disk_hits = d;
    }
  }
  pclose(pipe);
  std::printf(
      "setup %-22s %8.3f s  (%llu heuristics queries, %llu autotuned, %llu disk hits; "
      "a new process, CUDA and cuDNN already initialised)\n",
      phase.name.c_str(), phase.seconds, (unsigned long long)phase.stats.heuristics_queries,
      (unsigned long long)phase.stats.autotune_runs, (unsigned long long)phase.stats.disk_hits);
  return phase;
}

int setup_child(const Options& o) {
  bench::set_setting("FUSEBOX_CACHE_DIR", o.setup_child_dir.c_str());
  bench::set_setting("FUSEBOX_AUTOTUNE", "0");
  KernelBench b(CommandEncoder::Options::from_env());       // graphs, as run()'s
  (void)b.ctx().device.cudnn_handle(b.encoder().stream());  // cuDNN initialised first
  const SetupPhase p = setup_phase(b, "warm_child", o);
  std::printf("SETUP_CHILD %.6f %llu %llu %llu\n", p.seconds,
              (unsigned long long)p.stats.heuristics_queries,
              (unsigned long long)p.stats.autotune_runs, (unsigned long long)p.stats.disk_hits);
  return 0;
}

std::string temp_dir(const char* tag) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / cat("fusebox_bench_conv_", tag, "_", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// Times one op of one shape under every --knobs setting, each with empty caches.
void time_knobs(KernelBench& b, const Options& o, ShapeSetup& st, int op, Result& r) {
  for (const KnobSetting& k : kKnobs) {
    const std::string dir = temp_dir(k.name);
    bench::set_setting("FUSEBOX_CACHE_DIR", dir.c_str());
    bench::set_setting("FUSEBOX_AUTOTUNE", k.autotune);
    bench::set_setting("FUSEBOX_CONV_AUTOTUNE_MODE_B", k.mode_b);
    bench::set_setting("FUSEBOX_CONV_SUBSAMPLE_1X1", k.subsample);
    clear_conv_plan_memory_cache();
    Variant v;
    v.name = k.name;
    v.ms = time_op_ms(b, o, st, op);
    v.plan = plan_of(st.nodes[op].name);
    kKnobsTable.print_row({r.shape, r.op, r.dtype, v.name, bench::fixed(v.ms, 4),
                           bench::fixed(r.tflops(v.ms), 1), v.plan});
    r.variants.push_back(v);
    std::filesystem::remove_all(dir);
  }
  bench::set_setting("FUSEBOX_CONV_AUTOTUNE_MODE_B", nullptr);
  bench::set_setting("FUSEBOX_CONV_SUBSAMPLE_1X1", nullptr);
  r.heuristic_ms = r.variants.front().ms, r.heuristic_plan = r.variants.front().plan;
  r.tuned_ms = r.variants.back().ms, r.tuned_plan = r.variants.back().plan;
}

// The project's engines (FUSEBOX_CONV_BACKEND=own): the default policy's choice, then
// (--own-tiles) each engine and tile forced (FUSEBOX_CONV_ENGINE), those that cannot run the
// problem skipped; the fastest against cuDNN's fastest (heuristic or tuned).
void time_own(KernelBench& b, const Options& o, ShapeSetup& st, int op, Result& r) {
  bench::set_setting("FUSEBOX_CONV_BACKEND", "own");
  std::vector<const char*> engines = {""};
  if (o.own_tiles)
    engines.insert(engines.end(),
                   {"implicit_gemm:128x128", "implicit_gemm:128x64", "implicit_gemm:64x128",
                    "implicit_gemm:64x64", "implicit_gemm:wg128x128", "implicit_gemm:wg128x64",
                    "cutlass:128x128", "cutlass:128x64", "cutlass:64x128", "halo_wgrad",
                    "patch_wgrad", "phase_dgrad", "space_to_depth", "im2col", "depthwise"});
  for (const char* engine : engines) {
    bench::set_setting("FUSEBOX_CONV_ENGINE", *engine ? engine : nullptr);
    Variant v;
    v.name = *engine ? engine : "heuristic";
    try {
      v.ms = time_op_ms(b, o, st, op);
    } catch (const Error& e) {
      b.encoder().discard_recording();  // what it recorded before refusing
      std::printf("    own %-23s cannot run it (%s)\n", v.name.c_str(), e.what());
      continue;
    }
    v.plan = plan_of(st.nodes[op].name);
    if (r.own_ms < 0 || v.ms < r.own_ms) r.own_ms = v.ms, r.own_plan = v.plan;
    std::printf("    own %-23s %9.4f ms %7.1f TFLOP/s  %.2fx cuDNN  %s\n", v.name.c_str(), v.ms,
                r.tflops(v.ms), r.cudnn_best_ms() / v.ms, v.plan.c_str());
    r.own_variants.push_back(v);
  }
  bench::set_setting("FUSEBOX_CONV_ENGINE", nullptr);
  bench::set_setting("FUSEBOX_CONV_BACKEND", "cudnn");
}

bench::Json result_json(const Result& r) {
  bench::Json row = bench::Json::object({{"shape", r.shape},
                                         {"op", r.op},
                                         {"dtype", r.dtype},
                                         {"flops", r.flops},
                                         {"heuristic_ms", r.heuristic_ms},
                                         {"heuristic_tflops", r.tflops(r.heuristic_ms)},
                                         {"tuned_ms", r.tuned_ms},
                                         {"tuned_tflops", r.tflops(r.tuned_ms)},
                                         {"heuristic_plan", r.heuristic_plan},
                                         {"tuned_plan", r.tuned_plan}});
  if (r.own_ms > 0) {
    row.set("own_ms", r.own_ms).set("own_plan", r.own_plan);
    row.set("own_tflops", r.tflops(r.own_ms));
    row.set("own_vs_cudnn", r.cudnn_best_ms() / r.own_ms);  // > 1: ours is faster
    bench::Json variants = bench::Json::array();
    for (const Variant& v : r.own_variants)
      variants.push(bench::Json::object({{"name", v.name}, {"ms", v.ms}, {"plan", v.plan}}));
    row.set("own_variants", std::move(variants));
  }
  if (r.selected_ms > 0) {
    row.set("selected_ms", r.selected_ms).set("selected_path", r.selected_path);
    row.set("selected_reason", r.selected_reason);
  }
  if (!r.variants.empty()) {
    bench::Json variants = bench::Json::array();
    for (const Variant& v : r.variants)
      variants.push(bench::Json::object({{"name", v.name}, {"ms", v.ms}, {"plan", v.plan}}));
    row.set("variants", std::move(variants));
  }
  return row;
}

bench::Json setup_json(const SetupPhase& p) {
  return bench::Json::object({{"phase", p.name},
                              {"seconds", p.seconds},
                              {"heuristics_queries", p.stats.heuristics_queries},
                              {"autotune_runs", p.stats.autotune_runs},
                              {"disk_hits", p.stats.disk_hits},
                              {"memory_hits", p.stats.memory_hits}});
}

int run(const Options& o) {
  // cuDNN's plans (depthwise problems would go to the project's kernels under auto).
  bench::set_setting("FUSEBOX_CONV_BACKEND", "cudnn");
  // Graphs (the executor's encoder settings): the ops are timed as recorded, replayed graphs.
  KernelBench b(CommandEncoder::Options::from_env());
  std::printf("device: %s, cudnn %zu\n", b.properties().describe().c_str(), cudnnGetVersion());
  std::vector<Result> results;

  // ---- kernel times -----------------------------------------------------------------
  const std::string timing_cache = temp_dir("timing");
  bench::set_setting("FUSEBOX_CACHE_DIR", timing_cache.c_str());
  (o.knobs ? kKnobsTable : kTimesTable).print_header();
  for (DType dtype : {DType::bf16, DType::f32}) {
    if (!contains(o.dtypes, dtype_name(dtype))) continue;
    for (const ConvShape& s : kShapes) {
      if (!selected(o, s)) continue;
      ShapeSetup st = make_setup(b, s, dtype);
      for (int op = 0; op < 3; ++op) {
        if (!contains(o.ops, kOpLabels[op])) continue;
        Result r;
        r.shape = s.name;
        r.op = kOpLabels[op];
        r.dtype = dtype_name(dtype);
        r.flops = conv_flops(s);
        if (o.knobs) {
          time_knobs(b, o, st, op, r);
          results.push_back(r);
          bench::set_setting("FUSEBOX_CACHE_DIR", timing_cache.c_str());
          continue;
        }
        const std::string node = st.nodes[op].name;
        bench::set_setting("FUSEBOX_AUTOTUNE", "0");
        r.heuristic_ms = time_op_ms(b, o, st, op);
        r.heuristic_plan = plan_of(node);
        if (o.autotune) {
          bench::set_setting("FUSEBOX_AUTOTUNE", "1");
          r.tuned_ms = time_op_ms(b, o, st, op);
          r.tuned_plan = plan_of(node);
        }
        kTimesTable.print_row({r.shape, r.op, r.dtype, bench::fixed(r.heuristic_ms, 4),
                               bench::fixed(r.tflops(r.heuristic_ms), 1),
                               bench::fixed(r.tuned_ms, 4), bench::fixed(r.tflops(r.tuned_ms), 1),
                               r.heuristic_plan + " | " + r.tuned_plan});
        if (o.own) time_own(b, o, st, op, r);
        if (o.select) {
          bench::set_setting("FUSEBOX_CONV_BACKEND", "auto");
          bench::set_setting("FUSEBOX_AUTOTUNE", "1");
          r.selected_ms = time_op_ms(b, o, st, op);
          for (const ConvDecision& d : conv_decisions())
            if (d.node.find("'" + node + "'") != std::string::npos)
              r.selected_path = d.path, r.selected_reason = d.reason;
          std::printf("    selected %-22s %9.4f ms  %.2fx cuDNN's best  [%s]\n",
                      r.selected_path.c_str(), r.selected_ms, r.cudnn_best_ms() / r.selected_ms,
                      r.selected_reason.c_str());
          bench::set_setting("FUSEBOX_CONV_BACKEND", "cudnn");
        }
        results.push_back(r);
      }
    }
  }
  bench::set_setting("FUSEBOX_AUTOTUNE", "0");
  std::filesystem::remove_all(timing_cache);
  if (o.own) {
    // The implicit GEMM against cuDNN's fastest plan, per op: the worst and the geometric mean.
    for (const char* op : kOpLabels) {
      double worst = 1e30, log_sum = 0;
      int count = 0;
      std::string worst_shape;
      for (const Result& r : results) {
        if (r.op != op || r.own_ms <= 0) continue;
        const double ratio = r.cudnn_best_ms() / r.own_ms;
        if (ratio < worst) worst = ratio, worst_shape = r.shape + " " + r.dtype;
        log_sum += std::log(ratio);
        ++count;
      }
      if (count > 0)
        std::printf("own vs cuDNN %s: geomean %.2fx, worst %.2fx (%s), %d problems\n", op,
                    std::exp(log_sum / count), worst, worst_shape.c_str(), count);
    }
  }

  // ---- plan setup ---------------------------------------------------------------------
  std::vector<SetupPhase> phases;
  const std::string cold_dir = temp_dir("cold"), tune_dir = temp_dir("tune");
  clear_conv_plan_memory_cache();
  if (o.setup) {
    bench::set_setting("FUSEBOX_CACHE_DIR", cold_dir.c_str());
    phases.push_back(setup_phase(b, "cold", o));
    clear_conv_plan_memory_cache();
    phases.push_back(setup_phase(b, "warm_memory_cleared", o));
    phases.push_back(setup_phase(b, "in_memory", o));
    phases.push_back(fresh_process_setup(cold_dir, o));
    if (o.autotune) {
      clear_conv_plan_memory_cache();
      bench::set_setting("FUSEBOX_CACHE_DIR", tune_dir.c_str());
      bench::set_setting("FUSEBOX_AUTOTUNE", "1");
      phases.push_back(setup_phase(b, "cold_autotune", o));
      bench::set_setting("FUSEBOX_AUTOTUNE", "0");
    }
  }
  std::filesystem::remove_all(cold_dir);
  std::filesystem::remove_all(tune_dir);

  bench::Json result_rows = bench::Json::array(), setup_rows = bench::Json::array();
  for (const Result& r : results) result_rows.push(result_json(r));
  for (const SetupPhase& p : phases) setup_rows.push(setup_json(p));
  bench::Json report = bench::report("conv");
  report.set("cudnn_version", cudnnGetVersion())
      .set("batch", kBatch)
      .set("layout", "channels_last")
      .set("results", std::move(result_rows))
      .set("setup", std::move(setup_rows));
  bench::write_report(o.json, report);
  return 0;
}

}  // namespace
}  // namespace fusebox::cuda

int main(int argc, char** argv) {
  namespace fc = fusebox::cuda;
  fc::Options o;
  fusebox::bench::Cli cli("bench_conv",
                          "ResNet-50's convolutions on the CUDA backend (cuDNN): kernel times "
                          "with the heuristics' and the autotuned plan, then plan-setup times",
                          o.json);
  cli.add_timing(o.timing);
  CLI::App& app = cli.app();
  std::vector<std::string> shape_names;
  for (const fc::ConvShape& s : fc::kShapes) shape_names.push_back(s.name);
  app.add_flag("--targets", o.targets_only, "Only the 8 shapes the issue has PyTorch targets for");
  app.add_option("--shapes", o.shapes, "Only these shapes (names as in bench/torch_conv.py)")
      ->type_name("NAME,...")
      ->delimiter(',')
      ->check(CLI::IsMember(shape_names));
  app.add_option("--ops", o.ops, "Only these ops")
      ->type_name("fprop,dgrad,wgrad")
      ->delimiter(',')
      ->check(CLI::IsMember({"fprop", "dgrad", "wgrad"}));
  app.add_option("--dtypes", o.dtypes, "Only these dtypes")
      ->type_name("bf16,f32")
      ->delimiter(',')
      ->check(CLI::IsMember({"bf16", "f32"}));
  app.add_flag("--knobs", o.knobs, "Every plan-choice setting, each with empty caches");
  app.add_flag("--depthwise", o.depthwise,
               "The depthwise shapes (3x3 at 56^2, ConvNeXt-T's 7x7s) instead of ResNet-50's");
  app.add_flag("--own", o.own,
               "Also time the project's implicit GEMM (FUSEBOX_CONV_BACKEND=own) against cuDNN");
  app.add_flag_callback(
      "--own-tiles", [&] { o.own = o.own_tiles = true; },
      "--own, with each engine and tile forced (FUSEBOX_CONV_ENGINE) too");
  app.add_flag("--select", o.select,
               "Also the library's autotuned choice between cuDNN and the project's kernels "
               "(FUSEBOX_CONV_BACKEND unset, FUSEBOX_AUTOTUNE=1)");
  app.add_flag_callback(
      "--no-autotune", [&] { o.autotune = false; }, "Only the heuristics' plans");
  app.add_flag_callback(
      "--no-setup", [&] { o.setup = false; }, "Skip the plan-setup phases");
  // Internal: the warm setup phase of a fresh process (fresh_process_setup runs it).
  app.add_option("--setup-child", o.setup_child_dir)->group("");
  return cli.run(argc, argv,
                 [&] { return o.setup_child_dir.empty() ? fc::run(o) : fc::setup_child(o); });
}
