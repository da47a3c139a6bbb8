// Which process of a data-parallel run this is and where the processes meet, from the
// environment torchrun users know (docs/distributed.md):
//
//   FUSEBOX_RANK, FUSEBOX_WORLD_SIZE   this process's rank in [0, world size)
//   FUSEBOX_MASTER_ADDR, _MASTER_PORT  where rank 0's store listens
//   FUSEBOX_LOCAL_RANK                 this process's GPU on its machine (else LOCAL_RANK, else 0)
//   FUSEBOX_DIST_TIMEOUT               seconds any rendezvous or collective may wait (300)
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace fusebox::dist {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;
  int master_port = 0;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};

  // nullopt when none of FUSEBOX_RANK, FUSEBOX_WORLD_SIZE, FUSEBOX_MASTER_ADDR and
  // FUSEBOX_MASTER_PORT is set: a single process. An Error naming the variable when some are
  // set and others not, or a value is not a number or out of range.
  static std::optional<DistEnv> from_env();
};

}  // namespace fusebox::dist
