#include "fusebox/dist/launcher.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <map>
#include <thread>

#include "fusebox/core/error.h"

extern char** environ;

namespace fusebox::dist {
namespace {

constexpr const char* kWhere = "launch";

// A TCP port nothing listens on now (the system's pick for port 0). Another process may take
// it before rank 0 listens: rank 0's store then reports the port in use, naming it.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FUSEBOX_CHECK(fd >= 0, kWhere, "socket(): ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int e = errno;
  ::close(fd);
  FUSEBOX_CHECK(ok, kWhere, "no free port for the store: ", std::strerror(e));
  return ntohs(addr.sin_port);
}

std::string describe(int rank, int status) {
  if (WIFSIGNALED(status)) return cat("rank ", rank, " was killed by signal ", WTERMSIG(status));
  return cat("rank ", rank, " exited with status ", WEXITSTATUS(status));
}

bool failed(int status) {
  return !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}

// SIGINT or SIGTERM while the ranks run (Ctrl-C reaches the launcher's process group only:
// each rank leads its own; a scheduler pre-empting the job sends SIGTERM): the first is
// forwarded to every rank, which stops after a step all ranks agree on.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_launcher_stop_signal(int signal) {
  if (g_stop_signal == 0) g_stop_signal = signal;
}

// Installs on_launcher_stop_signal for SIGINT and SIGTERM (before the first fork: no signal is
// lost; a child's exec resets them to the default), and puts the previous actions back.
class ForwardStopSignals {
 public:
  ForwardStopSignals() {
    g_stop_signal = 0;
    struct sigaction action {};
    action.sa_handler = on_launcher_stop_signal;
    ::sigemptyset(&action.sa_mask);
    ::sigaction(SIGINT, &action, &previous_interrupt_);
    ::sigaction(SIGTERM, &action, &previous_terminate_);
  }
  ~ForwardStopSignals() {
    ::sigaction(SIGINT, &previous_interrupt_, nullptr);
    ::sigaction(SIGTERM, &previous_terminate_, nullptr);
  }
  ForwardStopSignals(const ForwardStopSignals&) = delete;
  ForwardStopSignals& operator=(const ForwardStopSignals&) = delete;

 private:
  struct sigaction previous_interrupt_ {};
  struct sigaction previous_terminate_ {};
};

}  // namespace

LaunchResult launch_local(int world, const std::vector<std::string>& argv,
                          std::chrono::milliseconds grace) {
  FUSEBOX_CHECK(world >= 1, kWhere, "a world of ", world, " processes");
  FUSEBOX_CHECK(!argv.empty(), kWhere, "no program to start");
  const std::string port = std::to_string(free_port());
  // Everything the children need, built before any fork: between fork and exec a child of a
  // threaded process may only call async-signal-safe functions.
  std::vector<std::string> shared;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (name != "FUSEBOX_RANK" && name != "FUSEBOX_LOCAL_RANK" && name != "FUSEBOX_WORLD_SIZE" &&
        name != "FUSEBOX_MASTER_ADDR" && name != "FUSEBOX_MASTER_PORT")
      shared.push_back(entry);
  }
  shared.push_back("FUSEBOX_WORLD_SIZE=" + std::to_string(world));
  shared.push_back("FUSEBOX_MASTER_ADDR=127.0.0.1");
  shared.push_back("FUSEBOX_MASTER_PORT=" + port);
  std::vector<std::vector<std::string>> envs(size_t(world), shared);
  std::vector<std::vector<char*>> envps(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    envs[size_t(r)].push_back("FUSEBOX_RANK=" + std::to_string(r));
    envs[size_t(r)].push_back("FUSEBOX_LOCAL_RANK=" + std::to_string(r));
    for (std::string& s : envs[size_t(r)]) envps[size_t(r)].push_back(s.data());
    envps[size_t(r)].push_back(nullptr);
  }
  std::vector<std::string> args_copy = argv;
  std::vector<char*> args;
  for (std::string& a : args_copy) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t parent = ::getpid();

  const ForwardStopSignals forwarding;
  std::map<pid_t, int> running;  // pid -> rank
  // Each rank leads a process group of its own: stopping it stops what it started too.
  auto stop_all = [&](int sig) {
    for (const auto& [pid, rank] : running) ::kill(-pid, sig);
  };
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int e = errno;
      stop_all(SIGKILL);
      for (const auto& [p, rank] : running) ::waitpid(p, nullptr, 0);
      throw Error(kWhere, cat("cannot start rank ", r, ": fork(): ", std::strerror(e)));
    }
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(127);  // the launcher is already gone
      ::execvpe(args[0], args.data(), envps[size_t(r)].data());
      ::_exit(127);  // exec failed: the status names it
    }
    ::setpgid(pid, pid);  // as the child does: whichever runs first, the group exists
    running[pid] = r;
  }

  LaunchResult result;
  auto deadline = std::chrono::steady_clock::time_point::max();
  // Each of our children by its pid (waitpid(-1) would also reap children this process made
  // elsewhere, stealing their status), polled every 20 ms.
  while (!running.empty()) {
    for (auto it = running.begin(); it != running.end();) {
      int status = 0;
      const pid_t pid = ::waitpid(it->first, &status, WNOHANG);
      if (pid == 0 || (pid < 0 && errno == EINTR)) {
        ++it;
        continue;
      }
      const int rank = it->second;
      it = running.erase(it);
      if (pid < 0) continue;  // not waitable (gone already): nothing to report
      // After a forwarded SIGINT (SIGTERM) a rank ends with 130 (143): 128 + the signal, it
      // stopped and, rank 0, wrote its checkpoint; which is no failure.
      const bool stopped = result.stop_signal != 0 && WIFEXITED(status) &&
                           WEXITSTATUS(status) == 128 + result.stop_signal;
      if (failed(status) && !stopped && result.ok) {
        result.ok = false;
        result.failed_rank = rank;
        result.why = describe(rank, status);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
          result.why += cat(" (could not run '", argv[0], "'?)");
        stop_all(SIGTERM);
        deadline = std::chrono::steady_clock::now() + grace;
      }
    }
    if (running.empty()) break;
    if (g_stop_signal != 0 && result.stop_signal == 0) {
      result.stop_signal = g_stop_signal;
      stop_all(result.stop_signal);
    }
    // Stopping after a failure: SIGKILL to what is left after the grace period.
    if (std::chrono::steady_clock::now() >= deadline) {
      stop_all(SIGKILL);
      deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return result;
}

}  // namespace fusebox::dist
