// Starting the processes of a data-parallel run on this machine (`fusebox train --gpus N`,
// docs/distributed.md): one process per rank, the rendezvous variables set
// (fusebox/dist/rendezvous.h), all of them waited for. When one fails the others are stopped,
// and the result names the rank that failed first and how.
//
//   LaunchResult r = launch_local(4, {"/proc/self/exe", "train", "resnet50", ...});
//   if (!r.ok) throw Error("fusebox train", r.why);   // "rank 2 exited with status 1"
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace fusebox::dist {

struct LaunchResult {
  bool ok = true;
  int failed_rank = -1;  // the first rank that failed (-1: none)
  std::string why;       // "rank 2 exited with status 1", "rank 0 was killed by signal 9"
  // SIGINT (Ctrl-C) or SIGTERM (a scheduler's pre-emption) this process got while the ranks
  // ran (the first; 0: none): it was forwarded to every rank, and a rank then ending with status
  // 128 + that signal (130, 143: stopped on request) counts as no failure.
  int stop_signal = 0;
};

// Runs `world` copies of argv (argv[0]: the program, looked up in PATH) with FUSEBOX_RANK and
// FUSEBOX_LOCAL_RANK = the rank, FUSEBOX_WORLD_SIZE = world, FUSEBOX_MASTER_ADDR = 127.0.0.1
// and FUSEBOX_MASTER_PORT = a port free when they start, added to this process's environment.
// Returns when all have ended. After the first failure (a non-zero status, a signal) the
// others get SIGTERM, and SIGKILL after `grace`. Children die with this process (their
// parent-death signal is SIGTERM). SIGINT or SIGTERM to this process while they run is
// forwarded to each (LaunchResult::stop_signal). An Error when a process cannot be started.
LaunchResult launch_local(int world, const std::vector<std::string>& argv,
                          std::chrono::milliseconds grace = std::chrono::seconds(5));

}  // namespace fusebox::dist
