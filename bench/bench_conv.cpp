// ResNet-50's convolutions on the CUDA backend (cuDNN through the graph API): forward,
// backward-data and backward-filter, bf16 and f32 (TF32), channels-last tensors, with the
// heuristics' plan and with the autotuned plan; then the plan-setup time for all of them
// cold (empty cache dir), with autotuning, and warm (disk cache: in this process with the
// in-memory cache cleared, and in a fresh process).
//
//   bench_conv [--json FILE] [--iters N] [--repeats N] [--targets] [--shapes NAME,...]
//              [--ops fprop,dgrad,wgrad] [--dtypes bf16,f32] [--knobs] [--no-autotune]
//              [--no-setup]
//
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
// FLOPs: 2 * N * K * Ho * Wo * C/g * R * S for each of the three ops.
// Setup: the wall time to record one call of each of the 69 problems (23 shapes x 3 ops,
// bf16), after synchronising: heuristics, plan builds, disk reads, warm-up runs. Counts of
// heuristics queries, autotuned problems and disk hits are printed with each phase.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/check.h"
#include "backends/cuda/conv_report.h"
#include "backends/cuda/kernels.h"
#include "fusebox/ir/graph.h"

namespace fusebox::cuda {
namespace {

struct Options {
  std::string json;
  int iters = 20;
  int repeats = 7;
  bool targets_only = false;
  std::vector<std::string> shapes;  // --shapes: only these (empty: all, or the targets)
  std::vector<std::string> ops = {"fprop", "dgrad", "wgrad"};
  std::vector<std::string> dtypes = {"bf16", "f32"};
  bool knobs = false;
  bool setup = true;
  bool autotune = true;
  std::string setup_child_dir;  // internal: measure warm setup in this fresh process
};

struct ConvShape {
  const char* name;
  int64_t c, k, hw, r, stride, pad;
  bool target;  // the issue names a PyTorch time for it
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
};
constexpr int64_t kBatch = 64;
const OpKind kOps[] = {OpKind::conv, OpKind::conv_backward_data, OpKind::conv_backward_filter};

const char* op_label(OpKind op) {
  return op == OpKind::conv ? "fprop" : op == OpKind::conv_backward_data ? "dgrad" : "wgrad";
}

int64_t out_extent(const ConvShape& s) {
  return (s.hw + 2 * s.pad - s.r) / s.stride + 1;
}

double conv_flops(const ConvShape& s) {
  const double o = double(out_extent(s));
  return 2.0 * kBatch * double(s.k) * o * o * double(s.c) * double(s.r * s.r);
}

Shape channels_last_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = shape[1];
  strides[1] = 1;
  for (size_t i = shape.size(); i-- > 2;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  strides[0] = stride;
  return strides;
}

void set_env(const char* name, const char* value) {
  setenv(name, value, 1);
}

struct Variant {
  std::string name;
  double ms = -1;
  std::string plan;
};

struct Result {
  std::string shape, op, dtype;
  double flops = 0;
  double heuristic_ms = -1, tuned_ms = -1;
  std::string heuristic_plan, tuned_plan;
  std::vector<Variant> variants;  // --knobs
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

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    if (comma > start) items.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return items;
}

// "" when every name of --shapes, --ops and --dtypes exists, else what does not.
std::string unknown_selection(const Options& o) {
  for (const std::string& name : o.shapes) {
    bool found = false;
    for (const ConvShape& s : kShapes) found = found || name == s.name;
    if (!found) return cat("no shape named '", name, "' (see bench/bench_conv.cpp kShapes)");
  }
  for (const std::string& op : o.ops)
    if (op != "fprop" && op != "dgrad" && op != "wgrad")
      return cat("--ops takes fprop, dgrad, wgrad, not '", op, "'");
  for (const std::string& t : o.dtypes)
    if (t != "bf16" && t != "f32") return cat("--dtypes takes bf16, f32, not '", t, "'");
  return "";
}

bool selected(const Options& o, const ConvShape& s) {
  if (!o.shapes.empty()) return contains(o.shapes, s.name);
  return !o.targets_only || s.target;
}

struct SetupPhase {
  std::string name;
  double seconds = 0;
  ConvPlanStats stats;
};

class Bench {
 public:
  Bench()
      : device_(Device::get(0)),
        allocator_(CachingAllocator::for_device(0)),
        encoder_(device_, CommandEncoder::Options::from_env(), &allocator_),
        ctx_{device_, encoder_, allocator_} {
    FUSEBOX_CUDA_CHECK(cudaEventCreate(&start_));
    FUSEBOX_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Bench() {
    encoder_.synchronize();
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
  }
  Context& ctx() { return ctx_; }
  CommandEncoder& encoder() { return encoder_; }
  const DeviceProperties& properties() const { return device_.properties(); }

  // A channels-last tensor of random values in [-1, 1).
  DeviceTensor random(DType dtype, const Shape& shape, uint64_t seed) {
    DeviceTensor t = DeviceTensor::empty(allocator_, dtype, shape);
    t.strides = channels_last_strides(shape);
    const int64_t n = t.numel();
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    if (dtype == DType::f32) {
      std::vector<float> host(static_cast<size_t>(n));
      for (float& v : host) v = dist(rng);
      encoder_.copy_to_device(t.buffer, host.data());
    } else {
      std::vector<BFloat16> host(static_cast<size_t>(n));
      for (BFloat16& v : host) v = BFloat16(dist(rng));
      encoder_.copy_to_device(t.buffer, host.data());
    }
    return t;
  }

  // Median ms per call of `record` (one call of the op) over repeats of a replayed graph
  // holding `iters` calls.
  template <class Record>
  double time_ms(const Options& o, Record&& record) {
    encoder_.synchronize();
    for (int i = 0; i < o.iters; ++i) record();
    RecordedGraph graph = encoder_.finish_recording();
    encoder_.replay(graph);  // warm-up
    encoder_.synchronize();
    std::vector<double> per_call;
    for (int r = 0; r < o.repeats; ++r) {
      FUSEBOX_CUDA_CHECK(cudaEventRecord(start_, encoder_.stream()));
      encoder_.replay(graph);
      FUSEBOX_CUDA_CHECK(cudaEventRecord(stop_, encoder_.stream()));
      FUSEBOX_CUDA_CHECK(cudaEventSynchronize(stop_));
      float ms = 0;
      FUSEBOX_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
      per_call.push_back(double(ms) / o.iters);
    }
    encoder_.synchronize();
    std::sort(per_call.begin(), per_call.end());
    return per_call[per_call.size() / 2];
  }

 private:
  Device& device_;
  CachingAllocator& allocator_;
  CommandEncoder encoder_;
  Context ctx_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// The tensors and nodes of one shape in one dtype.
struct ShapeSetup {
  DeviceTensor x, w, y, dx, dw, dy;
  Node nodes[3];
};

ShapeSetup make_setup(Bench& b, const ConvShape& s, DType dtype, bool with_tensors) {
  ShapeSetup st;
  const int64_t o = out_extent(s);
  const Shape xs = {kBatch, s.c, s.hw, s.hw}, ws = {s.k, s.c, s.r, s.r}, ys = {kBatch, s.k, o, o};
  ConvAttrs a;
  a.strides = {s.stride, s.stride};
  a.dilations = {1, 1};
  a.pads_begin = {s.pad, s.pad};
  a.pads_end = {s.pad, s.pad};
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
  if (with_tensors) {
    st.x = b.random(dtype, xs, 1);
    st.w = b.random(dtype, ws, 2);
    st.dy = b.random(dtype, ys, 3);
    st.y = b.random(dtype, ys, 4);
    st.dx = b.random(dtype, xs, 5);
    st.dw = b.random(dtype, ws, 6);
  }
  return st;
}

void record_op(Bench& b, ShapeSetup& st, int op) {
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

// The plan (or path) the last call of `node_name` got.
std::string plan_of(const std::string& node_name) {
  std::string plan = "?";
  for (const ConvDecision& d : conv_decisions()) {
    if (d.node.find("'" + node_name + "'") != std::string::npos) {
      plan = d.path == "own" ? "own: " + d.reason : d.plan;
    }
  }
  return plan;
}

// Records one call of every problem (all shapes x 3 ops, bf16), timing the plan setup.
SetupPhase setup_phase(Bench& b, const char* name, const Options& o) {
  std::vector<ShapeSetup> setups;
  for (const ConvShape& s : kShapes) {
    if (!selected(o, s)) continue;
    setups.push_back(make_setup(b, s, DType::bf16, true));
  }
  b.encoder().synchronize();
  reset_conv_plan_stats();
  const auto start = std::chrono::steady_clock::now();
  for (ShapeSetup& st : setups)
    for (int op = 0; op < 3; ++op) record_op(b, st, op);
  b.encoder().synchronize();
  SetupPhase phase;
  phase.name = name;
  phase.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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
  set_env("FUSEBOX_CACHE_DIR", o.setup_child_dir.c_str());
  set_env("FUSEBOX_AUTOTUNE", "0");
  Bench b;
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
void time_knobs(Bench& b, const Options& o, ShapeSetup& st, int op, Result& r) {
  for (const KnobSetting& k : kKnobs) {
    const std::string dir = temp_dir(k.name);
    set_env("FUSEBOX_CACHE_DIR", dir.c_str());
    set_env("FUSEBOX_AUTOTUNE", k.autotune);
    set_env("FUSEBOX_CONV_AUTOTUNE_MODE_B", k.mode_b);
    set_env("FUSEBOX_CONV_SUBSAMPLE_1X1", k.subsample);
    clear_conv_plan_memory_cache();
    Variant v;
    v.name = k.name;
    v.ms = b.time_ms(o, [&] { record_op(b, st, op); });
    v.plan = plan_of(st.nodes[op].name);
    std::printf("%-24s %-5s %-4s  %-15s %8.4f ms %7.1f TFLOP/s  %s\n", r.shape.c_str(),
                r.op.c_str(), r.dtype.c_str(), v.name.c_str(), v.ms, r.flops / v.ms / 1e9,
                v.plan.c_str());
    std::fflush(stdout);
    r.variants.push_back(v);
    std::filesystem::remove_all(dir);
  }
  unsetenv("FUSEBOX_CONV_AUTOTUNE_MODE_B");
  unsetenv("FUSEBOX_CONV_SUBSAMPLE_1X1");
  r.heuristic_ms = r.variants.front().ms, r.heuristic_plan = r.variants.front().plan;
  r.tuned_ms = r.variants.back().ms, r.tuned_plan = r.variants.back().plan;
}

int run(const Options& o) {
  set_env("FUSEBOX_CONV_BACKEND", "auto");
  Bench b;
  std::printf("device: %s, cudnn %zu\n", b.properties().describe().c_str(), cudnnGetVersion());
  std::vector<Result> results;

  // ---- kernel times -----------------------------------------------------------------
  const std::string timing_cache = temp_dir("timing");
  set_env("FUSEBOX_CACHE_DIR", timing_cache.c_str());
  for (DType dtype : {DType::bf16, DType::f32}) {
    if (!contains(o.dtypes, dtype == DType::f32 ? "f32" : "bf16")) continue;
    for (const ConvShape& s : kShapes) {
      if (!selected(o, s)) continue;
      ShapeSetup st = make_setup(b, s, dtype, true);
      for (int op = 0; op < 3; ++op) {
        if (!contains(o.ops, op_label(kOps[op]))) continue;
        Result r;
        r.shape = s.name;
        r.op = op_label(kOps[op]);
        r.dtype = dtype == DType::f32 ? "f32" : "bf16";
        r.flops = conv_flops(s);
        if (o.knobs) {
          time_knobs(b, o, st, op, r);
          results.push_back(r);
          set_env("FUSEBOX_CACHE_DIR", timing_cache.c_str());
          continue;
        }
        const std::string node = st.nodes[op].name;
        set_env("FUSEBOX_AUTOTUNE", "0");
        r.heuristic_ms = b.time_ms(o, [&] { record_op(b, st, op); });
        r.heuristic_plan = plan_of(node);
        if (o.autotune) {
          set_env("FUSEBOX_AUTOTUNE", "1");
          r.tuned_ms = b.time_ms(o, [&] { record_op(b, st, op); });
          r.tuned_plan = plan_of(node);
        }
        std::printf(
            "%-24s %-5s %-4s  heuristic %8.4f ms %7.1f TFLOP/s  tuned %8.4f ms %7.1f "
            "TFLOP/s  %s | %s\n",
            r.shape.c_str(), r.op.c_str(), r.dtype.c_str(), r.heuristic_ms,
            r.flops / r.heuristic_ms / 1e9, r.tuned_ms,
            r.tuned_ms > 0 ? r.flops / r.tuned_ms / 1e9 : 0.0, r.heuristic_plan.c_str(),
            r.tuned_plan.c_str());
        std::fflush(stdout);
        results.push_back(r);
      }
    }
  }
  set_env("FUSEBOX_AUTOTUNE", "0");
  std::filesystem::remove_all(timing_cache);

  // ---- plan setup ---------------------------------------------------------------------
  std::vector<SetupPhase> phases;
  const std::string cold_dir = temp_dir("cold"), tune_dir = temp_dir("tune");
  clear_conv_plan_memory_cache();
  if (o.setup) {
    set_env("FUSEBOX_CACHE_DIR", cold_dir.c_str());
    phases.push_back(setup_phase(b, "cold", o));
    clear_conv_plan_memory_cache();
    phases.push_back(setup_phase(b, "warm_memory_cleared", o));
    phases.push_back(setup_phase(b, "in_memory", o));
    phases.push_back(fresh_process_setup(cold_dir, o));
    if (o.autotune) {
      clear_conv_plan_memory_cache();
      set_env("FUSEBOX_CACHE_DIR", tune_dir.c_str());
      set_env("FUSEBOX_AUTOTUNE", "1");
      phases.push_back(setup_phase(b, "cold_autotune", o));
      set_env("FUSEBOX_AUTOTUNE", "0");
    }
  }
  std::filesystem::remove_all(cold_dir);
  std::filesystem::remove_all(tune_dir);

  if (!o.json.empty()) {
    std::ofstream f(o.json);
    if (!f) {
      std::fprintf(stderr, "bench_conv: cannot write %s\n", o.json.c_str());
      return 1;
    }
    f << "{\n  \"device\": \"" << b.properties().name
      << "\",\n  \"cudnn_version\": " << cudnnGetVersion() << ",\n  \"batch\": " << kBatch
      << ",\n  \"layout\": \"channels_last\""
      << ",\n  \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      f << "    {\"shape\": \"" << r.shape << "\", \"op\": \"" << r.op << "\", \"dtype\": \""
        << r.dtype << "\", \"flops\": " << r.flops << ", \"heuristic_ms\": " << r.heuristic_ms
        << ", \"heuristic_tflops\": " << r.flops / r.heuristic_ms / 1e9
        << ", \"tuned_ms\": " << r.tuned_ms
        << ", \"tuned_tflops\": " << (r.tuned_ms > 0 ? r.flops / r.tuned_ms / 1e9 : -1)
        << ", \"heuristic_plan\": \"" << r.heuristic_plan << "\", \"tuned_plan\": \""
        << r.tuned_plan << "\"";
      if (!r.variants.empty()) {
        f << ", \"variants\": [";
        for (size_t k = 0; k < r.variants.size(); ++k) {
          const Variant& v = r.variants[k];
          f << (k ? ", " : "") << "{\"name\": \"" << v.name << "\", \"ms\": " << v.ms
            << ", \"plan\": \"" << v.plan << "\"}";
        }
        f << "]";
      }
      f << "}" << (i + 1 < results.size() ? ",\n" : "\n");
    }
    f << "  ],\n  \"setup\": [\n";
    for (size_t i = 0; i < phases.size(); ++i) {
      const SetupPhase& p = phases[i];
      f << "    {\"phase\": \"" << p.name << "\", \"seconds\": " << p.seconds
        << ", \"heuristics_queries\": " << p.stats.heuristics_queries
        << ", \"autotune_runs\": " << p.stats.autotune_runs
        << ", \"disk_hits\": " << p.stats.disk_hits << ", \"memory_hits\": " << p.stats.memory_hits
        << "}" << (i + 1 < phases.size() ? ",\n" : "\n");
    }
    f << "  ]\n}\n";
  }
  return 0;
}

}  // namespace
}  // namespace fusebox::cuda

int main(int argc, char** argv) {
  fusebox::cuda::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) {
      o.json = argv[++i];
    } else if (arg == "--iters" && i + 1 < argc) {
      o.iters = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--repeats" && i + 1 < argc) {
      o.repeats = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--targets") {
      o.targets_only = true;
    } else if (arg == "--shapes" && i + 1 < argc) {
      o.shapes = fusebox::cuda::split_list(argv[++i]);
    } else if (arg == "--ops" && i + 1 < argc) {
      o.ops = fusebox::cuda::split_list(argv[++i]);
    } else if (arg == "--dtypes" && i + 1 < argc) {
      o.dtypes = fusebox::cuda::split_list(argv[++i]);
    } else if (arg == "--knobs") {
      o.knobs = true;
    } else if (arg == "--no-setup") {
      o.setup = false;
    } else if (arg == "--no-autotune") {
      o.autotune = false;
    } else if (arg == "--setup-child" && i + 1 < argc) {
      o.setup_child_dir = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: bench_conv [--json FILE] [--iters N] [--repeats N] [--targets] "
                   "[--shapes NAME,...] [--ops fprop,dgrad,wgrad] [--dtypes bf16,f32] [--knobs] "
                   "[--no-autotune] [--no-setup]\n");
      return 2;
    }
  }
  if (const std::string bad = fusebox::cuda::unknown_selection(o); !bad.empty()) {
    std::fprintf(stderr, "bench_conv: %s\n", bad.c_str());
    return 2;
  }
  try {
    return o.setup_child_dir.empty() ? fusebox::cuda::run(o) : fusebox::cuda::setup_child(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_conv: %s\n", e.what());
    return 1;
  }
}
