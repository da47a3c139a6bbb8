// A small fixed thread pool. parallel_for splits [0, n) into at most one chunk
// per thread; the caller runs a share too and waits for the rest.
#include "fusebox/core/parallel.h"

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "fusebox/core/error.h"

namespace fusebox {

namespace {

thread_local bool t_inside_pool_task = false;

class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  void submit(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> l(mu_);
      tasks_.push_back(std::move(f));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    t_inside_pool_task = true;
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !tasks_.empty(); });
        if (stop_ && tasks_.empty()) return;
        f = std::move(tasks_.front());
        tasks_.pop_front();
      }
      f();
    }
  }
  std::vector<std::thread> workers_;
  std::deque<std::function<void()>> tasks_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

Pool& pool() {
  static Pool p(num_threads() - 1);
  return p;
}

}  // namespace

int num_threads() {
  // Read once: the pool's size is fixed when it starts.
  static const int n = [] {
    const char* text = std::getenv("FUSEBOX_NUM_THREADS");
    if (text == nullptr || *text == '\0') {
      return std::max(1, int(std::thread::hardware_concurrency()));
    }
    const char* end = text + std::strlen(text);
    int threads = 0;
    const auto [last, error] = std::from_chars(text, end, threads);
    FUSEBOX_CHECK(error == std::errc() && last == end && threads >= 1, "FUSEBOX_NUM_THREADS", "'",
                  text, "' must be a positive number of threads (at most 256 are used)");
    return std::min(threads, 256);
  }();
  return n;
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t chunks = std::min<int64_t>(num_threads(), (n + grain - 1) / grain);
  if (chunks <= 1 || t_inside_pool_task) {
    body(0, n);
    return;
  }
  std::mutex mu;
  std::condition_variable cv;
  int64_t pending = chunks - 1;
  std::exception_ptr error;
  auto run_chunk = [&](int64_t c) {
    int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    try {
      body(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> l(mu);
      if (!error) error = std::current_exception();
    }
  };
  for (int64_t c = 1; c < chunks; ++c) {
    pool().submit([&, c] {
      run_chunk(c);
      std::lock_guard<std::mutex> l(mu);
      if (--pending == 0) cv.notify_one();
    });
  }
  // The caller's own chunk also counts as "inside" so nested loops stay serial.
  t_inside_pool_task = true;
  run_chunk(0);
  t_inside_pool_task = false;
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return pending == 0; });
  if (error) std::rethrow_exception(error);
}

}  // namespace fusebox
