#include "fusebox/dist/rendezvous.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

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

namespace {

// "name\0value\0" pairs, in the map's order.
std::string encode(const std::map<std::string, std::string>& signature) {
  std::string out;
  for (const auto& [name, value] : signature) out += name + '\0' + value + '\0';
  return out;
}

std::map<std::string, std::string> decode(const std::string& bytes) {
  std::map<std::string, std::string> out;
  std::vector<std::string> parts;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t end = bytes.find('\0', at);
    if (end == std::string::npos) break;
    parts.push_back(bytes.substr(at, end - at));
    at = end + 1;
  }
  for (size_t i = 0; i + 1 < parts.size(); i += 2) out[parts[i]] = parts[i + 1];
  return out;
}

}  // namespace

void check_same_run(TcpStore& store, int rank, int world_size,
                    const std::map<std::string, std::string>& signature, const std::string& key) {
  std::map<std::string, std::string> mine = signature;
  mine["world size"] = std::to_string(world_size);
  store.set(key + "/" + std::to_string(rank), encode(mine));
  const std::map<std::string, std::string> first = decode(store.get(key + "/0"));
  // The world size first: a rank that counts more ranks would wait for ranks that never come.
  FUSEBOX_CHECK(first.count("world size") && first.at("world size") == mine["world size"], kWhere,
                "rank ", rank, "'s world size is ", world_size, " where rank 0's is ",
                first.count("world size") ? first.at("world size") : "unknown");
  for (int r = 1; r < world_size; ++r) {
    const std::map<std::string, std::string> other =
        r == rank ? mine : decode(store.get(key + "/" + std::to_string(r)));
    for (const auto& [name, value] : first) {
      const auto it = other.find(name);
      FUSEBOX_CHECK(it != other.end() && it->second == value, kWhere, "rank ", r, "'s ", name,
                    " is ", it == other.end() ? std::string("missing") : "'" + it->second + "'",
                    " where rank 0's is '", value, "'");
    }
    for (const auto& [name, value] : other)
      FUSEBOX_CHECK(first.count(name), kWhere, "rank ", r, " has ", name, " '", value,
                    "' where rank 0 has none");
  }
}

void wait_for_ranks(TcpStore& store, int rank, int world_size, const std::string& key) {
  if (rank != 0) {
    store.set(key + "/" + std::to_string(rank), "arrived");
    return;
  }
  for (int r = 1; r < world_size; ++r) store.get(key + "/" + std::to_string(r));
}

}  // namespace fusebox::dist
