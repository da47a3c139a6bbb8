// cuDNN convolution plans: lowering a ConvProblem to a cudnn-frontend graph, choosing and
// caching its plan (memory, disk), autotuning, and recording its execution. The one
// translation unit that includes cudnn_frontend.h (it costs ~30 s to compile).
//
// Graph per op (tensor uids fixed, so that a plan read back from disk takes the same
// variant pack): x = 1, w = 2, y = 3, bias = 4 (roles as in conv_problem.h).
//   fprop: y = conv_fprop(x, w) [+ bias]      dgrad: x = conv_dgrad(y, w) [+ bias]
//   wgrad: w = conv_wgrad(y, x)
// io dtype f32/f16/bf16, intermediate and compute f32. The bias is a [1, C, 1, 1] tensor
// added by a pointwise ADD on the convolution's f32 result; when no plan supports the
// fused graph, the plain one is built and the caller adds the bias with its own kernel.
//
// Disk payload (inside DiskPlanCache's checked file): six text lines, then the
// serialized graph: "fusebox-conv-plan 1", "plan" or "refused", the engine name, 1/0 bias
// fused, the tuned time in ms (-1: none), the refusal reason ("" for plans).
#include <cudnn_frontend.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "backends/cuda/conv_cudnn.h"
#include "backends/cuda/env.h"
#include "backends/cuda/plan_cache.h"

namespace fusebox::cuda {

namespace fe = cudnn_frontend;

namespace {

constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3, kUidBias = 4;
constexpr size_t kMaxAutotunePlans = 32;  // candidates timed per problem, in heuristic order
constexpr const char* kPayloadMagic = "fusebox-conv-plan 1";

// A problem's cached outcome: a built plan (graph) or the reason cuDNN cannot run it.
struct PlanEntry {
  std::shared_ptr<fe::graph::Graph> graph;  // null: refused
  std::string reason;                       // why refused
  std::string plan_name;
  bool bias_fused = false;
  bool native_graph = false;    // SUPPORTS_CUDA_GRAPH_NATIVE_API (and the check below agrees)
  bool native_checked = false;  // native population compared with a capture once
  bool warmed_up = false;       // has run once outside a capture
  int64_t workspace = 0;
  double tuned_ms = -1;
};
using EntryPtr = std::shared_ptr<PlanEntry>;

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

// A refusal from cuDNN (the graph is unsupported): worth caching, also on disk.
struct Refused : std::exception {
  explicit Refused(std::string m) : message(std::move(m)) {}
  const char* what() const noexcept override { return message.c_str(); }
  std::string message;
};

std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  while (!text.empty() && (text.back() == ' ' || text.back() == '\r')) text.pop_back();
  return text;
}

void check_fe(fe::error_t status, const char* step) {
  if (status.is_bad()) throw Refused{cat(step, ": ", one_line(status.get_message()))};
}

fe::DataType_t fe_type(DType t) {
  switch (t) {
    case DType::f32:
      return fe::DataType_t::FLOAT;
    case DType::f16:
      return fe::DataType_t::HALF;
    case DType::bf16:
      return fe::DataType_t::BFLOAT16;
    default:
      throw Refused{cat("no cuDNN type for ", dtype_name(t))};
  }
}

template <class Attributes>
Attributes geometry(const ConvProblem& p) {
  Attributes a;
  a.set_pre_padding(p.pad_lo)
      .set_post_padding(p.pad_hi)
      .set_stride(p.stride)
      .set_dilation(p.dilation)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return a;
}

// The operation graph of the problem (not yet validated or built).
std::shared_ptr<fe::graph::Graph> make_graph(const ConvProblem& p, bool with_bias) {
  auto g = std::make_shared<fe::graph::Graph>();
  const fe::DataType_t io = fe_type(p.x.dtype);
  g->set_io_data_type(io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto attributes = [&](const char* name, int64_t uid, const ConvTensor& t) {
    return fe::graph::Tensor_attributes()
        .set_name(name)
        .set_uid(uid)
        .set_dim(t.dims)
        .set_stride(t.strides)
        .set_data_type(io)
        .set_alignment(std::min<int64_t>(t.alignment, 16));
  };
  auto make_output = [&](std::shared_ptr<fe::graph::Tensor_attributes>& out, const char* name,
                         int64_t uid, const ConvTensor& t) {
    out->set_name(name)
        .set_uid(uid)
        .set_dim(t.dims)
        .set_stride(t.strides)
        .set_data_type(io)
        .set_alignment(std::min<int64_t>(t.alignment, 16))
        .set_output(true);
  };
  std::shared_ptr<fe::graph::Tensor_attributes> result;
  const ConvTensor* out = nullptr;
  int64_t out_uid = 0;
  switch (p.op) {
    case ConvOp::fprop: {
      auto x = g->tensor(attributes("x", kUidX, p.x));
      auto w = g->tensor(attributes("w", kUidW, p.w));
      result = g->conv_fprop(x, w, geometry<fe::graph::Conv_fprop_attributes>(p));
      out = &p.y, out_uid = kUidY;
      break;
    }
    case ConvOp::dgrad: {
      auto dy = g->tensor(attributes("dy", kUidY, p.y));
      auto w = g->tensor(attributes("w", kUidW, p.w));
      result = g->conv_dgrad(dy, w, geometry<fe::graph::Conv_dgrad_attributes>(p));
      out = &p.x, out_uid = kUidX;
      break;
    }
    case ConvOp::wgrad: {
      auto dy = g->tensor(attributes("dy", kUidY, p.y));
      auto x = g->tensor(attributes("x", kUidX, p.x));
      result = g->conv_wgrad(dy, x, geometry<fe::graph::Conv_wgrad_attributes>(p));
      out = &p.w, out_uid = kUidW;
      break;
    }
  }
  if (!with_bias) {
    make_output(result, "out", out_uid, *out);
    return g;
  }
  // The convolution's f32 result stays virtual; bias [1, C, 1, 1] is added to it.
  result->set_dim(out->dims).set_stride(out->strides).set_data_type(fe::DataType_t::FLOAT);
  const int64_t channels = out->dims[1],
                bias_stride = p.bias.strides.empty() ? 1 : p.bias.strides[0];
  std::vector<int64_t> bias_dims(out->dims.size(), 1),
      bias_strides(out->dims.size(), channels * bias_stride);
  bias_dims[1] = channels;
  bias_strides[1] = bias_stride;
  ConvTensor bias = p.bias;
  bias.dims = bias_dims;
  bias.strides = bias_strides;
  auto b = g->tensor(attributes("bias", kUidBias, bias));
  auto sum = g->pointwise(result, b,
                          fe::graph::Pointwise_attributes()
                              .set_mode(fe::PointwiseMode_t::ADD)
                              .set_compute_data_type(fe::DataType_t::FLOAT));
  make_output(sum, "out", out_uid, *out);
  return g;
}

std::vector<fe::NumericalNote_t> barred_notes(const ConvProblem& p) {
  std::vector<fe::NumericalNote_t> notes = {fe::NumericalNote_t::DOWN_CONVERT_INPUTS};
  if (p.x.dtype == DType::f32 && !p.allow_tf32) notes.push_back(fe::NumericalNote_t::TENSOR_CORE);
  if (p.deterministic) notes.push_back(fe::NumericalNote_t::NONDETERMINISTIC);
  return notes;
}

// Pointers of the variant pack, by uid.
std::unordered_map<int64_t, void*> variant_pack(const ConvOperands& t, bool with_bias) {
  std::unordered_map<int64_t, void*> pack = {
      {kUidX, t.x->data()}, {kUidW, t.w->data()}, {kUidY, t.y->data()}};
  if (with_bias) pack[kUidBias] = t.bias->data();
  return pack;
}

// Times plan `index` on the stream (real tensors, its own workspace); < 0 when it fails.
double time_plan(Context& ctx, fe::graph::Graph& g, int64_t index, cudnnHandle_t handle,
                 std::unordered_map<int64_t, void*>& pack, cudaStream_t stream) {
  const int64_t ws_bytes = g.get_workspace_size_plan_at_index(index);
  DeviceBuffer workspace = ctx.allocator.allocate(size_t(std::max<int64_t>(ws_bytes, 0)));
  if (g.execute_plan_at_index(handle, pack, workspace.data(), index).is_bad()) return -1;
  cudaEvent_t start = nullptr, stop = nullptr;
  FUSEBOX_CUDA_CHECK(cudaEventCreate(&start));
  FUSEBOX_CUDA_CHECK(cudaEventCreate(&stop));
  auto timed = [&](int reps) {
    FUSEBOX_CUDA_CHECK(cudaEventRecord(start, stream));
    bool ok = true;
    for (int i = 0; i < reps && ok; ++i)
      ok = g.execute_plan_at_index(handle, pack, workspace.data(), index).is_good();
    FUSEBOX_CUDA_CHECK(cudaEventRecord(stop, stream));
    FUSEBOX_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    FUSEBOX_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ok ? double(ms) / reps : -1.0;
  };
  // One run to size the measurement (~2 ms of work, 3 to 50 runs), then the measurement.
  const double first = timed(1);
  double ms = first;
  if (first >= 0) ms = timed(int(std::clamp(2.0 / std::max(first, 1e-3), 3.0, 50.0)));
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  // The workspace goes back to the cache only after the stream is done with it.
  FUSEBOX_CUDA_CHECK(cudaStreamSynchronize(stream));
  return ms;
}

std::string plan_name_at(fe::graph::Graph& g, int64_t index) {
  std::string name;
  if (g.get_plan_name_at_index(index, name).is_bad()) return "?";
  return name;
}

bool supports_native_graph(fe::graph::Graph& g) {
  std::vector<fe::BehaviorNote_t> notes;
  if (g.get_behavior_notes(notes).is_bad()) return false;
  return std::find(notes.begin(), notes.end(),
                   fe::BehaviorNote_t::SUPPORTS_CUDA_GRAPH_NATIVE_API) != notes.end();
}

// Builds the plan of one graph variant: heuristics (A, FALLBACK), notes filtered, then the
// heuristics' first buildable plan or, autotuning, the fastest candidate. Throws Refused.
EntryPtr build_entry(Context& ctx, const ConvProblem& p, const ConvOperands& t, bool with_bias,
                     bool autotune, ConvPlanStats& stats) {
  cudaStream_t stream = ctx.encoder.stream();
  cudnnHandle_t handle = ctx.device.cudnn_handle(stream);
  auto g = make_graph(p, with_bias);
  check_fe(g->validate(), "validate");
  check_fe(g->build_operation_graph(handle), "build_operation_graph");
  ++stats.heuristics_queries;
  check_fe(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "heuristics");
  g->deselect_numeric_notes(barred_notes(p));
  check_fe(g->check_support(), "check_support");
  auto entry = std::make_shared<PlanEntry>();
  entry->bias_fused = with_bias;
  if (!autotune) {
    check_fe(g->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans");
  } else {
    ++stats.autotune_runs;
    auto pack = variant_pack(t, with_bias);
    const auto start = std::chrono::steady_clock::now();
    const int64_t count = std::min<int64_t>(g->get_execution_plan_count(), kMaxAutotunePlans);
    int64_t best = -1, first = -1, timed = 0;
    double best_ms = 0, first_ms = 0;
    for (int64_t i = 0; i < count; ++i) {
      if (g->build_plan_at_index(i).is_bad()) continue;
      const double ms = time_plan(ctx, *g, i, handle, pack, stream);
      if (ms < 0) continue;
      ++timed;
      if (first < 0) first = i, first_ms = ms;
      if (best < 0 || ms < best_ms) best = i, best_ms = ms;
    }
    if (best < 0) throw Refused{"autotune: no candidate plan built and ran"};
    check_fe(g->build_plan_at_index(best), "build_plan_at_index");
    entry->tuned_ms = best_ms;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr,
                 "fusebox: autotuned %s: %s: %lld of %lld plans timed in %.2f s; best %s "
                 "%.4f ms (heuristics' first %.4f ms)\n",
                 p.label.c_str(), p.describe().c_str(), (long long)timed,
                 (long long)g->get_execution_plan_count(), seconds, plan_name_at(*g, best).c_str(),
                 best_ms, first_ms);
    entry->warmed_up = true;
  }
  if (g->get_plan_name(entry->plan_name).is_bad()) entry->plan_name = "?";
  int64_t ws = 0;
  check_fe(g->get_workspace_size(ws), "get_workspace_size");
  entry->workspace = ws;
  entry->native_graph = supports_native_graph(*g);
  entry->graph = std::move(g);
  ++stats.plans_built;
  return entry;
}

// ---- disk payload -------------------------------------------------------------------

std::vector<uint8_t> encode_payload(const PlanEntry& e, const std::vector<uint8_t>& blob) {
  char tuned[32];
  std::snprintf(tuned, sizeof tuned, "%.6f", e.tuned_ms);
  const std::string head =
      cat(kPayloadMagic, "\n", e.graph ? "plan" : "refused", "\n", one_line(e.plan_name), "\n",
          e.bias_fused ? 1 : 0, "\n", tuned, "\n", one_line(e.reason), "\n");
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
  e->bias_fused = lines[3] == "1";
  e->tuned_ms = std::atof(lines[4].c_str());
  e->reason = lines[5];
  if (lines[1] == "refused") return e;
  std::vector<uint8_t> blob(payload.begin() + long(pos), payload.end());
  auto g = std::make_shared<fe::graph::Graph>();
  try {
    fe::error_t status = g->deserialize(handle, blob);
    if (status.is_bad()) {
      why = cat("deserialize: ", one_line(status.get_message()));
      return nullptr;
    }
    int64_t ws = 0;
    if (g->get_workspace_size(ws).is_bad()) {
      why = "deserialized plan has no workspace size";
      return nullptr;
    }
    e->workspace = ws;
    e->native_graph = supports_native_graph(*g);
  } catch (const std::exception& ex) {
    why = cat("deserialize: ", one_line(ex.what()));
    return nullptr;
  }
  e->graph = std::move(g);
  e->warmed_up = true;  // deserialize() ran cuDNN's warm-up
  return e;
}

DiskPlanCache* disk_cache(PlanCaches& c, int device) {
  const std::filesystem::path dir = default_cache_dir();
  if (dir.empty()) return nullptr;
  if (!c.disk || c.disk_dir != dir) {
    const DeviceProperties& props = Device::get(device).properties();
    PlanCacheIdentity id;
    id.gpu_name = props.name;
    id.sm = props.compute_capability();
    id.cudnn_version = int64_t(cudnnGetVersion());
    id.frontend_version = cudnn_frontend_version();
    c.disk = std::make_unique<DiskPlanCache>(dir / "conv", id);
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
bool native_matches_capture(Context& ctx, const ConvProblem& p, PlanEntry& e,
                            std::unordered_map<int64_t, void*>& pack, void* workspace) {
  NodeCounts captured, native;
  cudaStream_t side = nullptr;
  FUSEBOX_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  FUSEBOX_CUDA_CHECK(cudaStreamBeginCapture(side, cudaStreamCaptureModeThreadLocal));
  const fe::error_t status = e.graph->execute(ctx.device.cudnn_handle(side), pack, workspace);
  const cudaError_t ended = cudaStreamEndCapture(side, &graph);
  (void)cudaStreamDestroy(side);
  bool ok = status.is_good() && ended == cudaSuccess && graph != nullptr;
  if (ok) count_nodes(graph, captured);
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  if (ok) {
    FUSEBOX_CUDA_CHECK(cudaGraphCreate(&graph, 0));
    ok = e.graph
             ->populate_cuda_graph(ctx.device.cudnn_handle(ctx.encoder.stream()), pack, workspace,
                                   graph)
             .is_good();
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
bool record_native(Context& ctx, PlanEntry& e, std::unordered_map<int64_t, void*>& pack,
                   void* workspace, const BufferList& reads, const BufferList& writes) {
  cudaGraph_t graph = nullptr;
  FUSEBOX_CUDA_CHECK(cudaGraphCreate(&graph, 0));
  cudnnHandle_t handle = ctx.device.cudnn_handle(ctx.encoder.stream());
  fe::error_t status = e.graph->populate_cuda_graph(handle, pack, workspace, graph);
  if (status.is_bad()) {
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

}  // namespace

std::string cudnn_frontend_version() {
  return cat(CUDNN_FRONTEND_MAJOR_VERSION, ".", CUDNN_FRONTEND_MINOR_VERSION, ".",
             CUDNN_FRONTEND_PATCH_VERSION);
}

CudnnConvOutcome cudnn_conv_record(Context& ctx, const ConvProblem& p, const ConvOperands& t,
                                   const ConvSettings& settings) {
  PlanCaches& c = caches();
  std::unique_lock<std::mutex> lock(c.mutex);
  CudnnConvOutcome outcome;
  const std::string key = conv_problem_key(p);
  if (!c.memory || c.memory->capacity() != settings.plan_cache_capacity) {
    c.memory = std::make_unique<LruCache<EntryPtr>>(settings.plan_cache_capacity, "conv plan cache",
                                                    "FUSEBOX_CONV_PLAN_CACHE");
  }
  EntryPtr entry;
  if (EntryPtr* hit = c.memory->find(key)) {
    entry = *hit;
    ++c.stats.memory_hits;
  }
  // A plan chosen by the heuristics is tuned once autotuning is asked for.
  const auto untuned = [&] { return settings.autotune && entry->graph && entry->tuned_ms < 0; };
  if (entry && untuned()) entry = nullptr;
  if (!entry) {
    outcome.first_use = true;
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
      // Fused bias first, then the plain graph (the caller adds the bias).
      // A CUDA failure (fusebox::Error) propagates: it may have broken the context. An
      // exception of cudnn-frontend is a refusal for this process, not stored on disk.
      std::string refusal;
      bool store = true;
      for (bool with_bias : {true, false}) {
        if (with_bias && !p.bias.present) continue;
        try {
          entry = build_entry(ctx, p, t, with_bias, settings.autotune, c.stats);
          break;
        } catch (const Refused& r) {
          refusal += (refusal.empty() ? "" : "; ") + std::string(with_bias ? "with bias: " : "") +
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
        bool ok = true;
        if (entry->graph) {
          try {
            ok = entry->graph->serialize(blob).is_good();
          } catch (const std::exception&) {
            ok = false;
          }
        }
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
  }
  if (!entry->graph) {
    outcome.reason = entry->reason;
    return outcome;
  }

  // Record the execution.
  const bool with_bias = entry->bias_fused;
  auto pack = variant_pack(t, with_bias);
  DeviceBuffer workspace = ctx.allocator.allocate(size_t(entry->workspace));
  if (workspace) ctx.encoder.add_temporary(workspace);
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
  if (with_bias) reads.push_back(t.bias->range());
  if (workspace) writes.push_back(workspace);
  try {
    // This thread's handle exists before any capture (cudnnCreate cannot be captured).
    cudnnHandle_t handle = ctx.device.cudnn_handle(ctx.encoder.stream());
    if (!entry->warmed_up) {
      // One run outside any capture: loads the kernels, and a plan that cannot run is
      // found here rather than inside the recording.
      check_fe(entry->graph->execute(handle, pack, workspace.data()), "execute");
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
      fe::graph::Graph& graph = *entry->graph;
      ctx.encoder.capture_library_call(reads, writes, [&](cudaStream_t s) {
        fe::error_t status = graph.execute(ctx.device.cudnn_handle(s), pack, workspace.data());
        if (status.is_bad()) throw Refused{cat("execute: ", one_line(status.get_message()))};
      });
      ++c.stats.captured_calls;
    }
  } catch (const Error&) {
    throw;  // CUDA or the encoder failed: not the plan's doing
  } catch (const std::exception& ex) {
    // The plan does not run (a Refused, or cudnn-frontend threw): remember the refusal for
    // this process (not on disk).
    const Refused* r = dynamic_cast<const Refused*>(&ex);
    auto refused = std::make_shared<PlanEntry>();
    refused->reason = r ? r->message : cat("execute: ", one_line(ex.what()));
    c.memory->insert(key, refused);
    ++c.stats.refusals;
    outcome.reason = refused->reason;
    return outcome;
  }
  outcome.ran = true;
  outcome.bias_fused = with_bias;
  outcome.plan = entry->plan_name;
  outcome.workspace_bytes = size_t(entry->workspace);
  outcome.tuned_ms = entry->tuned_ms;
  return outcome;
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
