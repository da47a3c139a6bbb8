// The compile trace (fusebox/core/compile_trace.h): one mutex-guarded table, printed by a
// static object's destructor at exit.
#include "fusebox/core/compile_trace.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>

namespace fusebox {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Table {
  std::mutex mutex;
  std::map<std::string, std::pair<double, long>> phases;

  ~Table() {
    const std::vector<TracedPhase> rows = traced_compile_phases();
    if (rows.empty()) return;
    const double slowest = rows.front().seconds;  // rows come the slowest first
    std::fprintf(stderr,
                 "fusebox: compile trace (FUSEBOX_COMPILE_TRACE): %zu phases, the slowest %.3f s\n",
                 rows.size(), slowest);
    for (const TracedPhase& r : rows)
      std::fprintf(stderr, "  %9.3f s %6ld  %s\n", r.seconds, r.calls, r.phase.c_str());
  }
};

Table& table() {
  static Table t;  // destroyed (and printed) at exit
  return t;
}

}  // namespace

bool compile_trace_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("FUSEBOX_COMPILE_TRACE");
    return v != nullptr && std::string_view(v) != "" && std::string_view(v) != "0";
  }();
  return enabled;
}

void trace_compile_phase(const std::string& phase, double seconds) {
  Table& t = table();
  std::lock_guard lock(t.mutex);
  auto& [total, calls] = t.phases[phase];
  total += seconds;
  ++calls;
}

std::vector<TracedPhase> traced_compile_phases() {
  Table& t = table();
  std::lock_guard lock(t.mutex);
  std::vector<TracedPhase> rows;
  for (const auto& [phase, entry] : t.phases) rows.push_back({phase, entry.first, entry.second});
  std::sort(rows.begin(), rows.end(),
            [](const TracedPhase& a, const TracedPhase& b) { return a.seconds > b.seconds; });
  return rows;
}

TracePhase::TracePhase(const char* prefix, const char* name) {
  if (!compile_trace_enabled()) return;
  phase_ = std::string(prefix) + name;
  start_ = now_seconds();
}

TracePhase::~TracePhase() {
  if (start_ >= 0) trace_compile_phase(phase_, now_seconds() - start_);
}

}  // namespace fusebox
