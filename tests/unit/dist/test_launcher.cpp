// launch_local (fusebox/dist/launcher.h) with shell scripts as ranks: every rank sees its own
// rendezvous variables; a failing rank is named, and stops the others (one that would sleep
// for minutes ends within the grace period); a program that cannot run is named.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "fusebox/dist/launcher.h"

namespace fusebox::dist {
namespace {

using std::chrono::milliseconds;

LaunchResult sh(int world, const std::string& script, milliseconds grace = milliseconds(2000)) {
  return launch_local(world, {"/bin/sh", "-c", script}, grace);
}

// `sh` with `signal` sent to this process (the launcher) half a second in, while the ranks run.
LaunchResult sh_signalled(int signal, int world, const std::string& script) {
  std::thread sender([signal] {
    std::this_thread::sleep_for(milliseconds(500));
    ::kill(::getpid(), signal);  // the launcher's handler takes it
  });
  LaunchResult r = sh(world, script);
  sender.join();
  return r;
}

TEST(LaunchLocal, EveryRankSeesItsVariables) {
  const LaunchResult r = sh(3,
                            "test \"$FUSEBOX_WORLD_SIZE\" = 3 && test \"$FUSEBOX_RANK\" -lt 3 && "
                            "test \"$FUSEBOX_LOCAL_RANK\" = \"$FUSEBOX_RANK\" && "
                            "test \"$FUSEBOX_MASTER_ADDR\" = 127.0.0.1 && "
                            "test \"$FUSEBOX_MASTER_PORT\" -gt 0");
  EXPECT_TRUE(r.ok) << r.why;
  EXPECT_EQ(r.failed_rank, -1);
}

TEST(LaunchLocal, AFailingRankIsNamedAndStopsTheOthers) {
  const auto start = std::chrono::steady_clock::now();
  // Rank 1 fails at once; ranks 0 and 2 would sleep for five minutes.
  const LaunchResult r = sh(3, "if [ \"$FUSEBOX_RANK\" = 1 ]; then exit 3; fi; sleep 300");
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_EQ(r.why, "rank 1 exited with status 3");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(LaunchLocal, ARankThatIgnoresSigtermIsKilledAfterTheGrace) {
  const auto start = std::chrono::steady_clock::now();
  const LaunchResult r =
      sh(2, "if [ \"$FUSEBOX_RANK\" = 0 ]; then exit 1; fi; trap '' TERM; sleep 300",
         milliseconds(300));
  EXPECT_EQ(r.failed_rank, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// Ctrl-C reaches the launcher alone (each rank leads its own process group): it is forwarded,
// and ranks that stop on it with status 130 are no failure; one that ends otherwise still is.
TEST(LaunchLocal, SigintIsForwardedAndRanksStoppingOnItAreNoFailure) {
  LaunchResult r = sh_signalled(SIGINT, 2, "trap 'exit 130' INT; while true; do sleep 0.05; done");
  EXPECT_EQ(r.stop_signal, SIGINT);
  EXPECT_TRUE(r.ok) << r.why;

  r = sh_signalled(
      SIGINT, 2,
      "if [ \"$FUSEBOX_RANK\" = 1 ]; then trap 'exit 4' INT; else trap 'exit 130' INT; fi; "
      "while true; do sleep 0.05; done");
  EXPECT_EQ(r.stop_signal, SIGINT);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.why, "rank 1 exited with status 4");
}

// SIGTERM (a scheduler pre-empting the job) likewise: forwarded as SIGTERM, and ranks that stop
// on it with 143 are no failure; 130 is not what they were asked for.
TEST(LaunchLocal, SigtermIsForwardedAndRanksStoppingOnItAreNoFailure) {
  LaunchResult r =
      sh_signalled(SIGTERM, 2, "trap 'exit 143' TERM; while true; do sleep 0.05; done");
  EXPECT_EQ(r.stop_signal, SIGTERM);
  EXPECT_TRUE(r.ok) << r.why;

  r = sh_signalled(SIGTERM, 2, "trap 'exit 130' TERM; while true; do sleep 0.05; done");
  EXPECT_EQ(r.stop_signal, SIGTERM);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(r.why == "rank 0 exited with status 130" || r.why == "rank 1 exited with status 130")
      << r.why;
}

TEST(LaunchLocal, AProgramThatCannotRunIsNamed) {
  const LaunchResult r = launch_local(2, {"/nonexistent/fusebox-rank"});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.why.find("status 127"), std::string::npos) << r.why;
  EXPECT_NE(r.why.find("/nonexistent/fusebox-rank"), std::string::npos) << r.why;
}

// A child this process made elsewhere keeps its status for its own waiter.
TEST(LaunchLocal, OtherChildrenAreNotReaped) {
  const pid_t other = ::fork();
  ASSERT_GE(other, 0);
  if (other == 0) {
    ::usleep(200 * 1000);
    ::_exit(7);
  }
  EXPECT_TRUE(sh(2, "sleep 0.5").ok);
  int status = 0;
  ASSERT_EQ(::waitpid(other, &status, 0), other);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7);
}

}  // namespace
}  // namespace fusebox::dist
