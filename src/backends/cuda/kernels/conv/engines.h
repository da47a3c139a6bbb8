// The convolution engines (engine.h) in their order of preference, the default policy over
// them, forcing one (FUSEBOX_CONV_ENGINE, or in process), and autotuning between them
// (FUSEBOX_AUTOTUNE: selection.h). kernels/conv/conv.cpp asks run_conv_engines and runs what is
// left of the epilogue; engines.cpp states the rules.
#pragma once

#include <optional>
#include <span>
#include <string>

#include "backends/cuda/kernels/conv/engine.h"

namespace fusebox::cuda {

// Every engine, in the default policy's order of preference.
std::span<const ConvEngine* const> conv_engines();
// The engine of that name, or nullptr.
const ConvEngine* find_conv_engine(std::string_view name);
// "cudnn, depthwise, ..." (for messages).
std::string conv_engine_names();

// The engine `choice` names: an Error (where: `where`, e.g. the node) naming `setting` where
// the name is no engine's (listing them) or the variant none of its variants.
const ConvEngine& checked_conv_engine(const ConvEngineChoice& choice, std::string_view setting,
                                      const std::string& where = "cuda");

// Forces an engine for the convolutions of this process as FUSEBOX_CONV_ENGINE does, over it
// (tests; nullopt: the environment decides again). conv_settings() applies it.
void set_conv_engine_override(std::optional<ConvEngineChoice> choice);
std::optional<ConvEngineChoice> conv_engine_override();

// The form a conv with channel_stats (ir/ops.h) takes where the statistics GEMM takes it:
// true the GEMM, false the engines and then the norm's statistics pass; nullopt (the default)
// the faster of the two, timed once per problem (kernels/conv/conv.cpp). For tests.
void set_statistics_form_override(std::optional<bool> gemm);

// What ran a convolution.
struct ConvOutcome {
  const ConvEngine* engine = nullptr;
  ConvRecorded recorded;
  std::string how;       // "autotuned", "forced" or "" (the default policy)
  std::string reason;    // why this engine (the report's reason)
  double tuned_ms = -1;  // the winner's autotuned time (-1: not tuned in this process)
};

// Chooses the engine for `call` (a fused-form call: its epilogue the node's whole one) and
// records it: the forced engine (settings.engine) or an Error, else the autotuned winner
// (settings.autotune), else the default policy's first engine that takes the call.
ConvOutcome run_conv_engines(Context& ctx, const ConvCall& call);

}  // namespace fusebox::cuda
