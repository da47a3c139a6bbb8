// The CUDA backend's settings: every FUSEBOX_* variable it reads, parsed from the
// environment once per process (docs/settings.md lists them with the other layers' ones).
// Nothing else in the backend reads the environment: code asks settings(), or is handed a
// part of it (a ConvSettings, CommandEncoder::Options).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace fusebox::cuda {

// Which engines may run a convolution (kernels/conv/engines.h): FUSEBOX_CONV_BACKEND=auto (the
// default policy over all of them), cudnn (cuDNN or an error), own (every engine but cuDNN's).
enum class ConvBackend : uint8_t { automatic, cudnn, own };
const char* conv_backend_name(ConvBackend b);           // "auto", "cudnn", "own"
ConvBackend parse_conv_backend(std::string_view text);  // throws on anything else

// FUSEBOX_CONV_SUBSAMPLE_1X1: whether a strided 1x1 fprop is also tried as a stride-1 1x1
// over a strided view of x (ConvLowering::subsampled_1x1, kernels/conv/problem.h). auto:
// under autotuning both lowerings are tuned and the faster runs, else the standard
// lowering; 1: the view whenever cuDNN takes it (else the standard lowering); 0: never.
enum class ConvSubsample : uint8_t { automatic, off, on };
ConvSubsample parse_conv_subsample(std::string_view text);  // auto, 0, 1; throws otherwise
const char* conv_subsample_name(ConvSubsample s);           // "auto", "0", "1"

// FUSEBOX_CONV_ENGINE's value: an engine's name and its variant ("" for the engine's own choice).
// Names are checked against the engine list when a convolution first runs (the list lives with
// the kernels, above this layer).
struct ConvEngineChoice {
  std::string name;
  std::string variant;
  bool empty() const { return name.empty(); }
  std::string text() const { return variant.empty() ? name : name + ":" + variant; }
};
// "name" or "name:variant", name in [a-z0-9_]; throws an Error naming `setting` otherwise.
ConvEngineChoice parse_conv_engine(std::string_view text, std::string_view setting);

// How convolutions run (kernels/conv, cudnn/). Defaults are the values when unset.
struct ConvSettings {
  ConvBackend backend = ConvBackend::automatic;  // FUSEBOX_CONV_BACKEND
  bool allow_tf32 = true;                        // FUSEBOX_ALLOW_TF32 (f32 convolutions)
  bool deterministic = false;                    // FUSEBOX_DETERMINISTIC
  bool autotune = false;                         // FUSEBOX_AUTOTUNE, or --autotune
  // Timing asked for by the default policy, not by the user (kernels/conv/engines.cpp, rule 4):
  // no progress lines on stderr; the report names what was timed and what won.
  bool quiet_tuning = false;
  size_t plan_cache_capacity = 256;  // FUSEBOX_CONV_PLAN_CACHE (0: unbounded)
  bool native_graph = true;          // FUSEBOX_CUDNN_NATIVE_GRAPH: 0 records every plan by capture
  // Autotuning's candidates: the engine configs of heuristics mode A, then FALLBACK, merged
  // by rank with mode B's when FUSEBOX_CONV_AUTOTUNE_MODE_B=1 (off by default: on the H100
  // mode B added no distinct config for any ResNet-50 problem and made tuning 4x slower),
  // duplicates dropped, at most FUSEBOX_CONV_AUTOTUNE_CANDIDATES of them (0: all). Neither
  // is part of the plan-cache key: a tuned plan found in a cache is reused as it is.
  bool autotune_mode_b = false;
  size_t autotune_candidates = 48;
  // Candidates whose engine compiles its kernel when its plan is built (cuDNN's behaviour note
  // RUNTIME_COMPILATION: ~0.1-1 s each, NVRTC inside cuDNN) are left out of the timing while
  // others build; only where none other builds are they timed. The default policy's timing
  // (rule 4) sets it unless FUSEBOX_CONV_RULE4_RUNTIME_COMPILED=1 (rule4_runtime_compiled).
  bool skip_runtime_compiled = false;
  bool rule4_runtime_compiled = false;
  ConvSubsample subsample_1x1 = ConvSubsample::off;  // FUSEBOX_CONV_SUBSAMPLE_1X1 (docs/cudnn.md)
  // FUSEBOX_CONV_ALLOW_BARRED_ENGINES=1, for diagnosis only: lets cuDNN pick the engines
  // barred_engines() names for a problem (known to compute wrong results;
  // tests/unit/cuda/cudnn/test_conv_probe.cpp shows them).
  bool allow_barred_engines = false;
  // FUSEBOX_CONV_PLAN_INDEX=i, for diagnosis only: the heuristics' (A, FALLBACK) candidate i
  // instead of the first that builds, no autotuning (-1: unset). Part of the key when set.
  int64_t forced_plan_index = -1;
  // FUSEBOX_CUDNN_FUSION=refuse: every fused cuDNN graph (a conv with its bias or epilogue)
  // is treated as refused, so each group runs split: the plain convolution, then the
  // project's epilogue kernel (tests run the suite both ways). `on` (default): fused graphs
  // are tried first. Part of the plan-cache key when set.
  bool refuse_fusion = false;
  // FUSEBOX_CONV_ENGINE=name[:variant], for benchmarks and diagnosis: every convolution runs on
  // that engine (kernels/conv/engines.h names them; the variant is engine-specific: a tile, a
  // cuDNN plan index), an Error where it cannot. Empty name: the default policy. Set through
  // set_conv_engine.
  ConvEngineChoice engine;
};

// Makes `engine` the forced engine of s (FUSEBOX_CONV_ENGINE, or an in-process override named
// `setting`): an Error where it contradicts s.backend; cudnn's variant is a plan index
// (forced_plan_index, as FUSEBOX_CONV_PLAN_INDEX; an Error where that says another).
void set_conv_engine(ConvSettings& s, const ConvEngineChoice& engine, std::string_view setting);

struct BackendSettings {
  // FUSEBOX_CUDA_MEMORY_LIMIT (4096, 64K, 512M, 2G): the most bytes each device's caching
  // allocator holds, cached blocks included; nullopt (unset): only the device's memory.
  std::optional<size_t> memory_limit;
  // FUSEBOX_CUDA_GRAPHS: true records each step into a CUDA graph; false (0) launches every
  // operation directly, for debugging and comparison.
  bool use_graphs = true;
  // FUSEBOX_CUDA_GRAPH_CACHE: instantiated graphs each command encoder keeps (0: none).
  size_t graph_cache_capacity = 64;
  // FUSEBOX_REPLAY_EXECS: instantiations of each recorded graph, replays taking them in turn
  // (1 or 2). Two by default: a graph exec launched again while its previous launch still runs
  // ran 11-23% slower on the device on an H200 (Swin-T's training step 23.3 ms queued against
  // 19.1 ms waited for; alternating two execs, 19.1 ms queued), more so the more nodes it has.
  size_t replay_execs = 2;
  // FUSEBOX_TIME_RUNS: each executable's replays timed by events (ExecutableStats::timed_runs:
  // the device's time per run and its idle time between runs); off by default (two events a
  // run).
  bool time_runs = false;
  // The root of the disk plan caches: FUSEBOX_CACHE_DIR, else $XDG_CACHE_HOME/fusebox (an
  // absolute XDG_CACHE_HOME only, as the XDG spec says), else $HOME/.cache/fusebox; empty
  // when none is set: no disk cache.
  std::filesystem::path cache_dir;
  // FUSEBOX_ALLOW_TF32_MATMUL: f32 matmul and gemm may compute in TF32 (off: full f32).
  bool allow_tf32_matmul = false;
  // FUSEBOX_NORM_VARIANT: the tuning variant of the norm kernels, an index into
  // norm::norm_variants() (kernels/norm/tuning.h checks the range).
  size_t norm_variant = 0;
  // FUSEBOX_ATTENTION: auto (false: cuDNN's fused attention where cuDNN takes the problem)
  // or own (true: the project's row kernels, kernels/attention/attention.cu).
  bool attention_own = false;
  ConvSettings conv;

  // Parses the environment now. A malformed value is an Error naming the variable.
  static BackendSettings from_env();
};

// The process's settings: BackendSettings::from_env() at the first call (thread-safe), the
// same values from then on. Throws at that first call on a malformed value.
const BackendSettings& settings();

// For tests and benchmarks that change the environment between runs in one process
// (testing::ScopedEnv, bench_conv's knobs): the next settings() parses it again. References
// returned before stay valid, with the values they had.
void reread_settings();

}  // namespace fusebox::cuda
