// Which process of a data-parallel run this is and where the processes meet, from the
// environment torchrun users know (docs/distributed.md):
//
//   FUSEBOX_RANK, FUSEBOX_WORLD_SIZE   this process's rank in [0, world size)
//   FUSEBOX_MASTER_ADDR, _MASTER_PORT  where rank 0's store listens
//   FUSEBOX_LOCAL_RANK                 this process's GPU on its machine (else LOCAL_RANK, else 0)
//   FUSEBOX_DIST_TIMEOUT               seconds any rendezvous or collective may wait (300)
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "fusebox/dist/store.h"

namespace fusebox::dist {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;
  int master_port = 0;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  std::string launcher;  // whose variables: "FUSEBOX_*", "torchrun", "Open MPI", "Slurm"

  // The rank of a data-parallel run from the variables of the first launcher that set any:
  //   FUSEBOX_RANK, FUSEBOX_WORLD_SIZE, FUSEBOX_MASTER_ADDR, FUSEBOX_MASTER_PORT
  //     (FUSEBOX_LOCAL_RANK, else LOCAL_RANK): all four required, a world of 1 included;
  //   torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK;
  //   Open MPI's mpirun: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, with MASTER_ADDR and
  //     MASTER_PORT (mpirun -x MASTER_ADDR=host -x MASTER_PORT=port: MPI has no address);
  //   Slurm's srun: SLURM_PROCID, SLURM_STEP_NUM_TASKS (set by srun, not in a batch script,
  //     whose one process must not wait for the job's other tasks), SLURM_LOCALID; MASTER_ADDR
  //     else the step's first node (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST), MASTER_PORT
  //     else 20000 + (31 * SLURM_JOB_ID + SLURM_STEP_ID) % 20000.
  // FUSEBOX_LOCAL_RANK, when set, overrides every launcher's local rank; FUSEBOX_DIST_TIMEOUT
  // (seconds) the timeout. nullopt: none of them set (a launcher counts when both its rank and
  // world variables are), or a world of 1 under torchrun, mpirun or srun (a single process). An
  // Error naming the variable when the FUSEBOX_* set or a launcher's master address is
  // incomplete, or a value is not a number or out of range.
  static std::optional<DistEnv> from_env();
};

// The first host of a Slurm host list: "gpu[07-09,12],cpu1" -> "gpu07"; "a,b" -> "a".
std::string first_slurm_host(const std::string& nodelist);

// Checks at start-up that every rank runs the same thing. Each rank publishes its `signature`
// (entries such as "world size", "model", "precision", "batch") in the store, then compares
// rank 0's with every rank's; the first difference is an Error, the same on every rank, naming
// the ranks and the entry ("rank 2's model is 'resnet18' where rank 0's is 'resnet50'"). A
// rank that never publishes is the store's timeout error naming its key. `key`: the store
// keys' prefix ("<key>/<rank>"), one per check (e.g. "parameters" at the end of a run, to
// show that no rank's parameters drifted).
void check_same_run(TcpStore& store, int rank, int world_size,
                    const std::map<std::string, std::string>& signature,
                    const std::string& key = "signature");

// The end of a run: rank 0, whose process serves the store, returns once every rank has
// called this with `key` (so that none is still reading the store when rank 0 exits); the
// others return at once. A rank that never arrives is the store's timeout error naming it.
void wait_for_ranks(TcpStore& store, int rank, int world_size, const std::string& key);

}  // namespace fusebox::dist
