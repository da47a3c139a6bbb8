// The rendezvous store (fusebox/dist/store.h) on localhost: keys shared between clients on
// threads and in another process, gets that wait for a later set, counters, and every error
// naming the address: a port in use, an unreachable master, a key not set in time, the store
// gone.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "fusebox/core/error.h"
#include "fusebox/dist/store.h"
#include "testing.h"

namespace fusebox::dist {
namespace {

using std::chrono::milliseconds;

using testing::error_message;

TEST(TcpStore, ClientsShareKeysAndAGetWaitsForALaterSet) {
  TcpStore server("127.0.0.1", 0, true, milliseconds(5000));
  const int port = server.port();
  ASSERT_GT(port, 0);
  TcpStore a("127.0.0.1", port, false, milliseconds(5000));
  TcpStore b("localhost", port, false, milliseconds(5000));
  a.set("k", "value one");
  EXPECT_EQ(b.get("k"), "value one");
  EXPECT_EQ(server.get("k"), "value one");
  a.set("k", std::string("two\0bytes", 9));  // values are bytes, zeros included
  EXPECT_EQ(b.get("k"), std::string("two\0bytes", 9));

  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(150));
    a.set("late", "here");
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(b.get("late"), "here");
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(100));
  late.join();
}

TEST(TcpStore, CountersAddUpAcrossClients) {
  TcpStore server("127.0.0.1", 0, true, milliseconds(5000));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      TcpStore c("127.0.0.1", server.port(), false, milliseconds(5000));
      for (int i = 0; i < 50; ++i) c.add("count", 1);
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(server.add("count", 0), 200);
  EXPECT_EQ(server.add("count", -7), 193);
  EXPECT_EQ(server.add("fresh", 5), 5);
}

// Another process (started before the server listens: its connect retries) sets a key the
// parent reads; then reads one the parent sets.
TEST(TcpStore, ProcessesRendezvous) {
  // A free port: a server on port 0, closed again.
  int port = 0;
  {
    TcpStore probe("127.0.0.1", 0, true, milliseconds(1000));
    port = probe.port();
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int status = 0;
    try {
      TcpStore c("127.0.0.1", port, false, milliseconds(5000));
      c.set("from_child", "hello");
      status = c.get("from_parent") == "world" ? 0 : 2;
    } catch (...) {
      status = 3;
    }
    ::_exit(status);
  }
  std::this_thread::sleep_for(milliseconds(100));
  TcpStore server("127.0.0.1", port, true, milliseconds(5000));
  EXPECT_EQ(server.get("from_child"), "hello");
  server.set("from_parent", "world");
  int status = -1;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(TcpStore, APortInUseIsAnErrorNamingIt) {
  TcpStore first("127.0.0.1", 0, true, milliseconds(1000));
  const std::string port = std::to_string(first.port());
  const std::string message =
      error_message([&] { TcpStore second("127.0.0.1", first.port(), true, milliseconds(1000)); });
  EXPECT_NE(message.find("cannot listen on 0.0.0.0:" + port), std::string::npos) << message;
  EXPECT_NE(message.find("in use"), std::string::npos) << message;
}

TEST(TcpStore, AnUnreachableMasterIsAnErrorWithinTheTimeout) {
  int port = 0;
  {
    TcpStore probe("127.0.0.1", 0, true, milliseconds(1000));
    port = probe.port();
  }  // nothing listens there now
  const auto start = std::chrono::steady_clock::now();
  const std::string message =
      error_message([&] { TcpStore c("127.0.0.1", port, false, milliseconds(300)); });
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_NE(message.find("could not reach the store at 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << message;
  EXPECT_GE(took, milliseconds(300));
  EXPECT_LT(took, milliseconds(5000));
}

TEST(TcpStore, AKeyNotSetInTimeIsAnErrorNamingIt) {
  TcpStore server("127.0.0.1", 0, true, milliseconds(200));
  const std::string message = error_message([&] { server.get("nccl_id"); });
  EXPECT_NE(message.find("'nccl_id' was not set within"), std::string::npos) << message;
  EXPECT_NE(message.find("127.0.0.1:" + std::to_string(server.port())), std::string::npos)
      << message;
}

TEST(TcpStore, AStoreThatStopsIsAnErrorNotAHang) {
  auto server = std::make_unique<TcpStore>("127.0.0.1", 0, true, milliseconds(5000));
  TcpStore c("127.0.0.1", server->port(), false, milliseconds(5000));
  c.set("x", "1");
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(100));
    server.reset();
  });
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_message([&] { c.get("never"); });
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(4000));
  EXPECT_NE(message.find("[store 127.0.0.1:"), std::string::npos) << message;
}

}  // namespace
}  // namespace fusebox::dist
