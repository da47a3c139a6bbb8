// The cuDNN / own selection's cache and our kernels' timing (selection.h).
//
// Disk payload (inside DiskPlanCache's checked file): eight text lines,
//   "fusebox-conv-select 2", "own" or "cudnn", our time in ms, cuDNN's time in ms (-1: none),
//   our plan, cuDNN's engine, our engine's name, "fused" or "unfused".
// Version 1 (six lines, no engine) is read as it was meant: own_engine empty, the default
// policy's engine (ConvSelection::own_engine). Any other version is refused with a warning and
// timed again.
#include "backends/cuda/kernels/conv/selection.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "backends/cuda/cudnn/conv.h"
#include "backends/cuda/runtime/check.h"
#include "backends/cuda/runtime/plan_cache.h"
#include "backends/cuda/runtime/settings.h"

namespace fusebox::cuda {

namespace {

constexpr const char* kMagic = "fusebox-conv-select 2";
constexpr const char* kMagicV1 = "fusebox-conv-select 1";

struct Selections {
  std::mutex mutex;
  std::unordered_map<std::string, ConvSelection> memory;
  std::unique_ptr<DiskPlanCache> disk;
  std::filesystem::path disk_dir;
};

Selections& selections() {
  static Selections* s = new Selections;  // never destroyed, as the plan caches
  return *s;
}

DiskPlanCache* disk_cache(Selections& s, int device) {
  const std::filesystem::path& dir = settings().cache_dir;
  if (dir.empty()) return nullptr;
  if (!s.disk || s.disk_dir != dir) {
    // cuDNN's identity: a decision against one cuDNN's engines is not one against another's.
    s.disk = std::make_unique<DiskPlanCache>(dir / "conv-select", cudnn_cache_identity(device));
    s.disk_dir = dir;
  }
  return s.disk.get();
}

std::optional<double> parse_ms(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(v >= -1) || v > 1e6)
    return std::nullopt;
  return v;
}

}  // namespace

std::optional<ConvSelection> decode_conv_selection(const std::vector<uint8_t>& bytes,
                                                   std::string& why) {
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  const bool v1 = lines.size() == 6 && lines[0] == kMagicV1;
  if (!v1 && (lines.size() != 8 || lines[0] != kMagic)) {
    why = lines.empty() || lines[0].rfind("fusebox-conv-select ", 0) != 0
              ? std::string("not a selection payload")
              : cat("a '", lines[0], "' payload of ", lines.size(), " lines; this build reads '",
                    kMagic, "' (8 lines) and '", kMagicV1, "' (6)");
    return std::nullopt;
  }
  ConvSelection s;
  if (lines[1] != "own" && lines[1] != "cudnn") {
    why = cat("winner '", lines[1], "'");
    return std::nullopt;
  }
  s.own = lines[1] == "own";
  const auto own_ms = parse_ms(lines[2]), cudnn_ms = parse_ms(lines[3]);
  if (!own_ms || !cudnn_ms || *own_ms < 0) {
    why = "malformed times";
    return std::nullopt;
  }
  s.own_ms = *own_ms, s.cudnn_ms = *cudnn_ms;
  s.own_plan = lines[4], s.cudnn_plan = lines[5];
  if (!v1) {
    if (lines[7] != "fused" && lines[7] != "unfused") {
      why = cat("form '", lines[7], "'");
      return std::nullopt;
    }
    s.own_engine = lines[6];
    s.own_unfused = lines[7] == "unfused";
  }
  return s;
}

std::string encode_conv_selection(const ConvSelection& s) {
  char own[32], cudnn[32];
  std::snprintf(own, sizeof own, "%.6f", s.own_ms);
  std::snprintf(cudnn, sizeof cudnn, "%.6f", s.cudnn_ms);
  auto flat = [](std::string t) {
    std::replace(t.begin(), t.end(), '\n', ' ');
    return t;
  };
  return cat(kMagic, "\n", s.own ? "own" : "cudnn", "\n", own, "\n", cudnn, "\n", flat(s.own_plan),
             "\n", flat(s.cudnn_plan), "\n", flat(s.own_engine), "\n",
             s.own_unfused ? "unfused" : "fused", "\n");
}

std::string ConvSelection::describe() const {
  auto ms = [](double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%.4f ms", v);
    return std::string(text);
  };
  const std::string engine =
      cat(own_engine.empty() ? "own" : own_engine, own_unfused ? " + epilogue kernel" : "");
  if (cudnn_ms < 0)
    return cat("autotuned: ", engine, " ", ms(own_ms), "; cuDNN had no plan that ran");
  const std::string mine = cat(engine, " ", ms(own_ms), " (", own_plan, ")");
  const std::string theirs = cat("cuDNN ", ms(cudnn_ms), " (", cudnn_plan, ")");
  return own ? cat("autotuned: ", mine, " < ", theirs) : cat("autotuned: ", theirs, " <= ", mine);
}

std::optional<ConvSelection> find_conv_selection(const ConvProblem& p) {
  Selections& s = selections();
  std::lock_guard<std::mutex> lock(s.mutex);
  const std::string key = conv_problem_key(p);
  if (auto it = s.memory.find(key); it != s.memory.end()) return it->second;
  DiskPlanCache* disk = disk_cache(s, p.device);
  if (disk == nullptr) return std::nullopt;
  const auto payload = disk->load(key);
  if (!payload) return std::nullopt;
  std::string why;
  std::optional<ConvSelection> found = decode_conv_selection(*payload, why);
  if (!found) {
    plan_cache_warning(cat("conv selection cache entry in ", disk->dir().string(), " for ",
                           p.describe(), " is unusable (", why, "); timing both again"));
    return std::nullopt;
  }
  s.memory[key] = *found;
  return found;
}

void store_conv_selection(const ConvProblem& p, const ConvSelection& sel) {
  Selections& s = selections();
  std::lock_guard<std::mutex> lock(s.mutex);
  const std::string key = conv_problem_key(p);
  s.memory[key] = sel;
  if (DiskPlanCache* disk = disk_cache(s, p.device)) {
    const std::string bytes = encode_conv_selection(sel);
    disk->store(key, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()),
                                              bytes.size()));
  }
}

void clear_conv_selections() {
  Selections& s = selections();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.memory.clear();
}

std::optional<double> time_own_conv(Context& ctx,
                                    const std::function<std::string(Context&)>& record,
                                    std::string& plan, double bound_ms) {
  if (!ctx.encoder.options().use_graphs) return std::nullopt;
  // A scratch encoder on the device's stream: its replays run after the work committed so
  // far (the main recording is not committed), on this node's output and temporaries of
  // its own; as cuDNN's autotuning does, it reads the inputs' current bytes.
  // kCalls calls in one graph, as bench_conv times ops (KernelBench::replay_us): a graph of
  // one call pays a graph launch per call, which a compiled executable's graph does not; a
  // plan of several nodes (a chunked wgrad) read 30% slower timed that way (session 13).
  // The calls write the same output, so the graph runs them one after another.
  constexpr int kCalls = 8;
  CommandEncoder scratch(ctx.device, ctx.encoder.options(), &ctx.allocator);
  Context scratch_ctx{ctx.device, scratch, ctx.allocator};
  try {
    for (int i = 0; i < kCalls; ++i) plan = record(scratch_ctx);
  } catch (...) {
    scratch.discard_recording();  // a half-recorded candidate must not run at destruction
    throw;
  }
  const RecordedGraph graph = scratch.finish_recording();
  const cudaStream_t stream = scratch.stream();
  cudaEvent_t start = nullptr, stop = nullptr;
  FUSEBOX_CUDA_CHECK(cudaEventCreate(&start));
  FUSEBOX_CUDA_CHECK(cudaEventCreate(&stop));
  auto timed = [&](int reps) {
    FUSEBOX_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < reps; ++i) scratch.replay(graph);
    FUSEBOX_CUDA_CHECK(cudaEventRecord(stop, stream));
    FUSEBOX_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    FUSEBOX_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return double(ms) / reps / kCalls;
  };
  // As cudnn/conv_graph.cpp's time_plan: one run sizes the measurement (~2 ms of work); one
  // over twice the bound already cannot win (the graph's instantiation loaded its kernels).
  const double first = timed(1);
  const double ms = first > 2 * bound_ms
                        ? first
                        : timed(int(std::clamp(2.0 / std::max(first * kCalls, 1e-3), 3.0, 50.0)));
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  scratch.synchronize();
  return ms;
}

}  // namespace fusebox::cuda
