// The collectives of a data-parallel run, as the backends use them (docs/distributed.md): the
// CPU backend's all_reduce node and the CUDA executable take any Communicator. It lives in core,
// below the backends, because they use it; the worlds that implement it are made above them:
// MPI's in dist (mpi_world(), fusebox/dist/communicator.h), NCCL's in the CUDA backend
// (nccl_communicator(), fusebox/backends/cuda.h).
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

}  // namespace fusebox::dist
