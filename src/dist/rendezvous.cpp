#include "fusebox/dist/rendezvous.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fusebox/core/error.h"

namespace fusebox::dist {
namespace {

constexpr const char* kWhere = "data parallel";

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

// A whole decimal integer in [lo, hi], or an Error naming the variable.
int64_t integer(const char* name, const std::string& text, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  FUSEBOX_CHECK(errno == 0 && end != text.c_str() && *end == '\0', kWhere, name, "='", text,
                "' is not an integer");
  FUSEBOX_CHECK(v >= lo && v <= hi, kWhere, name, "=", v, " is outside [", lo, ", ", hi, "]");
  return v;
}

}  // namespace

std::optional<DistEnv> DistEnv::from_env() {
  const char* names[] = {"FUSEBOX_RANK", "FUSEBOX_WORLD_SIZE", "FUSEBOX_MASTER_ADDR",
                         "FUSEBOX_MASTER_PORT"};
  std::optional<std::string> values[4];
  int set = 0;
  for (int i = 0; i < 4; ++i) set += (values[i] = env(names[i])).has_value();
  if (set == 0) return std::nullopt;
  for (int i = 0; i < 4; ++i)
    FUSEBOX_CHECK(values[i].has_value(), kWhere, names[i],
                  " is not set, but other rendezvous variables are (a data-parallel run needs "
                  "FUSEBOX_RANK, FUSEBOX_WORLD_SIZE, FUSEBOX_MASTER_ADDR and FUSEBOX_MASTER_PORT)");
  DistEnv e;
  e.world_size = int(integer(names[1], *values[1], 1, 1 << 20));
  e.rank = int(integer(names[0], *values[0], 0, e.world_size - 1));
  e.master_addr = *values[2];
  e.master_port = int(integer(names[3], *values[3], 1, 65535));
  if (auto local = env("FUSEBOX_LOCAL_RANK")) {
    e.local_rank = int(integer("FUSEBOX_LOCAL_RANK", *local, 0, 1 << 20));
  } else if (auto torchrun = env("LOCAL_RANK")) {
    e.local_rank = int(integer("LOCAL_RANK", *torchrun, 0, 1 << 20));
  }
  if (auto timeout = env("FUSEBOX_DIST_TIMEOUT"))
    e.timeout = std::chrono::seconds(integer("FUSEBOX_DIST_TIMEOUT", *timeout, 1, 86400));
  return e;
}

}  // namespace fusebox::dist
