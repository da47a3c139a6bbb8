// The convolution plan caches and the recording of cuDNN convolutions: the in-memory LRU
// and the disk cache of plans (and refusals), the choice between the problem's lowerings,
// and the execution recorded on the encoder (cuDNN's native CUDA graph or a stream
// capture). cuDNN itself (graphs, heuristics, autotuning) is behind cudnn/plan.h.
//
// Lowerings (FUSEBOX_CONV_SUBSAMPLE_1X1, kernels/conv/problem.h). Each lowering is its own problem
// with its own key and cache entries. `1`: the subsampled view first, the standard
// lowering when cuDNN refuses it (no plan, or its plan fails to run). `auto` under
// autotuning: both tuned (or read back tuned), the faster runs, the other is the fallback.
//
// Fusion. A problem with a bias or an epilogue (kernels/conv/problem.h ConvFusion) gets the
// plan of the most fused graph cuDNN supports: epilogue, then bias, then none; the plan
// records how much it fused and why the more fused graphs were refused.
//
// Disk payload (inside DiskPlanCache's checked file): six text lines, then the
// serialized graph: "fusebox-conv-plan 1", "plan" or "refused", the engine name, how much
// of the epilogue the graph holds (0 none, 1 bias, 2 epilogue: the 1/0 "bias fused" of
// earlier files reads the same), the tuned time in ms (-1: none), the refusal reason (for a
// plan, why it is not more fused; often "").
#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>

#include "backends/cuda/cudnn/plan.h"
#include "backends/cuda/runtime/plan_cache.h"
#include "backends/cuda/runtime/settings.h"

namespace fusebox::cuda {

std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  while (!text.empty() && (text.back() == ' ' || text.back() == '\r')) text.pop_back();
  return text;
}

VariantPack variant_pack(const ConvOperands& t, ConvFusion fused) {
  VariantPack pack = {
      {kCudnnUidX, t.x->data()}, {kCudnnUidW, t.w->data()}, {kCudnnUidY, t.y->data()}};
  if (fused != ConvFusion::none && t.bias) pack[kCudnnUidBias] = t.bias->data();
  if (fused == ConvFusion::epilogue && t.residual) pack[kCudnnUidResidual] = t.residual->data();
  return pack;
}

namespace {

constexpr const char* kPayloadMagic = "fusebox-conv-plan 1";

// Process-wide caches (never destroyed: plans may be in use until exit).
struct PlanCaches {
  std::mutex mutex;
  std::unique_ptr<LruCache<EntryPtr>> memory;
  std::unique_ptr<DiskPlanCache> disk;
  std::filesystem::path disk_dir;
  ConvPlanStats stats;
};

PlanCaches& caches() {
  static PlanCaches* c = new PlanCaches;
  return *c;
}

// ---- disk payload -------------------------------------------------------------------

std::vector<uint8_t> encode_payload(const PlanEntry& e, const std::vector<uint8_t>& blob) {
  char tuned[32];
  std::snprintf(tuned, sizeof tuned, "%.6f", e.tuned_ms);
  const std::string head =
      cat(kPayloadMagic, "\n", e.graph ? "plan" : "refused", "\n", one_line(e.plan_name), "\n",
          int(e.fused), "\n", tuned, "\n", one_line(e.reason), "\n");
  std::vector<uint8_t> payload(head.begin(), head.end());
  payload.insert(payload.end(), blob.begin(), blob.end());
  return payload;
}

// The entry of a payload (graph deserialized); nullptr with `why` set when unusable.
EntryPtr decode_payload(const std::vector<uint8_t>& payload, cudnnHandle_t handle,
                        std::string& why) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (lines.size() < 6) {
    auto nl = std::find(payload.begin() + long(pos), payload.end(), uint8_t('\n'));
    if (nl == payload.end()) {
      why = "truncated header";
      return nullptr;
    }
    lines.emplace_back(payload.begin() + long(pos), nl);
    pos = size_t(nl - payload.begin()) + 1;
  }
  if (lines[0] != kPayloadMagic || (lines[1] != "plan" && lines[1] != "refused")) {
    why = "not a fusebox convolution plan";
    return nullptr;
  }
  auto e = std::make_shared<PlanEntry>();
  e->plan_name = lines[2];
  if (lines[3] != "0" && lines[3] != "1" && lines[3] != "2") {
    why = "bad fusion line";
    return nullptr;
  }
  e->fused = ConvFusion(lines[3][0] - '0');
  e->tuned_ms = std::atof(lines[4].c_str());
  e->reason = lines[5];
  if (lines[1] == "refused") return e;
  const std::vector<uint8_t> blob(payload.begin() + long(pos), payload.end());
  e->graph = deserialize_cudnn_plan(handle, blob, e->workspace, e->native_graph, why);
  if (!e->graph) return nullptr;
  e->warmed_up = true;  // deserialize() ran cuDNN's warm-up
  return e;
}

DiskPlanCache* disk_cache(PlanCaches& c, int device) {
  const std::filesystem::path& dir = settings().cache_dir;
  if (dir.empty()) return nullptr;
  if (!c.disk || c.disk_dir != dir) {
    c.disk = std::make_unique<DiskPlanCache>(dir / "conv", cudnn_cache_identity(device));
    c.disk_dir = dir;
  }
  return c.disk.get();
}

// ---- execution ----------------------------------------------------------------------

// Node counts of a CUDA graph by type, child graphs expanded.
struct NodeCounts {
  size_t kernels = 0, memsets = 0, memcpys = 0, others = 0;
  bool operator==(const NodeCounts&) const = default;
  std::string text() const {
    return cat(kernels, " kernels, ", memsets, " memsets, ", memcpys, " memcpys, ", others,
               " others");
  }
};

void count_nodes(cudaGraph_t graph, NodeCounts& counts) {
  size_t n = 0;
  FUSEBOX_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) FUSEBOX_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    FUSEBOX_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    switch (type) {
      case cudaGraphNodeTypeKernel:
        ++counts.kernels;
        break;
      case cudaGraphNodeTypeMemset:
        ++counts.memsets;
        break;
      case cudaGraphNodeTypeMemcpy:
        ++counts.memcpys;
        break;
      case cudaGraphNodeTypeGraph: {
        cudaGraph_t child = nullptr;
        FUSEBOX_CUDA_CHECK(cudaGraphChildGraphNodeGetGraph(node, &child));
        count_nodes(child, counts);
        break;
      }
      case cudaGraphNodeTypeEmpty:
        break;
      default:
        ++counts.others;
        break;
    }
  }
}

// cuDNN's native population of the plan against a stream capture of its execute, by node
// counts: the native graph must hold everything execute() issues (a zero-fill memset, say).
// Run once per plan; on a difference the plan is captured from then on, with a note.
bool native_matches_capture(Context& ctx, const ConvProblem& p, PlanEntry& e, VariantPack& pack,
                            void* workspace) {
  NodeCounts captured, native;
  cudaStream_t side = nullptr;
  FUSEBOX_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  FUSEBOX_CUDA_CHECK(cudaStreamBeginCapture(side, cudaStreamCaptureModeThreadLocal));
  bool executed = true;
  try {
    execute_cudnn_plan(*e.graph, ctx.device.cudnn_handle(side), pack, workspace);
  } catch (const std::exception&) {
    executed = false;
  }
  const cudaError_t ended = cudaStreamEndCapture(side, &graph);
  (void)cudaStreamDestroy(side);
  bool ok = executed && ended == cudaSuccess && graph != nullptr;
  if (ok) count_nodes(graph, captured);
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  if (ok) {
    FUSEBOX_CUDA_CHECK(cudaGraphCreate(&graph, 0));
    ok = populate_cudnn_graph(*e.graph, ctx.device.cudnn_handle(ctx.encoder.stream()), pack,
                              workspace, graph);
    if (ok) count_nodes(graph, native);
    (void)cudaGraphDestroy(graph);
  }
  if (ok && !(native == captured)) {
    std::fprintf(stderr,
                 "fusebox: note: cuDNN plan %s for %s: its native CUDA graph (%s) differs from "
                 "a capture of its execution (%s); recording it by stream capture\n",
                 e.plan_name.c_str(), p.describe().c_str(), native.text().c_str(),
                 captured.text().c_str());
    ok = false;
  }
  return ok;
}

// Adds the plan as a child graph that cuDNN's native CUDA-graph API populates; false when
// cuDNN declines to populate it (the caller then captures, and keeps capturing).
bool record_native(Context& ctx, PlanEntry& e, VariantPack& pack, void* workspace,
                   const BufferList& reads, const BufferList& writes) {
  cudaGraph_t graph = nullptr;
  FUSEBOX_CUDA_CHECK(cudaGraphCreate(&graph, 0));
  cudnnHandle_t handle = ctx.device.cudnn_handle(ctx.encoder.stream());
  if (!populate_cudnn_graph(*e.graph, handle, pack, workspace, graph)) {
    (void)cudaGraphDestroy(graph);
    e.native_graph = false;
    return false;
  }
  try {
    ctx.encoder.add_child_graph(reads, writes, graph);  // adds a copy
  } catch (...) {
    (void)cudaGraphDestroy(graph);
    throw;
  }
  (void)cudaGraphDestroy(graph);
  return true;
}

// ---- look-up and recording ----------------------------------------------------------

// The entry of problem `p` (key `key`): from memory, else from disk, else built and stored.
// A plan chosen by the heuristics is tuned once autotuning is asked for. c.mutex is held.
EntryPtr find_or_build(Context& ctx, PlanCaches& c, const ConvProblem& p, const std::string& key,
                       const ConvOperands& t, const ConvSettings& settings,
                       std::optional<double> beat_ms, bool& first_use) {
  EntryPtr entry;
  if (EntryPtr* hit = c.memory->find(key)) {
    entry = *hit;
    ++c.stats.memory_hits;
  }
  const auto untuned = [&] { return settings.autotune && entry->graph && entry->tuned_ms < 0; };
  if (entry && untuned()) entry = nullptr;
  if (entry) return entry;
  first_use = true;
  ++c.stats.problems;
  DiskPlanCache* disk = disk_cache(c, p.device);
  cudnnHandle_t handle = ctx.device.cudnn_handle(ctx.encoder.stream());
  if (disk) {
    if (auto payload = disk->load(key)) {
      std::string why;
      entry = decode_payload(*payload, handle, why);
      if (entry && untuned()) {
        entry = nullptr;  // rebuilt and tuned below, then stored over this one
      } else if (entry) {
        ++c.stats.disk_hits;
      } else {
        ++c.stats.disk_rejects;
        plan_cache_warning(cat("conv plan cache entry in ", disk->dir().string(), " for ",
                               p.describe(), " is unusable (", why, "); rebuilding it"));
      }
    } else {
      ++c.stats.disk_misses;
    }
  }
  if (!entry) {
    // The most fused graph first (the caller runs what the plan leaves of the epilogue).
    // A CUDA failure (fusebox::Error) propagates: it may have broken the context. An
    // exception of cudnn-frontend is a refusal for this process, not stored on disk.
    std::string refusal;
    if (p.has_epilogue()) refusal = p.epilogue_refusal().value_or("");
    if (refusal.empty() && p.refuse_fusion && p.bias.present) refusal = *p.epilogue_refusal();
    bool store = true;
    for (ConvFusion fused : p.fusions()) {
      try {
        entry = build_cudnn_plan(ctx, p, t, fused, settings, c.stats, beat_ms);
        entry->reason = refusal;
        break;
      } catch (const CudnnRefused& r) {
        refusal += (refusal.empty() ? "" : "; ") +
                   (fused == ConvFusion::none ? std::string()
                                              : cat("fused ", conv_fusion_name(fused), ": ")) +
                   r.message;
      } catch (const Error&) {
        throw;
      } catch (const std::exception& ex) {
        refusal += (refusal.empty() ? "" : "; ") + one_line(ex.what());
        store = false;
      }
    }
    if (!entry) {
      entry = std::make_shared<PlanEntry>();
      entry->reason = refusal;
      ++c.stats.refusals;
    }
    if (disk && (entry->graph || store)) {
      std::vector<uint8_t> blob;
      const bool ok = !entry->graph || serialize_cudnn_plan(*entry->graph, blob);
      static bool warned = false;
      if (!ok && !warned) {
        warned = true;
        plan_cache_warning(cat("a cuDNN plan (", p.describe(),
                               ") could not be serialized; such plans stay in memory only"));
      }
      if (ok && disk->store(key, encode_payload(*entry, blob))) ++c.stats.disk_writes;
    }
  }
  c.memory->insert(key, entry);
  return entry;
}

// Records the execution of `entry`'s plan (p's lowering) on the encoder. False, with
// `reason` set and the entry replaced by a refusal in memory (not on disk), when the plan
// does not run. c.mutex is held.
bool record_entry(Context& ctx, PlanCaches& c, const ConvProblem& p, const std::string& key,
                  const EntryPtr& entry, const ConvOperands& t, const ConvSettings& settings,
                  std::string& reason) {
  VariantPack pack = variant_pack(t, entry->fused);
  const BufferRange workspace = ctx.encoder.scratch(ctx.allocator, size_t(entry->workspace));
  BufferList reads, writes;
  switch (p.op) {
    case ConvOp::fprop:
      reads = {t.x->range(), t.w->range()}, writes = {t.y->range()};
      break;
    case ConvOp::dgrad:
      reads = {t.y->range(), t.w->range()}, writes = {t.x->range()};
      break;
    case ConvOp::wgrad:
      reads = {t.x->range(), t.y->range()}, writes = {t.w->range()};
      break;
  }
  if (entry->fused != ConvFusion::none && t.bias) reads.push_back(t.bias->range());
  if (entry->fused == ConvFusion::epilogue && t.residual) reads.push_back(t.residual->range());
  if (workspace.bytes > 0) writes.push_back(workspace);
  try {
    // This thread's handle exists before any capture (cudnnCreate cannot be captured).
    cudnnHandle_t handle = ctx.device.cudnn_handle(ctx.encoder.stream());
    if (!entry->warmed_up) {
      // One run outside any capture: loads the kernels, and a plan that cannot run is
      // found here rather than inside the recording.
      execute_cudnn_plan(*entry->graph, handle, pack, workspace.data());
      entry->warmed_up = true;
    }
    ctx.encoder.keep_alive(entry);
    bool native = false;
    if (entry->native_graph && settings.native_graph && ctx.encoder.options().use_graphs) {
      if (!entry->native_checked) {
        entry->native_checked = true;
        entry->native_graph = native_matches_capture(ctx, p, *entry, pack, workspace.data());
      }
      if (entry->native_graph) {
        native = record_native(ctx, *entry, pack, workspace.data(), reads, writes);
      }
    }
    if (native) {
      ++c.stats.native_graph_nodes;
    } else {
      CudnnGraph& graph = *entry->graph;
      ctx.encoder.capture_library_call(reads, writes, [&](cudaStream_t s) {
        execute_cudnn_plan(graph, ctx.device.cudnn_handle(s), pack, workspace.data());
      });
      ++c.stats.captured_calls;
    }
  } catch (const Error&) {
    throw;  // CUDA or the encoder failed: not the plan's doing
  } catch (const std::exception& ex) {
    // The plan does not run (a CudnnRefused, or cudnn-frontend threw): remember the refusal
    // for this process (not on disk).
    const CudnnRefused* r = dynamic_cast<const CudnnRefused*>(&ex);
    auto refused = std::make_shared<PlanEntry>();
    refused->reason = r ? r->message : cat("execute: ", one_line(ex.what()));
    c.memory->insert(key, refused);
    ++c.stats.refusals;
    reason = refused->reason;
    return false;
  }
  return true;
}

// One way to run the node: a lowering of its problem, its key and cache entry.
struct LoweredPlan {
  ConvProblem problem;
  std::string key;
  EntryPtr entry;
};

}  // namespace

CudnnConvOutcome cudnn_conv_record(Context& ctx, const ConvProblem& p, const ConvOperands& t,
                                   const ConvSettings& given, std::optional<double> beat_ms) {
  ConvSettings settings = given;
  if (p.forced_plan_index >= 0) settings.autotune = false;  // a diagnosis: that plan, untuned
  PlanCaches& c = caches();
  std::unique_lock<std::mutex> lock(c.mutex);
  CudnnConvOutcome outcome;
  if (!c.memory || c.memory->capacity() != settings.plan_cache_capacity) {
    c.memory = std::make_unique<LruCache<EntryPtr>>(settings.plan_cache_capacity, "conv plan cache",
                                                    "FUSEBOX_CONV_PLAN_CACHE");
  }
  // The lowerings to try, in order of preference (see the header comment).
  std::vector<LoweredPlan> plans;
  plans.push_back({p, conv_problem_key(p), nullptr});
  std::optional<ConvProblem> view =
      settings.subsample_1x1 == ConvSubsample::off ? std::nullopt : subsampled_1x1(p);
  if (view && (settings.subsample_1x1 == ConvSubsample::on || settings.autotune)) {
    const std::string key = conv_problem_key(*view);
    plans.insert(plans.begin(), {std::move(*view), key, nullptr});
  }
  const bool compare = plans.size() > 1 && settings.subsample_1x1 == ConvSubsample::automatic;
  if (compare) {
    // Both tuned: the faster first (a refusal counts as slowest).
    bool fresh = false;
    for (LoweredPlan& l : plans)
      l.entry = find_or_build(ctx, c, l.problem, l.key, t, settings, beat_ms, fresh);
    outcome.first_use = fresh;
    auto time_of = [](const LoweredPlan& l) { return l.entry->graph ? l.entry->tuned_ms : 1e30; };
    if (time_of(plans[1]) < time_of(plans[0])) std::swap(plans[0], plans[1]);
    if (fresh) {
      auto text = [&](const LoweredPlan& l) {
        return cat(conv_lowering_name(l.problem.lowering), " ",
                   l.entry->graph ? cat(l.entry->tuned_ms, " ms") : "refused");
      };
      std::fprintf(stderr, "fusebox: %s: lowerings tuned: %s, %s: runs %s\n", p.label.c_str(),
                   text(plans[0]).c_str(), text(plans[1]).c_str(),
                   conv_lowering_name(plans[0].problem.lowering));
    }
  }
  std::string standard_reason;
  for (LoweredPlan& l : plans) {
    bool fresh = false;
    if (!l.entry) l.entry = find_or_build(ctx, c, l.problem, l.key, t, settings, beat_ms, fresh);
    outcome.first_use = outcome.first_use || fresh;
    std::string reason = l.entry->reason;
    if (beat_ms && l.entry->graph && l.entry->tuned_ms > *beat_ms) {
      outcome.slower = true;
      outcome.plan = l.entry->plan_name;
      outcome.tuned_ms = l.entry->tuned_ms;
      outcome.reason = cat("autotuned plan ", l.entry->plan_name, " ", l.entry->tuned_ms,
                           " ms, slower than the project's kernel (", *beat_ms, " ms)");
      return outcome;
    }
    if (l.entry->graph && record_entry(ctx, c, l.problem, l.key, l.entry, t, settings, reason)) {
      outcome.ran = true;
      outcome.fused = l.entry->fused;
      outcome.reason = l.entry->reason;
      outcome.plan = l.entry->plan_name;
      outcome.lowering = l.problem.lowering;
      outcome.workspace_bytes = size_t(l.entry->workspace);
      outcome.tuned_ms = l.entry->tuned_ms;
      return outcome;
    }
    if (l.problem.lowering == ConvLowering::standard) standard_reason = reason;
  }
  outcome.reason = standard_reason;
  return outcome;
}

PlanCacheIdentity cudnn_cache_identity(int device) {
  const DeviceProperties& props = Device::get(device).properties();
  PlanCacheIdentity id;
  id.gpu_name = props.name;
  id.sm = props.compute_capability();
  id.cudnn_version = int64_t(cudnnGetVersion());
  id.frontend_version = cudnn_frontend_version();
  return id;
}

ConvPlanStats conv_plan_stats() {
  PlanCaches& c = caches();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

void reset_conv_plan_stats() {
  PlanCaches& c = caches();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.stats = ConvPlanStats{};
}

void clear_conv_plan_memory_cache() {
  PlanCaches& c = caches();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.memory) c.memory->clear();
}

}  // namespace fusebox::cuda
