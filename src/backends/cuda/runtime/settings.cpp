#include "backends/cuda/runtime/settings.h"

#include <atomic>
#include <cstdlib>
#include <forward_list>
#include <mutex>
#include <string>

#include "backends/cuda/runtime/env.h"
#include "fusebox/backends/cuda.h"
#include "fusebox/core/error.h"

namespace fusebox::cuda {
namespace {

// Each reader leaves `value` (its default) as it is when the variable is unset or empty.
void read_switch(const char* name, bool& value) {
  if (auto text = env_text(name)) value = parse_switch(*text, name);
}

void read_count(const char* name, size_t& value) {
  if (auto text = env_text(name)) value = parse_count(*text, name);
}

std::filesystem::path cache_dir_from_env() {
  if (std::optional<std::string> dir = env_text("FUSEBOX_CACHE_DIR")) return *dir;
  // The XDG base-directory spec says to ignore a relative XDG_CACHE_HOME.
  std::optional<std::string> xdg = env_text("XDG_CACHE_HOME");
  if (xdg && std::filesystem::path(*xdg).is_absolute()) {
    return std::filesystem::path(*xdg) / "fusebox";
  }
  if (std::optional<std::string> home = env_text("HOME")) {
    return std::filesystem::path(*home) / ".cache" / "fusebox";
  }
  return {};
}

// FUSEBOX_CONV_ENGINE's equivalent of a FUSEBOX_CONV_IGEMM_TILE value.
std::string conv_engine_for_old_tile(const std::string& tile) {
  if (tile == "halo") return "halo_wgrad";
  if (tile == "patch") return "patch_wgrad";
  if (tile == "phase") return "phase_dgrad";
  if (tile.rfind("cutlass", 0) == 0) return "cutlass:" + tile.substr(7);
  return "implicit_gemm:" + tile;
}

ConvSettings conv_settings_from_env() {
  ConvSettings s;
  if (auto text = env_text("FUSEBOX_CONV_BACKEND")) s.backend = parse_conv_backend(*text);
  read_switch("FUSEBOX_ALLOW_TF32", s.allow_tf32);
  read_switch("FUSEBOX_DETERMINISTIC", s.deterministic);
  read_switch("FUSEBOX_AUTOTUNE", s.autotune);
  read_count("FUSEBOX_CONV_PLAN_CACHE", s.plan_cache_capacity);
  read_switch("FUSEBOX_CUDNN_NATIVE_GRAPH", s.native_graph);
  read_switch("FUSEBOX_CONV_AUTOTUNE_MODE_B", s.autotune_mode_b);
  read_count("FUSEBOX_CONV_AUTOTUNE_CANDIDATES", s.autotune_candidates);
  read_switch("FUSEBOX_CONV_RULE4_RUNTIME_COMPILED", s.rule4_runtime_compiled);
  if (auto text = env_text("FUSEBOX_CONV_SUBSAMPLE_1X1"))
    s.subsample_1x1 = parse_conv_subsample(*text);
  read_switch("FUSEBOX_CONV_ALLOW_BARRED_ENGINES", s.allow_barred_engines);
  if (auto text = env_text("FUSEBOX_CONV_PLAN_INDEX"))
    s.forced_plan_index = int64_t(parse_count(*text, "FUSEBOX_CONV_PLAN_INDEX"));
  if (auto text = env_text("FUSEBOX_CUDNN_FUSION")) {
    FUSEBOX_CHECK(*text == "on" || *text == "refuse", "cuda", "FUSEBOX_CUDNN_FUSION='", *text,
                  "' must be on (fused cuDNN graphs first) or refuse (every fused graph refused)");
    s.refuse_fusion = *text == "refuse";
  }
  // The old tile setting also chose engines; FUSEBOX_CONV_ENGINE does that now, so a value
  // left in an environment is refused with its translation rather than ignored.
  if (auto text = env_text("FUSEBOX_CONV_IGEMM_TILE")) {
    throw Error("cuda", cat("FUSEBOX_CONV_IGEMM_TILE is replaced by FUSEBOX_CONV_ENGINE: set "
                            "FUSEBOX_CONV_ENGINE=",
                            conv_engine_for_old_tile(*text),
                            " instead of FUSEBOX_CONV_IGEMM_TILE='", *text, "'"));
  }
  if (auto text = env_text("FUSEBOX_CONV_ENGINE"))
    set_conv_engine(s, parse_conv_engine(*text, "FUSEBOX_CONV_ENGINE"), "FUSEBOX_CONV_ENGINE");
  return s;
}

std::mutex g_read_mutex;
// The settings in force; null until the first settings() (or after a test's re-read).
std::atomic<const BackendSettings*> g_current{nullptr};

// Every parse ever made stays here, so that a reference from settings() never dangles when
// a test makes the environment be read again. Outside tests this holds one entry.
std::forward_list<BackendSettings>& parsed_settings() {
  // Never destroyed: code that runs at exit may still read its settings.
  static auto* parsed = new std::forward_list<BackendSettings>();
  return *parsed;
}

}  // namespace

const char* conv_backend_name(ConvBackend b) {
  switch (b) {
    case ConvBackend::automatic:
      return "auto";
    case ConvBackend::cudnn:
      return "cudnn";
    case ConvBackend::own:
      return "own";
  }
  return "?";
}

ConvBackend parse_conv_backend(std::string_view text) {
  if (text == "auto") return ConvBackend::automatic;
  if (text == "cudnn") return ConvBackend::cudnn;
  if (text == "own") return ConvBackend::own;
  throw Error(
      "cuda",
      cat("FUSEBOX_CONV_BACKEND='", text,
          "' must be auto (the default engine policy), cudnn or own (every engine but cuDNN)"));
}

ConvEngineChoice parse_conv_engine(std::string_view text, std::string_view setting) {
  ConvEngineChoice c;
  const size_t colon = text.find(':');
  c.name = std::string(text.substr(0, colon));
  if (colon != std::string_view::npos) c.variant = std::string(text.substr(colon + 1));
  bool ok = !c.name.empty() && (colon == std::string_view::npos || !c.variant.empty());
  for (char ch : c.name)
    ok = ok && ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_');
  FUSEBOX_CHECK(ok, "cuda", setting, "='", text,
                "' must be an engine's name or name:variant (e.g. implicit_gemm:128x64, cudnn:0)");
  return c;
}

void set_conv_engine(ConvSettings& s, const ConvEngineChoice& engine, std::string_view setting) {
  const bool cudnn = engine.name == "cudnn";
  FUSEBOX_CHECK(s.backend != ConvBackend::cudnn || cudnn, "cuda", setting, "='", engine.text(),
                "' contradicts FUSEBOX_CONV_BACKEND=cudnn (cuDNN alone)");
  FUSEBOX_CHECK(s.backend != ConvBackend::own || !cudnn, "cuda", setting, "='", engine.text(),
                "' contradicts FUSEBOX_CONV_BACKEND=own (no cuDNN)");
  if (cudnn && !engine.variant.empty()) {
    const auto index = int64_t(parse_count(engine.variant, setting));
    FUSEBOX_CHECK(s.forced_plan_index < 0 || s.forced_plan_index == index, "cuda", setting, "='",
                  engine.text(), "' contradicts FUSEBOX_CONV_PLAN_INDEX=", s.forced_plan_index);
    s.forced_plan_index = index;
  }
  s.engine = engine;
}

ConvSubsample parse_conv_subsample(std::string_view text) {
  if (text == "auto") return ConvSubsample::automatic;
  if (text == "0") return ConvSubsample::off;
  if (text == "1") return ConvSubsample::on;
  throw Error("cuda", cat("FUSEBOX_CONV_SUBSAMPLE_1X1='", text,
                          "' must be auto (tried under autotuning), 0 (never) or 1 (always)"));
}

const char* conv_subsample_name(ConvSubsample s) {
  switch (s) {
    case ConvSubsample::automatic:
      return "auto";
    case ConvSubsample::off:
      return "0";
    case ConvSubsample::on:
      return "1";
  }
  return "?";
}

BackendSettings BackendSettings::from_env() {
  BackendSettings s;
  if (auto text = env_text("FUSEBOX_CUDA_MEMORY_LIMIT"))
    s.memory_limit = parse_byte_count(*text, "FUSEBOX_CUDA_MEMORY_LIMIT", "cuda");
  read_switch("FUSEBOX_CUDA_GRAPHS", s.use_graphs);
  read_count("FUSEBOX_CUDA_GRAPH_CACHE", s.graph_cache_capacity);
  read_count("FUSEBOX_REPLAY_EXECS", s.replay_execs);
  if (s.replay_execs < 1 || s.replay_execs > 2)
    throw Error("cuda", cat("FUSEBOX_REPLAY_EXECS=", s.replay_execs, " must be 1 or 2"));
  read_switch("FUSEBOX_TIME_RUNS", s.time_runs);
  s.cache_dir = cache_dir_from_env();
  read_switch("FUSEBOX_ALLOW_TF32_MATMUL", s.allow_tf32_matmul);
  read_count("FUSEBOX_NORM_VARIANT", s.norm_variant);
  if (auto text = env_text("FUSEBOX_ATTENTION")) {
    if (*text == "own")
      s.attention_own = true;
    else if (*text != "auto")
      throw Error("cuda", cat("FUSEBOX_ATTENTION='", *text,
                              "' must be auto (cuDNN where it takes the problem) or own"));
  }
  s.conv = conv_settings_from_env();
  return s;
}

const BackendSettings& settings() {
  if (const BackendSettings* current = g_current.load(std::memory_order_acquire)) return *current;
  std::lock_guard lock(g_read_mutex);
  if (const BackendSettings* current = g_current.load(std::memory_order_relaxed)) return *current;
  const BackendSettings& parsed = parsed_settings().emplace_front(BackendSettings::from_env());
  g_current.store(&parsed, std::memory_order_release);
  return parsed;
}

void reread_settings() {
  std::lock_guard lock(g_read_mutex);
  g_current.store(nullptr, std::memory_order_release);
}

void set_tf32(bool allowed) {
  const char* value = allowed ? "1" : "0";
  setenv("FUSEBOX_ALLOW_TF32", value, 1);
  setenv("FUSEBOX_ALLOW_TF32_MATMUL", value, 1);
  reread_settings();
}

}  // namespace fusebox::cuda
