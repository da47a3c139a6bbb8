// The collectives of a data-parallel run (docs/distributed.md), over the library that serves
// the backend: MPI for the CPU backend (mpi_world()), NCCL for CUDA (nccl_communicator()).
//
//   std::shared_ptr<Communicator> world = mpi_world();   // a process started by mpirun
//   world->all_reduce_sum(gradient);                      // every rank: the same bits
#pragma once

#include <memory>

#include "fusebox/core/tensor.h"

namespace fusebox::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Replaces `t` by the elementwise sum of every rank's `t` (same dtype and shape on every
  // rank): f32, f64 and i64 summed in their type, f16 and bf16 in f32 and rounded once. Every
  // rank gets the same bits (the sum is made once, then sent to all), and the same inputs give
  // the same bits run after run.
  virtual void all_reduce_sum(Tensor& t) = 0;
  // Every rank's `t` (one dtype and shape on every rank), stacked in rank order:
  // [world size, t's shape...], the same bits on every rank.
  virtual Tensor all_gather(const Tensor& t) = 0;
  // Replaces `t` by rank `root`'s `t`.
  virtual void broadcast(Tensor& t, int root) = 0;
  virtual void barrier() = 0;
  // Stops this world's collectives in progress for good, after a peer died or hangs (NCCL:
  // ncclCommAbort, so that a process waiting in one can exit; MPI: MPI_Abort, which ends the
  // whole job). Nothing may be called afterwards.
  virtual void abort() = 0;
};

// The MPI world of this process: MPI is initialised on the first call (mpirun says the rank
// and the world size) and finalised at exit. An Error when MPI fails.
std::shared_ptr<Communicator> mpi_world();

// NCCL (CUDA backend): a new unique id (made by rank 0, shared through the store), and the
// communicator of `rank` on `device` (this process's GPU: runtime's use_cuda_device) made
// from it. Errors name the rank (NCCL not loadable, another version, a refusal).
std::string nccl_unique_id();
std::shared_ptr<Communicator> nccl_communicator(const std::string& unique_id, int rank,
                                                int world_size, int device);

}  // namespace fusebox::dist
