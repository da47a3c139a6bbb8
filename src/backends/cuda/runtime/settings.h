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

// Which implementation runs a convolution: FUSEBOX_CONV_BACKEND=auto (cuDNN, falling back
// to the direct kernel), cudnn (cuDNN or an error), own (the direct kernel).
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

// How convolutions run (kernels/conv, cudnn/). Defaults are the values when unset.
struct ConvSettings {
  ConvBackend backend = ConvBackend::automatic;  // FUSEBOX_CONV_BACKEND
  bool allow_tf32 = true;                        // FUSEBOX_ALLOW_TF32 (f32 convolutions)
  bool deterministic = false;                    // FUSEBOX_DETERMINISTIC
  bool autotune = false;                         // FUSEBOX_AUTOTUNE, or --autotune
  size_t plan_cache_capacity = 256;              // FUSEBOX_CONV_PLAN_CACHE (0: unbounded)
  bool native_graph = true;  // FUSEBOX_CUDNN_NATIVE_GRAPH: 0 records every plan by capture
  // Autotuning's candidates: the engine configs of heuristics mode A, then FALLBACK, merged
  // by rank with mode B's when FUSEBOX_CONV_AUTOTUNE_MODE_B=1 (off by default: on the H100
  // mode B added no distinct config for any ResNet-50 problem and made tuning 4x slower),
  // duplicates dropped, at most FUSEBOX_CONV_AUTOTUNE_CANDIDATES of them (0: all). Neither
  // is part of the plan-cache key: a tuned plan found in a cache is reused as it is.
  bool autotune_mode_b = false;
  size_t autotune_candidates = 48;
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
  // FUSEBOX_CONV_IGEMM_TILE=128x128|128x64|64x128|64x64|wg128x128|wg128x64 (the project's
  // main loops, kernels/conv/implicit_gemm/plan.h) or cutlass128x128|cutlass128x64|
  // cutlass64x128 (the CUTLASS Hopper kernels, kernels/conv/cutlass/plan.h) or halo / patch
  // (the wgrads of kernels/conv/halo_wgrad/ and patch_wgrad/) or phase (the dgrad of
  // kernels/conv/phase_dgrad/), for benchmarks and diagnosis: the
  // implicit GEMM's CTA tile where that tile is compiled for the problem, instead of the
  // heuristic's. A tile of ours keeps the problem off CUTLASS. Empty: unset.
  std::string igemm_tile;
};

struct BackendSettings {
  // FUSEBOX_CUDA_MEMORY_LIMIT (4096, 64K, 512M, 2G): the most bytes each device's caching
  // allocator holds, cached blocks included; nullopt (unset): only the device's memory.
  std::optional<size_t> memory_limit;
  // FUSEBOX_CUDA_GRAPHS: true records each step into a CUDA graph; false (0) launches every
  // operation directly, for debugging and comparison.
  bool use_graphs = true;
  // FUSEBOX_CUDA_GRAPH_CACHE: instantiated graphs each command encoder keeps (0: none).
  size_t graph_cache_capacity = 64;
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
