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

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry: up to the first comma outside brackets.
  size_t depth = 0, cut = nodelist.size();
  for (size_t i = 0; i < nodelist.size(); ++i) {
    if (nodelist[i] == '[') ++depth;
    if (nodelist[i] == ']' && depth > 0) --depth;
    if (nodelist[i] == ',' && depth == 0) {
      cut = i;
      break;
    }
  }
  const std::string entry = nodelist.substr(0, cut);
  const size_t open = entry.find('['), close = entry.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return entry;
  // prefix[first-..,..]suffix: the range's first number as written (zero padding kept).
  const std::string ranges = entry.substr(open + 1, close - open - 1);
  const size_t stop = ranges.find_first_of(",-");
  return entry.substr(0, open) + ranges.substr(0, stop) + entry.substr(close + 1);
}

namespace {

// The variables' own names, for the messages.
struct LauncherVars {
  const char* launcher;
  const char* rank;
  const char* world;
  const char* local;  // may be unset
};

// rank / world / local rank from one launcher's variables, when both its rank and world
// variables are set (a launcher sets both: one alone is another tool's); nullopt otherwise.
std::optional<DistEnv> read_rank(const LauncherVars& v) {
  const std::optional<std::string> rank = env(v.rank), world = env(v.world);
  if (!rank || !world) return std::nullopt;
  DistEnv e;
  e.launcher = v.launcher;
  e.world_size = int(integer(v.world, *world, 1, 1 << 20));
  e.rank = int(integer(v.rank, *rank, 0, e.world_size - 1));
  if (auto local = env(v.local)) e.local_rank = int(integer(v.local, *local, 0, 1 << 20));
  return e;
}

// MASTER_ADDR and MASTER_PORT, required (torchrun, mpirun).
void read_master(DistEnv& e) {
  const std::optional<std::string> addr = env("MASTER_ADDR"), port = env("MASTER_PORT");
  FUSEBOX_CHECK(addr && port, kWhere, e.launcher, " started rank ", e.rank, " of ", e.world_size,
                ", but ", addr ? "MASTER_PORT" : "MASTER_ADDR",
                " is not set: the ranks meet at MASTER_ADDR:MASTER_PORT",
                e.launcher == std::string("Open MPI")
                    ? " (mpirun -x MASTER_ADDR=<rank 0's host> -x MASTER_PORT=<a free port>)"
                    : "");
  e.master_addr = *addr;
  e.master_port = int(integer("MASTER_PORT", *port, 1, 65535));
}

// The FUSEBOX_* set: all four or none.
std::optional<DistEnv> fusebox_env() {
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
  e.launcher = "FUSEBOX_*";
  e.world_size = int(integer(names[1], *values[1], 1, 1 << 20));
  e.rank = int(integer(names[0], *values[0], 0, e.world_size - 1));
  e.master_addr = *values[2];
  e.master_port = int(integer(names[3], *values[3], 1, 65535));
  if (auto torchrun = env("LOCAL_RANK"))
    e.local_rank = int(integer("LOCAL_RANK", *torchrun, 0, 1 << 20));
  return e;
}

// Rank 0's address under srun: MASTER_ADDR/PORT where given, else the step's first node and a
// port from the job and step ids.
void read_slurm_master(DistEnv& e) {
  if (auto addr = env("MASTER_ADDR")) {
    e.master_addr = *addr;
  } else {
    const std::optional<std::string> nodes =
        env("SLURM_STEP_NODELIST") ? env("SLURM_STEP_NODELIST") : env("SLURM_JOB_NODELIST");
    FUSEBOX_CHECK(nodes.has_value(), kWhere,
                  "Slurm: neither MASTER_ADDR nor SLURM_STEP_NODELIST / SLURM_JOB_NODELIST is "
                  "set: no address for rank 0");
    e.master_addr = first_slurm_host(*nodes);
  }
  if (auto port = env("MASTER_PORT")) {
    e.master_port = int(integer("MASTER_PORT", *port, 1, 65535));
  } else {
    const std::optional<std::string> job = env("SLURM_JOB_ID"), step = env("SLURM_STEP_ID");
    FUSEBOX_CHECK(job.has_value(), kWhere,
                  "Slurm: neither MASTER_PORT nor SLURM_JOB_ID is set: no port for rank 0");
    const int64_t id = integer("SLURM_JOB_ID", *job, 0, int64_t(1) << 40);
    const int64_t step_id = step ? integer("SLURM_STEP_ID", *step, 0, int64_t(1) << 40) : 0;
    e.master_port = int(20000 + (31 * id + step_id) % 20000);
  }
}

// torchrun, mpirun or srun, the first whose rank variables are set; nullopt for none, or for a
// world of 1 (a single process).
std::optional<DistEnv> launcher_env() {
  struct Launcher {
    LauncherVars vars;
    void (*master)(DistEnv&);
  };
  static const Launcher launchers[] = {
      {{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"}, read_master},
      {{"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
       read_master},
      // SLURM_STEP_NUM_TASKS is srun's: a batch script's lone process has SLURM_NTASKS only.
      {{"Slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"}, read_slurm_master},
  };
  for (const Launcher& l : launchers) {
    std::optional<DistEnv> e = read_rank(l.vars);
    if (!e) continue;
    if (e->world_size == 1) return std::nullopt;
    l.master(*e);
    return e;
  }
  return std::nullopt;
}

}  // namespace

std::optional<DistEnv> DistEnv::from_env() {
  std::optional<DistEnv> e = fusebox_env();
  if (!e) e = launcher_env();
  if (!e) return std::nullopt;
  if (auto local = env("FUSEBOX_LOCAL_RANK"))
    e->local_rank = int(integer("FUSEBOX_LOCAL_RANK", *local, 0, 1 << 20));
  if (auto timeout = env("FUSEBOX_DIST_TIMEOUT"))
    e->timeout = std::chrono::seconds(integer("FUSEBOX_DIST_TIMEOUT", *timeout, 1, 86400));
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
