// TcpStore (fusebox/dist/store.h). One TCP connection per client; each request is a frame
//   op (1 byte) | key length (4) | key | value length (4) | value | wait in ms (8)
// answered by
//   status (1 byte: 0 found, 1 not set within the wait) | length (4) | payload
// (integers little-endian). The server answers each connection on its own thread; a get of
// a missing key waits there on a condition variable, at most the wait the client sent.
#include "fusebox/dist/store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "fusebox/core/error.h"

namespace fusebox::dist {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3 };
enum Status : uint8_t { kFound = 0, kNotSet = 1 };

std::string where(const std::string& address) {
  return "store " + address;
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}
uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

// Sends all of `data`; false when the peer is gone.
bool send_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

// Reads exactly n bytes, waiting for each at most until `deadline` and giving up early when
// `stop` becomes true. kOk, or why not.
enum class Read { ok, closed, timed_out, stopped };
Read recv_all(int fd, void* out, size_t n, Clock::time_point deadline,
              const std::atomic<bool>* stop = nullptr) {
  auto* p = static_cast<char*>(out);
  size_t done = 0;
  while (done < n) {
    if (stop != nullptr && stop->load()) return Read::stopped;
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Read::timed_out;
    pollfd pfd{fd, POLLIN, 0};
    // Short slices when a stop flag is watched, so that a server shuts down promptly.
    const int r = ::poll(&pfd, 1, int(std::min<int64_t>(left, stop != nullptr ? 100 : left)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Read::closed;
    if (r == 0) continue;
    const ssize_t got = ::recv(fd, p + done, n - done, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) return Read::closed;
    done += size_t(got);
  }
  return Read::ok;
}

std::string errno_text(int e) {
  return std::strerror(e);
}

}  // namespace

// The server: a listening socket, an accepting thread, a thread per client connection.
class TcpStore::Server {
 public:
  explicit Server(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUSEBOX_CHECK(fd_ >= 0, "store", "socket(): ", errno_text(errno));
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(uint16_t(port));
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(fd_, 128) != 0) {
      const int e = errno;
      ::close(fd_);
      throw Error(where(cat("0.0.0.0:", port)),
                  cat("cannot listen on 0.0.0.0:", port, ": ", errno_text(e)));
    }
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~Server() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    acceptor_.join();
    ::close(fd_);
    std::vector<std::thread> clients;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int c : client_fds_) ::shutdown(c, SHUT_RDWR);
      clients.swap(clients_);
    }
    changed_.notify_all();
    for (std::thread& t : clients) t.join();
    for (int c : client_fds_) ::close(c);
  }

  int port() const { return port_; }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, 100) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      const int one = 1;
      ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) {
        ::close(c);
        break;
      }
      client_fds_.push_back(c);
      clients_.emplace_back([this, c] { serve(c); });
    }
  }

  // Answers one client's requests until it disconnects or the server stops.
  void serve(int fd) {
    const auto forever = Clock::time_point::max();
    for (;;) {
      unsigned char head[5];
      if (recv_all(fd, head, 5, forever, &stop_) != Read::ok) return;
      std::string key(get_le(head + 1, 4), '\0');
      unsigned char len[4], wait[8];
      if (recv_all(fd, key.data(), key.size(), forever, &stop_) != Read::ok ||
          recv_all(fd, len, 4, forever, &stop_) != Read::ok)
        return;
      std::string value(get_le(len, 4), '\0');
      if (recv_all(fd, value.data(), value.size(), forever, &stop_) != Read::ok ||
          recv_all(fd, wait, 8, forever, &stop_) != Read::ok)
        return;
      uint8_t status = kFound;
      std::string payload;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        switch (head[0]) {
          case kSet:
            data_[key] = value;
            changed_.notify_all();
            break;
          case kGet: {
            const auto deadline = Clock::now() + milliseconds(get_le(wait, 8));
            changed_.wait_until(lock, deadline, [&] { return stop_ || data_.count(key) > 0; });
            if (data_.count(key) > 0) {
              payload = data_[key];
            } else {
              status = kNotSet;
            }
            break;
          }
          case kAdd: {
            if (value.size() != 8) return;  // not our protocol: drop the connection
            int64_t counter = 0;
            if (auto it = data_.find(key); it != data_.end() && it->second.size() == 8)
              counter =
                  int64_t(get_le(reinterpret_cast<const unsigned char*>(it->second.data()), 8));
            counter += int64_t(get_le(reinterpret_cast<const unsigned char*>(value.data()), 8));
            std::string stored;
            put_u64(stored, uint64_t(counter));
            data_[key] = stored;
            payload = stored;
            changed_.notify_all();
            break;
          }
          default:
            return;  // not our protocol: drop the connection
        }
      }
      std::string reply(1, char(status));
      put_u32(reply, uint32_t(payload.size()));
      reply += payload;
      if (!send_all(fd, reply)) return;
    }
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> data_;
  std::vector<std::thread> clients_;
  std::vector<int> client_fds_;
};

TcpStore::TcpStore(std::string host, int port, bool serve, milliseconds timeout)
    : host_(std::move(host)), port_(port), timeout_(timeout) {
  if (serve) {
    server_ = std::make_unique<Server>(port);
    port_ = server_->port();
  }
  // Connect, retrying until the timeout: the master may not be listening yet.
  const auto deadline = Clock::now() + timeout_;
  std::string last = "no attempt";
  for (;;) {
    addrinfo hints{}, *found = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    const int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &found);
    if (rc != 0) {
      last = ::gai_strerror(rc);
    } else {
      for (addrinfo* a = found; a != nullptr && fd_ < 0; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          fd_ = fd;
        } else {
          last = errno_text(errno);
          ::close(fd);
        }
      }
      ::freeaddrinfo(found);
    }
    if (fd_ >= 0) break;
    if (Clock::now() >= deadline)
      throw Error(where(address()),
                  cat("could not reach the store at ", address(), " within ",
                      std::chrono::duration<double>(timeout_).count(), " s: ", last));
    std::this_thread::sleep_for(milliseconds(50));
  }
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();
}

std::string TcpStore::address() const {
  return cat(host_, ":", port_);
}

std::string TcpStore::request(uint8_t op, const std::string& key, std::string_view value,
                              milliseconds wait) {
  std::string frame(1, char(op));
  put_u32(frame, uint32_t(key.size()));
  frame += key;
  put_u32(frame, uint32_t(value.size()));
  frame += value;
  put_u64(frame, uint64_t(wait.count()));
  std::lock_guard<std::mutex> lock(mutex_);
  FUSEBOX_CHECK(send_all(fd_, frame), where(address()),
                "the store closed the connection (has rank 0 stopped?) while sending '", key, "'");
  // The server answers a get within `wait`; the reply itself gets the timeout again.
  const auto deadline = Clock::now() + wait + timeout_;
  unsigned char head[5];
  Read r = recv_all(fd_, head, 5, deadline);
  std::string payload;
  if (r == Read::ok) {
    payload.resize(get_le(head + 1, 4));
    r = recv_all(fd_, payload.data(), payload.size(), deadline);
  }
  FUSEBOX_CHECK(r != Read::timed_out, where(address()), "no answer from the store for '", key,
                "' within ", std::chrono::duration<double>(wait + timeout_).count(), " s");
  FUSEBOX_CHECK(r == Read::ok, where(address()),
                "the store closed the connection (has rank 0 stopped?) while waiting for '", key,
                "'");
  FUSEBOX_CHECK(head[0] == kFound, where(address()), "key '", key, "' was not set within ",
                std::chrono::duration<double>(wait).count(), " s");
  return payload;
}

void TcpStore::set(const std::string& key, std::string_view value) {
  request(kSet, key, value, milliseconds(0));
}

std::string TcpStore::get(const std::string& key) {
  return request(kGet, key, {}, timeout_);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::string v;
  put_u64(v, uint64_t(delta));
  const std::string r = request(kAdd, key, v, milliseconds(0));
  return int64_t(get_le(reinterpret_cast<const unsigned char*>(r.data()), 8));
}

}  // namespace fusebox::dist
