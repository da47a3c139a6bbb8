// NCCL for data-parallel runs (docs/distributed.md): a communicator per process, made from
// the unique id rank 0 shares through the store (fusebox/dist/store.h), and its all-reduce on
// a stream — also while that stream is captured into a CUDA graph (NCCL's kernels are
// capturable), so a step's gradient all-reduce replays with the step.
//
//   if (rank == 0) store.set("nccl_id", dist::nccl_unique_id());
//   NcclComm comm(store.get("nccl_id"), rank, world, device);
//   comm.all_reduce_sum(grads, count, DType::f32, stream);
//
// NCCL is loaded at the first use (dlopen of libnccl.so.2 from the library path: on the GPU
// machines the PyTorch environment's nvidia/nccl/lib), and must be of the major.minor release
// whose headers the build used (scripts/setup.sh pins nvidia-nccl-cu13 2.28.9): one NCCL API
// throughout (a patch release of it changes none of the calls used here; the GPU machines'
// PyTorch environments have carried 2.28.9 and 2.28.3). Nothing links it: a process that
// makes no communicator never loads it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "backends/cuda/runtime/allocator.h"
#include "fusebox/backends/cuda.h"
#include "fusebox/core/dtype.h"

namespace fusebox::cuda {

class NcclComm {
 public:
  // ncclCommInitRank on `device` (which becomes current). An Error naming the rank when NCCL
  // cannot be loaded, has another version, or refuses (a wrong id size included).
  NcclComm(const std::string& unique_id, int rank, int world_size, int device);
  ~NcclComm();  // ncclCommDestroy, or nothing after abort()
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  int device() const { return device_; }

  // Queues the in-place sum of `count` elements of `data` (f32, f64, f16, bf16 or i64)
  // across the ranks on `stream`.
  void all_reduce_sum(void* data, size_t count, DType dtype, cudaStream_t stream);
  // Queues the in-place gather of every rank's `bytes` into `data`: rank r's are at
  // data + r * bytes (this rank's are read from there), on `stream`.
  void all_gather(void* data, size_t bytes, cudaStream_t stream);
  // Queues the in-place copy of rank `root`'s `bytes` at `data` to every rank on `stream`.
  void broadcast(void* data, size_t bytes, int root, cudaStream_t stream);

  // Stops every operation of this communicator (ncclCommAbort): after a peer died or hung.
  void abort();

 private:
  void* comm_ = nullptr;  // ncclComm_t
  int rank_ = 0, world_size_ = 1, device_ = 0;
};

// A data-parallel world over NCCL (fusebox/dist/communicator.h): what a CUDA executable's
// all_reduce nodes reduce over (CompileOptions::communicator; kernels/collective/). Its
// host-tensor collectives (start-up: the initial state broadcast from rank 0) go through the
// device on a stream of their own and wait. `order` is the byte every recorded collective
// declares as written, so that the command encoder chains them in recording order: every
// rank then issues them in one order, which NCCL needs (two collectives of one communicator
// running in different orders on two ranks deadlock).
class NcclCommunicator final : public dist::Communicator {
 public:
  NcclCommunicator(const std::string& unique_id, int rank, int world_size, int device);
  ~NcclCommunicator() override;

  int rank() const override { return comm_.rank(); }
  int world_size() const override { return comm_.world_size(); }
  void all_reduce_sum(Tensor& t) override;
  Tensor all_gather(const Tensor& t) override;
  void broadcast(Tensor& t, int root) override;
  void barrier() override;
  void abort() override { comm_.abort(); }

  NcclComm& comm() { return comm_; }
  const DeviceBuffer& order() const { return order_; }

 private:
  template <class Collective>
  void through_device(Tensor& t, Collective&& collective);

  NcclComm comm_;
  DeviceBuffer order_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace fusebox::cuda
