#include "fusebox/train/data_parallel.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fusebox/backends/cuda.h"
#include "fusebox/core/error.h"

namespace fusebox {

std::optional<DataParallelRun> join_data_parallel_run(
    Device device, const std::map<std::string, std::string>& signature) {
  std::optional<dist::DistEnv> env = dist::DistEnv::from_env();
  if (!env) return std::nullopt;
  const std::string where = cat("data parallel: rank ", env->rank, " of ", env->world_size);
  FUSEBOX_CHECK(device == Device::cuda, where,
                "data-parallel training runs on CUDA (NCCL); the CPU backend's runs under "
                "mpirun with mpi_world()");
  DataParallelRun run;
  run.env = *env;
  use_cuda_device(env->local_rank);
  run.store = std::make_unique<dist::TcpStore>(env->master_addr, env->master_port, env->rank == 0,
                                               env->timeout);
  dist::check_same_run(*run.store, env->rank, env->world_size, signature);
  if (env->rank == 0) run.store->set("nccl/unique_id", dist::nccl_unique_id());
  run.world = dist::nccl_communicator(run.store->get("nccl/unique_id"), env->rank, env->world_size,
                                      env->local_rank);
  return run;
}

StepWatchdog::StepWatchdog(int rank, std::chrono::milliseconds timeout, OnStall on_stall,
                           std::function<std::string()> peers)
    : rank_(rank),
      timeout_(timeout),
      on_stall_(std::move(on_stall)),
      peers_(std::move(peers)),
      last_(std::chrono::steady_clock::now()),
      thread_([this] { watch(); }) {}

StepWatchdog::~StepWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StepWatchdog::progress(int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  step_ = step;
  last_ = std::chrono::steady_clock::now();
}

void StepWatchdog::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    const auto deadline = last_ + timeout_;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string message =
          cat("data parallel: rank ", rank_, ": step ", step_ + 1, " has not completed within ",
              std::chrono::duration<double>(timeout_).count(),
              " s (FUSEBOX_DIST_TIMEOUT): its gradient all-reduce waits for a rank that died or "
              "hangs");
      lock.unlock();
      if (peers_) message += " (" + peers_() + ")";
      on_stall_(message);
      return;
    }
    wake_.wait_until(lock, deadline);
  }
}

StepWatchdog::OnStall stop_on_stall(const DataParallelRun& run) {
  std::shared_ptr<dist::Communicator> world = run.world;
  return [world](const std::string& message) {
    std::fprintf(stderr, "fusebox: error: %s; stopping\n", message.c_str());
    std::fflush(stderr);
    // ncclCommAbort can block while a kernel of the step's graph still waits for the missing
    // rank (seen on the H200s: a rank stopped with SIGSTOP kept its peer's abort waiting): it
    // gets two seconds on a thread of its own, then the process ends, and the driver frees the
    // GPU's work and memory with it.
    if (world) std::thread([world] { world->abort(); }).detach();
    std::this_thread::sleep_for(std::chrono::seconds(2));
    std::_Exit(1);
  };
}

void PeerProgress::publish(int64_t step) {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < std::chrono::seconds(1)) return;
  last_ = now;
  run_.store->set(cat("progress/", run_.env.rank), std::to_string(step));
}

std::string PeerProgress::describe() const {
  // A client of its own (the main thread may hold the run's), with a short wait per key: a rank
  // that never published has no entry, and the store may be gone.
  try {
    dist::TcpStore store(run_.env.master_addr, run_.env.master_port, false,
                         std::chrono::milliseconds(2000));
    std::map<int64_t, std::vector<int>> ranks_at;  // last completed step -> ranks
    for (int r = 0; r < run_.env.world_size; ++r) {
      if (r == run_.env.rank) continue;
      int64_t step = 0;  // no report yet: it has not completed a step (or a second of them)
      try {
        step = std::stoll(store.get(cat("progress/", r)));
      } catch (const Error&) {
      }
      ranks_at[step].push_back(r);
    }
    if (ranks_at.empty()) return "no other rank";
    std::string text;
    for (const auto& [step, ranks] : ranks_at) {
      if (!text.empty()) text += "; ";
      for (size_t i = 0; i < ranks.size(); ++i) text += cat(i ? ", " : "rank ", ranks[i]);
      text += cat(" last reported step ", step);
    }
    return text;
  } catch (const Error& e) {
    return cat("the store at rank 0 cannot be read: ", e.what());
  }
}

int64_t agree_on_last_step(DataParallelRun& run, int64_t queued) {
  run.store->set(cat("stop/", run.env.rank), std::to_string(queued));
  int64_t last = queued;
  for (int r = 0; r < run.env.world_size; ++r)
    last = std::max<int64_t>(last, std::stoll(run.store->get(cat("stop/", r))));
  return last;
}

}  // namespace fusebox
