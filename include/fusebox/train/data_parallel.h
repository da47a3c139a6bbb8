// Joining a data-parallel run (docs/distributed.md) from the environment a launcher sets
// (`fusebox train --gpus N`, torchrun-style schedulers: fusebox/dist/rendezvous.h).
//
//   std::optional<DataParallelRun> run = join_data_parallel_run(Device::cuda, signature);
//   SessionOptions opts{.device = Device::cuda};
//   if (run) opts.data_parallel.world = run->world;     // else: one process
//   TrainingSession session(model, loss, optimizer, opts);
//   // rank r trains on batches i * world + r of the stream (shard_batch_index)
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "fusebox/dist/communicator.h"
#include "fusebox/dist/rendezvous.h"
#include "fusebox/dist/store.h"
#include "fusebox/runtime/executor.h"

namespace fusebox {

struct DataParallelRun {
  dist::DistEnv env;
  std::unique_ptr<dist::TcpStore> store;  // rank 0 serves it for the whole run
  std::shared_ptr<dist::Communicator> world;
};

// nullopt when the environment names no run (a single process). Otherwise: this process uses
// GPU env.local_rank (use_cuda_device), meets the others at the store (rank 0 serves it),
// checks that every rank runs the same thing (`signature`: check_same_run, world size
// included), and makes the NCCL communicator from the unique id rank 0 shares. Errors name
// the variable, the address or the mismatch; only the CUDA backend trains data-parallel this
// way (the CPU backend's world is mpi_world(), under mpirun).
std::optional<DataParallelRun> join_data_parallel_run(
    Device device, const std::map<std::string, std::string>& signature);

// Stops a rank whose steps stop completing (docs/distributed.md, "Failures"): when a peer
// died or hangs, this rank's step waits in its gradient all-reduce for good (a queued step
// also blocks the host once three are in flight), so a thread of its own watches. When no
// progress() came for `timeout` it calls on_stall with a message naming the rank and the
// step; the default (stop_on_stall) prints it, aborts the world's collectives and ends the
// process with status 1, which the launcher (--gpus) reports, stopping the other ranks.
class StepWatchdog {
 public:
  using OnStall = std::function<void(const std::string& message)>;
  // `peers` (optional): what the message adds about the other ranks (which one is behind:
  // peer_progress).
  StepWatchdog(int rank, std::chrono::milliseconds timeout, OnStall on_stall,
               std::function<std::string()> peers = {});
  ~StepWatchdog();
  StepWatchdog(const StepWatchdog&) = delete;
  StepWatchdog& operator=(const StepWatchdog&) = delete;
  // Step `step` (counting from 1) has completed: the clock starts again for the next.
  void progress(int64_t step);

 private:
  void watch();
  int rank_;
  std::chrono::milliseconds timeout_;
  OnStall on_stall_;
  std::function<std::string()> peers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  int64_t step_ = 0;
  std::chrono::steady_clock::time_point last_;
  std::thread thread_;
};

// StepWatchdog's default action for `run`: stderr, run.world->abort() (given two seconds: it
// can block), std::_Exit(1).
StepWatchdog::OnStall stop_on_stall(const DataParallelRun& run);

// Each rank's last completed step, kept in the run's store ("progress/<rank>"), so that a stalled
// rank can say which rank is behind: publish() at most once a second (a store round trip);
// describe() reads every rank's entry: "rank 1 last completed step 12, the others 40" (or why
// it cannot: the store's host is gone).
class PeerProgress {
 public:
  explicit PeerProgress(DataParallelRun& run) : run_(run) {}
  void publish(int64_t step);
  std::string describe() const;

 private:
  DataParallelRun& run_;
  std::chrono::steady_clock::time_point last_{};
};

// SIGINT (Ctrl-C) or SIGTERM in a data-parallel run (the launcher forwards them to every rank;
// a scheduler signals each rank itself): the ranks agree, through the store, on the step they
// all stop after, the most any of them has queued (`queued`: this rank's step count); each then
// queues steps up to it. Every rank must call it; one that does not is the store's timeout
// error naming its key.
int64_t agree_on_last_step(DataParallelRun& run, int64_t queued);

// The batch rank `rank` of `world` trains on at step `step` (counting from 0): the ranks take
// consecutive batches of one stream, so a step on W ranks with batch B sees the samples one
// process with batch W * B would, in the same order (deterministic for a seed and a world
// size).
inline int64_t shard_batch_index(int64_t step, int rank, int world) {
  return step * world + rank;
}

}  // namespace fusebox
