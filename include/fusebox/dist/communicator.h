// The data-parallel worlds made in dist (docs/distributed.md): MPI's for the CPU backend.
// The Communicator interface itself is core's (fusebox/core/communicator.h), NCCL's world the
// CUDA backend's (nccl_communicator(), fusebox/backends/cuda.h).
#pragma once

#include <memory>

#include "fusebox/core/communicator.h"

namespace fusebox::dist {

// The MPI world of this process: MPI is initialised on the first call (mpirun says the rank
// and the world size) and finalised at exit. An Error when MPI fails.
std::shared_ptr<Communicator> mpi_world();

}  // namespace fusebox::dist
