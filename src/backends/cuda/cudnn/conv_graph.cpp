// cuDNN convolution plans: lowering a ConvProblem to a cudnn-frontend graph, the heuristics'
// candidates, the heuristics' choice or autotuning over them, and the plan's serialization
// and execution. The one translation unit that includes cudnn_frontend.h (it costs ~30 s
// to compile); the caches and the recording are in cudnn/plans.cpp (cudnn/plan.h between).
//
// Graph per op (uids in cudnn/plan.h):
//   fprop: y = conv_fprop(x, w) [+ bias]      dgrad: x = conv_dgrad(y, w) [+ bias]
//   wgrad: w = conv_wgrad(y, x)
//   fprop with its epilogue (ConvFusion::epilogue):
//     y = residual_activation(activation(conv_fprop(x, w) [+ bias]) [+ residual])
// io dtype f32/f16/bf16, intermediate and compute f32. The bias is a [1, C, 1, 1] tensor
// added by a pointwise ADD on the convolution's f32 result, the activations are pointwise
// nodes (clip is RELU_FWD with lower and upper clips), the residual an ADD of a tensor of
// y's dims and strides; every intermediate stays virtual (f32, on chip). When no plan
// supports a fused graph, a less fused one is built (plans.cpp) and the caller runs the
// rest with its own kernel.
//
// Candidates. The heuristics' choice is the first buildable config of modes A then
// FALLBACK. Autotuning merges that list by rank with mode B's (A0, B0, A1, B1, ...; the
// graph is built and queried twice), drops duplicate engine configs (same name: engine and
// knobs), keeps the first settings.autotune_candidates that build, and times each.
#include <cudnn_frontend.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>
#include <unordered_set>

#include "backends/cuda/cudnn/plan.h"
#include "fusebox/core/compile_trace.h"

namespace fusebox::cuda {

namespace fe = cudnn_frontend;

struct CudnnGraph {
  fe::graph::Graph graph;
};

namespace {

void check_fe(fe::error_t status, const char* step) {
  if (status.is_bad()) throw CudnnRefused{cat(step, ": ", one_line(status.get_message()))};
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
      throw CudnnRefused{cat("no cuDNN type for ", dtype_name(t))};
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

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// activation(v) as a pointwise node (a <= min / >= max clip kept exact in f32).
TensorPtr activate(fe::graph::Graph& g, const TensorPtr& v, const FusedActivation& a) {
  auto attributes = fe::graph::Pointwise_attributes().set_compute_data_type(fe::DataType_t::FLOAT);
  switch (a.kind) {
    case Activation::none:
      return v;
    case Activation::relu:
      attributes.set_mode(fe::PointwiseMode_t::RELU_FWD);
      break;
    case Activation::gelu:
      attributes.set_mode(fe::PointwiseMode_t::GELU_FWD);
      break;
    case Activation::gelu_tanh:
      attributes.set_mode(fe::PointwiseMode_t::GELU_APPROX_TANH_FWD);
      break;
    case Activation::silu:
      attributes.set_mode(fe::PointwiseMode_t::SWISH_FWD).set_swish_beta(1.0f);
      break;
    case Activation::sigmoid:
      attributes.set_mode(fe::PointwiseMode_t::SIGMOID_FWD);
      break;
    case Activation::tanh:
      attributes.set_mode(fe::PointwiseMode_t::TANH_FWD);
      break;
    case Activation::clip:
      attributes.set_mode(fe::PointwiseMode_t::RELU_FWD)
          .set_relu_lower_clip(float(a.min))
          .set_relu_upper_clip(float(a.max));
      break;
  }
  return g.pointwise(v, attributes);
}

// The bias of `out` (the convolution's output role) as a [1, C, 1, ...] tensor.
template <class Attributes>
TensorPtr bias_tensor(fe::graph::Graph& g, const ConvProblem& p, const ConvTensor& out,
                      Attributes&& attributes) {
  const int64_t channels = out.dims[1],
                bias_stride = p.bias.strides.empty() ? 1 : p.bias.strides[0];
  std::vector<int64_t> bias_dims(out.dims.size(), 1),
      bias_strides(out.dims.size(), channels * bias_stride);
  bias_dims[1] = channels;
  bias_strides[1] = bias_stride;
  ConvTensor bias = p.bias;
  bias.dims = bias_dims;
  bias.strides = bias_strides;
  return g.tensor(attributes("bias", kCudnnUidBias, bias));
}

// Fills `g` with the operation graph of the problem (not yet validated or built).
void build_graph(fe::graph::Graph& g, const ConvProblem& p, ConvFusion fused) {
  const fe::DataType_t io = fe_type(p.x.dtype);
  g.set_io_data_type(io)
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
      auto x = g.tensor(attributes("x", kCudnnUidX, p.x));
      auto w = g.tensor(attributes("w", kCudnnUidW, p.w));
      result = g.conv_fprop(x, w, geometry<fe::graph::Conv_fprop_attributes>(p));
      out = &p.y, out_uid = kCudnnUidY;
      break;
    }
    case ConvOp::dgrad: {
      auto dy = g.tensor(attributes("dy", kCudnnUidY, p.y));
      auto w = g.tensor(attributes("w", kCudnnUidW, p.w));
      result = g.conv_dgrad(dy, w, geometry<fe::graph::Conv_dgrad_attributes>(p));
      out = &p.x, out_uid = kCudnnUidX;
      break;
    }
    case ConvOp::wgrad: {
      auto dy = g.tensor(attributes("dy", kCudnnUidY, p.y));
      auto x = g.tensor(attributes("x", kCudnnUidX, p.x));
      result = g.conv_wgrad(dy, x, geometry<fe::graph::Conv_wgrad_attributes>(p));
      out = &p.w, out_uid = kCudnnUidW;
      break;
    }
  }
  if (fused == ConvFusion::none) {
    make_output(result, "out", out_uid, *out);
    return;
  }
  // The convolution's f32 result stays virtual; bias [1, C, 1, 1] is added to it.
  result->set_dim(out->dims).set_stride(out->strides).set_data_type(fe::DataType_t::FLOAT);
  auto add = [&](const TensorPtr& a, const TensorPtr& b) {
    return g.pointwise(a, b,
                       fe::graph::Pointwise_attributes()
                           .set_mode(fe::PointwiseMode_t::ADD)
                           .set_compute_data_type(fe::DataType_t::FLOAT));
  };
  auto residual = [&] { return g.tensor(attributes("residual", kCudnnUidResidual, p.residual)); };
  // With no activation between them, the residual is added before the bias: conv + z + bias
  // is the order of cuDNN's precompiled conv-bias-add-activation kernels (builds in ms);
  // conv + bias + z only has the runtime-compiled fusion engine (~1 s to build, and slower
  // on 3 of ResNet-50's 4 block ends: bench/results/2026-11-24_h100_cudnn_fusion_probe/).
  const bool residual_first = fused == ConvFusion::epilogue && p.residual.present && !p.activation;
  if (residual_first) result = add(result, residual());
  if (p.bias.present) result = add(result, bias_tensor(g, p, *out, attributes));
  if (fused == ConvFusion::epilogue) {
    result = activate(g, result, p.activation);
    if (p.residual.present && !residual_first) result = add(result, residual());
    result = activate(g, result, p.residual_activation);
  }
  make_output(result, "out", out_uid, *out);
}

std::vector<fe::NumericalNote_t> barred_notes(const ConvProblem& p) {
  std::vector<fe::NumericalNote_t> notes = {fe::NumericalNote_t::DOWN_CONVERT_INPUTS};
  if (p.x.dtype == DType::f32 && !p.allow_tf32) notes.push_back(fe::NumericalNote_t::TENSOR_CORE);
  if (p.deterministic) notes.push_back(fe::NumericalNote_t::NONDETERMINISTIC);
  return notes;
}

// A candidate's time. A candidate whose first run alone took over kDropFactor x `bound` (the
// fastest so far, or the project's kernel it must beat) cannot win: it is not run again, and
// its time is that run's lower bound (measured = false). Depthwise and grouped problems have
// many candidates several times slower than the best (cuDNN's generic engines), and timing
// each for ~2 ms more cost EfficientNet-B0's first compile 31 s of its 47 (H200, session 38).
struct CandidateTime {
  double ms = -1;  // < 0: the plan failed to run
  bool measured = false;
};
constexpr double kDropFactor = 2.0;

// Times plan `index` on the stream (real tensors, its own workspace).
CandidateTime time_plan(Context& ctx, fe::graph::Graph& g, int64_t index, cudnnHandle_t handle,
                        VariantPack& pack, cudaStream_t stream, double bound) {
  TracePhase trace("cudnn conv autotune: time a candidate");
  const int64_t ws_bytes = g.get_workspace_size_plan_at_index(index);
  DeviceBuffer workspace = ctx.allocator.allocate(size_t(std::max<int64_t>(ws_bytes, 0)));
  if (g.execute_plan_at_index(handle, pack, workspace.data(), index).is_bad()) return {};
  cudaEvent_t start = nullptr, stop = nullptr;
  FUSEBOX_CUDA_CHECK(cudaEventCreate(&start));
  FUSEBOX_CUDA_CHECK(cudaEventCreate(&stop));
  // The mean ms of `reps` runs; *launch_ms: the host's time in the launches. The start event
  // completes at once on the idle stream, so the runs' span is at least the events' span less
  // the launches' (a first launch of an engine loads its module: that must not count).
  auto timed = [&](int reps, double* launch_ms) {
    FUSEBOX_CUDA_CHECK(cudaEventRecord(start, stream));
    const auto launching = std::chrono::steady_clock::now();
    bool ok = true;
    for (int i = 0; i < reps && ok; ++i)
      ok = g.execute_plan_at_index(handle, pack, workspace.data(), index).is_good();
    if (launch_ms != nullptr)
      *launch_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - launching)
              .count();
    FUSEBOX_CUDA_CHECK(cudaEventRecord(stop, stream));
    FUSEBOX_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    FUSEBOX_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ok ? double(ms) / reps : -1.0;
  };
  // One run to size the measurement (~2 ms of work, 3 to 50 runs), then the measurement.
  double launch_ms = 0;
  double first = -1;
  {
    TracePhase trace_first("cudnn conv autotune: a candidate's first run (its module loads)");
    first = timed(1, &launch_ms);
  }
  CandidateTime result;
  if (first < 0) {
  } else if (first - launch_ms > kDropFactor * bound) {
    result.ms = first - launch_ms;
  } else {
    result.ms = timed(int(std::clamp(2.0 / std::max(first, 1e-3), 3.0, 50.0)), nullptr);
    result.measured = result.ms >= 0;
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  // The workspace goes back to the cache only after the stream is done with it.
  FUSEBOX_CUDA_CHECK(cudaStreamSynchronize(stream));
  return result;
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

// A graph of the problem with its heuristics' candidates (notes filtered); throws
// CudnnRefused when a step fails.
std::shared_ptr<CudnnGraph> query_candidates(const ConvProblem& p, ConvFusion fused,
                                             cudnnHandle_t handle,
                                             const std::vector<fe::HeurMode_t>& modes,
                                             ConvPlanStats& stats) {
  TracePhase trace("cudnn conv heuristics query");
  auto c = std::make_shared<CudnnGraph>();
  fe::graph::Graph& g = c->graph;
  build_graph(g, p, fused);
  check_fe(g.validate(), "validate");
  check_fe(g.build_operation_graph(handle), "build_operation_graph");
  ++stats.heuristics_queries;
  check_fe(g.create_execution_plans(modes), "heuristics");
  g.deselect_numeric_notes(barred_notes(p));
  check_fe(g.check_support(), "check_support");
  return c;
}

// Whether plan `name` ("eng20", "eng10_k2=5_...") is one of the engines `barred`: the engine
// id must match exactly (cudnn-frontend's deselect_engines matches substrings, so "eng1"
// would bar eng10 too).
bool is_barred(const std::string& name, const std::vector<std::string>& barred) {
  for (const std::string& e : barred) {
    if (name == e ||
        (name.size() > e.size() && name.compare(0, e.size(), e) == 0 && name[e.size()] == '_')) {
      return true;
    }
  }
  return false;
}

// The heuristics' first plan that builds and is not barred (HEURISTICS_CHOICE, with the
// bar); it becomes the graph's plan.
void build_first_allowed(fe::graph::Graph& g, const std::vector<std::string>& barred) {
  TracePhase trace("cudnn conv build the heuristics' plan");
  if (barred.empty()) {
    check_fe(g.build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans");
    return;
  }
  for (int64_t i = 0; i < g.get_execution_plan_count(); ++i) {
    if (is_barred(plan_name_at(g, i), barred)) continue;
    if (g.build_plan_at_index(i).is_good()) return;
  }
  std::string names;
  for (const std::string& e : barred) names += (names.empty() ? "" : ", ") + e;
  throw CudnnRefused{
      cat("build_plans: no candidate builds but the engines barred for this "
          "problem (",
          names, ")")};
}

// One autotuning candidate: a config of one of the queried graphs.
struct Candidate {
  CudnnGraph* graph;
  int64_t index;
  bool from_first;  // of the first graph (modes A, FALLBACK): the heuristics' order
};

// Whether candidate `index` of `g` compiles its kernel when built (cuDNN's runtime-compiled
// engines: NVRTC inside cuDNN, ~0.1-1 s a plan).
bool compiles_at_build(fe::graph::Graph& g, int64_t index) {
  std::vector<fe::BehaviorNote_t> notes;
  if (g.get_behavior_notes_for_plan_at_index(index, notes).is_bad()) return false;
  return std::find(notes.begin(), notes.end(), fe::BehaviorNote_t::RUNTIME_COMPILATION) !=
         notes.end();
}

// The candidates of `graphs`, merged by rank, distinct by name, built; at most `cap`
// (0: all). `configs` counts every config seen, duplicates included. skip_runtime_compiled:
// runtime-compiled candidates are left out unless no other builds (`skipped` counts them).
std::vector<Candidate> merged_candidates(const std::vector<CudnnGraph*>& graphs, size_t cap,
                                         const std::vector<std::string>& barred,
                                         bool skip_runtime_compiled, int64_t& configs,
                                         int64_t& skipped) {
  TracePhase trace("cudnn conv autotune: build candidates");
  int64_t longest = 0;
  configs = 0;
  for (CudnnGraph* g : graphs) {
    longest = std::max(longest, g->graph.get_execution_plan_count());
    configs += g->graph.get_execution_plan_count();
  }
  auto collect = [&](bool runtime_compiled) {
    std::vector<Candidate> out;
    std::unordered_set<std::string> seen;
    skipped = 0;
    for (int64_t rank = 0; rank < longest; ++rank) {
      for (size_t k = 0; k < graphs.size(); ++k) {
        fe::graph::Graph& g = graphs[k]->graph;
        if (rank >= g.get_execution_plan_count()) continue;
        std::string name;
        if (g.get_plan_name_at_index(rank, name).is_bad() || !seen.insert(name).second) continue;
        if (is_barred(name, barred)) continue;
        const bool compiles = compiles_at_build(g, rank);
        if (compiles && !runtime_compiled) {
          ++skipped;
          continue;
        }
        TracePhase build(compiles ? "cudnn conv autotune: build a runtime-compiled candidate"
                                  : "cudnn conv autotune: build a precompiled candidate");
        if (g.build_plan_at_index(rank).is_bad()) continue;  // deselected or unsupported
        out.push_back({graphs[k], rank, k == 0});
        if (cap != 0 && out.size() >= cap) return out;
      }
    }
    return out;
  };
  std::vector<Candidate> out = collect(!skip_runtime_compiled);
  if (out.empty() && skip_runtime_compiled) out = collect(true);
  return out;
}

}  // namespace

std::string cudnn_frontend_version() {
  return cat(CUDNN_FRONTEND_MAJOR_VERSION, ".", CUDNN_FRONTEND_MINOR_VERSION, ".",
             CUDNN_FRONTEND_PATCH_VERSION);
}

EntryPtr build_cudnn_plan(Context& ctx, const ConvProblem& p, const ConvOperands& t,
                          ConvFusion fused, const ConvSettings& settings, ConvPlanStats& stats,
                          std::optional<double> beat_ms) {
  cudaStream_t stream = ctx.encoder.stream();
  cudnnHandle_t handle = ctx.device.cudnn_handle(stream);
  std::shared_ptr<CudnnGraph> chosen =
      query_candidates(p, fused, handle, {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}, stats);
  auto entry = std::make_shared<PlanEntry>();
  entry->fused = fused;
  if (p.forced_plan_index >= 0) {
    const int64_t count = chosen->graph.get_execution_plan_count();
    if (p.forced_plan_index >= count) {
      throw CudnnRefused{cat("FUSEBOX_CONV_PLAN_INDEX=", p.forced_plan_index,
                             ": the heuristics have ", count, " candidates")};
    }
    check_fe(chosen->graph.build_plan_at_index(p.forced_plan_index), "build_plan_at_index");
  } else if (!settings.autotune) {
    build_first_allowed(chosen->graph, barred_engines(p));
  } else {
    ++stats.autotune_runs;
    const auto start = std::chrono::steady_clock::now();
    std::vector<CudnnGraph*> graphs = {chosen.get()};
    std::shared_ptr<CudnnGraph> mode_b;
    if (settings.autotune_mode_b) {
      try {
        mode_b = query_candidates(p, fused, handle, {fe::HeurMode_t::B}, stats);
        graphs.push_back(mode_b.get());
      } catch (const CudnnRefused&) {
        // Mode B has nothing (or fails) for this graph: modes A and FALLBACK suffice.
      }
    }
    int64_t configs = 0, skipped = 0;
    const std::vector<Candidate> candidates =
        merged_candidates(graphs, settings.autotune_candidates, barred_engines(p),
                          settings.skip_runtime_compiled, configs, skipped);
    VariantPack pack = variant_pack(t, fused);
    // The best measured candidate; one only dropped after a run (see CandidateTime) only when
    // none was measured (all slower than the project's kernel: that kernel runs).
    const Candidate* best = nullptr;
    CandidateTime best_time;
    double first_ms = -1;
    int64_t timed = 0, from_b = 0, dropped = 0;
    for (const Candidate& c : candidates) {
      from_b += !c.from_first;
      double bound = beat_ms.value_or(std::numeric_limits<double>::infinity());
      if (best_time.measured) bound = std::min(bound, best_time.ms);
      const CandidateTime time =
          time_plan(ctx, c.graph->graph, c.index, handle, pack, stream, bound);
      if (time.ms < 0) continue;
      ++timed;
      dropped += !time.measured;
      if (c.from_first && first_ms < 0) first_ms = time.ms;
      const bool better = time.measured
                              ? !best_time.measured || time.ms < best_time.ms
                              : !best_time.measured && (best == nullptr || time.ms < best_time.ms);
      if (best == nullptr || better) best = &c, best_time = time;
    }
    if (best == nullptr) throw CudnnRefused{"autotune: no candidate plan built and ran"};
    const double best_ms = best_time.ms;
    check_fe(best->graph->graph.build_plan_at_index(best->index), "build_plan_at_index");
    entry->tuned_ms = best_ms;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!settings.quiet_tuning)
      std::fprintf(
          stderr,
          "fusebox: autotuned %s: %s: %lld of %zu candidates timed (%lld from mode B; "
          "%lld dropped after one run; distinct and buildable among %lld configs of "
          "modes A+FALLBACK%s, cap %zu; %lld runtime-compiled left out) in %.2f s; best %s "
          "(candidate %lld) %.4f ms (heuristics' first %.4f ms)\n",
          p.label.c_str(), p.describe().c_str(), (long long)timed, candidates.size(),
          (long long)from_b, (long long)dropped, (long long)configs, mode_b ? "+B" : "",
          settings.autotune_candidates, (long long)skipped, seconds,
          plan_name_at(best->graph->graph, best->index).c_str(),
          (long long)(best - candidates.data()) + 1, best_ms, first_ms);
    chosen = best->graph == chosen.get() ? chosen : mode_b;
    entry->warmed_up = true;
  }
  fe::graph::Graph& g = chosen->graph;
  if (g.get_plan_name(entry->plan_name).is_bad()) entry->plan_name = "?";
  int64_t ws = 0;
  check_fe(g.get_workspace_size(ws), "get_workspace_size");
  entry->workspace = ws;
  entry->native_graph = supports_native_graph(g);
  entry->graph = std::move(chosen);
  ++stats.plans_built;
  return entry;
}

bool serialize_cudnn_plan(CudnnGraph& g, std::vector<uint8_t>& blob) {
  try {
    return g.graph.serialize(blob).is_good();
  } catch (const std::exception&) {
    return false;
  }
}

std::shared_ptr<CudnnGraph> deserialize_cudnn_plan(cudnnHandle_t handle,
                                                   const std::vector<uint8_t>& blob,
                                                   int64_t& workspace, bool& native_graph,
                                                   std::string& why) {
  auto g = std::make_shared<CudnnGraph>();
  try {
    // deserialize() also runs cuDNN's warm-up.
    fe::error_t status = g->graph.deserialize(handle, blob);
    if (status.is_bad()) {
      why = cat("deserialize: ", one_line(status.get_message()));
      return nullptr;
    }
    if (g->graph.get_workspace_size(workspace).is_bad()) {
      why = "deserialized plan has no workspace size";
      return nullptr;
    }
    native_graph = supports_native_graph(g->graph);
  } catch (const std::exception& ex) {
    why = cat("deserialize: ", one_line(ex.what()));
    return nullptr;
  }
  return g;
}

void execute_cudnn_plan(CudnnGraph& g, cudnnHandle_t handle, VariantPack& pack, void* workspace) {
  check_fe(g.graph.execute(handle, pack, workspace), "execute");
}

bool populate_cudnn_graph(CudnnGraph& g, cudnnHandle_t handle, VariantPack& pack, void* workspace,
                          cudaGraph_t graph) {
  return g.graph.populate_cuda_graph(handle, pack, workspace, graph).is_good();
}

}  // namespace fusebox::cuda
