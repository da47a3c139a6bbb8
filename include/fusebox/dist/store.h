// A small key-value store over TCP for the rendezvous of a data-parallel run
// (docs/distributed.md): rank 0 serves it at the master address, every rank (rank 0 too)
// connects as a client. It carries start-up data (the NCCL unique id, each rank's signature,
// barrier counters), never tensors.
//
//   TcpStore store(addr, port, /*serve=*/rank == 0, timeout);
//   if (rank == 0) store.set("nccl_id", id);
//   std::string id = store.get("nccl_id");    // waits until rank 0 has set it
//   store.add("ready", 1);                    // a counter every rank bumps
//
// Every failure is an Error naming the address and what was waited for: a port already in
// use, a master not reachable within the timeout, a key not set within it, the store gone.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace fusebox::dist {

class TcpStore {
 public:
  // serve: listen on `port` of every interface first (port 0: one the system picks; see
  // port()) and answer clients until destroyed. Then connect to host:port, retrying until
  // `timeout` (the master may start after this process).
  TcpStore(std::string host, int port, bool serve, std::chrono::milliseconds timeout);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, std::string_view value);
  // The value of `key`, waiting until some client sets it, at most the timeout.
  std::string get(const std::string& key);
  // Adds `delta` to the counter `key` (0 when unset) and returns its new value.
  int64_t add(const std::string& key, int64_t delta);

  // The port served or connected to (the system's pick when constructed with port 0).
  int port() const { return port_; }
  // "host:port", as errors name it.
  std::string address() const;

 private:
  class Server;
  std::string request(uint8_t op, const std::string& key, std::string_view value,
                      std::chrono::milliseconds wait);

  std::string host_;
  int port_ = 0;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Server> server_;
  int fd_ = -1;
  std::mutex mutex_;  // one request at a time on the connection
};

}  // namespace fusebox::dist
