// FUSEBOX_COMPILE_TRACE=1: where a first step's time goes. The compile's phases (the ONNX
// import, autodiff, each graph pass, the CUDA executable's planning, the recording of each op
// kind, graph instantiation, NVRTC compiles) add their seconds to a process-wide table, printed
// to stderr when the process exits, the slowest first:
//   fusebox: compile trace (FUSEBOX_COMPILE_TRACE): 41 phases, the slowest 7.820 s
//       3.104 s     75  cuda record attention
//       ...
// Phases nest (the recording of a node inside "cuda record step"), so their sum is not the
// total. Off (unset or 0): a TracePhase costs one load of a flag.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace fusebox {

bool compile_trace_enabled();

// Adds `seconds` (and one call) to `phase`.
void trace_compile_phase(const std::string& phase, double seconds);

// The table so far: (phase, seconds, calls), the slowest first.
struct TracedPhase {
  std::string phase;
  double seconds = 0;
  long calls = 0;
};
std::vector<TracedPhase> traced_compile_phases();

// Times its scope into `phase` when the trace is on.
class TracePhase {
 public:
  explicit TracePhase(const char* phase) : TracePhase(phase, "") {}
  // The phase named prefix + name (the string made only when the trace is on).
  TracePhase(const char* prefix, const char* name);
  ~TracePhase();
  TracePhase(const TracePhase&) = delete;
  TracePhase& operator=(const TracePhase&) = delete;

 private:
  std::string phase_;
  double start_ = -1;  // -1: the trace is off
};

}  // namespace fusebox
