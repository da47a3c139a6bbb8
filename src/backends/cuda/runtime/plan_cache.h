// Caches of library execution plans (cuDNN convolutions first): keys, an in-memory LRU, and
// serialized plans on disk that a new process reuses without heuristics or timing.
//
//   CacheKeyBuilder key;
//   key.add("op", "conv_fprop").add("x.dim", x_dims).add("dtype", int64_t(dtype));
//   if (Plan* plan = memory.find(key.bytes())) return *plan;           // full-key compare
//   if (auto blob = disk.load(key.bytes())) return memory.insert(key.bytes(), restore(*blob));
//   Plan& plan = memory.insert(key.bytes(), build_by_heuristics_and_timing());
//   disk.store(key.bytes(), serialize(plan));                          // false: kept in memory
//
// Pure C++20 (no CUDA or cuDNN headers), so CI tests it without a GPU. Problems with the disk
// cache (unwritable directory, corrupt or stale files) are warnings on stderr, never errors:
// the plan is rebuilt and the results stay right, only slower.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace fusebox::cuda {

// Writes "[cuda] <message>" and a newline to stderr in one call (lines of concurrent threads
// do not interleave). The warning channel of the plan caches.
void plan_cache_warning(std::string_view message);

// Builds a cache key as bytes, field by field (no struct memcpy: no padding bytes). Each field
// is a type tag, its length-prefixed name and its value, integers as 8 little-endian bytes, so
// different names, orders, types or values give different keys and equal fields equal bytes.
// Keys are compared whole on every hit (never a hash-only match).
class CacheKeyBuilder {
 public:
  CacheKeyBuilder& add(std::string_view field_name, int64_t v);
  CacheKeyBuilder& add(std::string_view field_name, std::span<const int64_t> v);
  CacheKeyBuilder& add(std::string_view field_name, std::string_view v);
  std::string bytes() const { return bytes_; }           // the key (binary)
  std::string describe() const { return description_; }  // "op=conv_fprop x.dim=[1,3,224,224]"

 private:
  void add_name(char tag, std::string_view field_name);
  std::string bytes_;
  std::string description_;
};

// In-memory LRU, keyed by the full key bytes. Capacity 0 = unbounded. Not thread-safe (find
// returns a pointer into the cache): the owner locks if threads share it.
//
// Thrashing: an insertion of a key that this cache evicted earlier (among its last `capacity`
// evictions) is a re-insertion. When more than capacity/2 of a window of `capacity` insertions
// (a window of at least 1) are re-insertions, the working set does not fit: one warning per
// cache goes to stderr naming `capacity_variable`, the setting to raise. Never an abort. The
// evicted-key record holds hashes only: it feeds a warning, never a lookup.
template <class Value, class KeyHash = std::hash<std::string_view>>
class LruCache {
 public:
  struct Stats {
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t insertions = 0;  // new keys and replacements
    uint64_t evictions = 0;
    uint64_t reinsertions = 0;  // insertions of keys evicted earlier (thrashing)
    uint64_t warnings = 0;      // thrashing warnings printed (0 or 1)
  };

  // name: used in warnings, e.g. "conv plan cache"; capacity_variable: the environment
  // variable that sets the capacity, e.g. "FUSEBOX_CONV_PLAN_CACHE" ("" if none).
  LruCache(size_t capacity, std::string name, std::string capacity_variable = {})
      : capacity_(capacity),
        name_(std::move(name)),
        capacity_variable_(std::move(capacity_variable)),
        index_(0, KeyView{}) {}
  LruCache(const LruCache&) = delete;
  LruCache& operator=(const LruCache&) = delete;

  // The cached value (moved to the front), or nullptr.
  Value* find(const std::string& key) {
    auto found = index_.find(std::string_view(key));
    if (found == index_.end()) {
      ++stats_.misses;
      return nullptr;
    }
    ++stats_.hits;
    entries_.splice(entries_.begin(), entries_, found->second);
    return &entries_.front().second;
  }

  // Inserts or replaces the value of `key` (now the most recent); evicts the least recent
  // entries beyond capacity. The reference stays valid until that entry is evicted or replaced.
  Value& insert(const std::string& key, Value v) {
    ++stats_.insertions;
    auto found = index_.find(std::string_view(key));
    if (found != index_.end()) {
      entries_.splice(entries_.begin(), entries_, found->second);
      entries_.front().second = std::move(v);
      return entries_.front().second;
    }
    note_new_key(key);
    entries_.emplace_front(key, std::move(v));
    index_.emplace(std::string_view(entries_.front().first), entries_.begin());
    while (capacity_ != 0 && entries_.size() > capacity_) evict_last();
    return entries_.front().second;
  }

  void clear() {
    index_.clear();
    entries_.clear();
  }

  const Stats& stats() const { return stats_; }
  size_t size() const { return entries_.size(); }
  size_t capacity() const { return capacity_; }
  const std::string& name() const { return name_; }

 private:
  using Entry = std::pair<std::string, Value>;
  using Iterator = typename std::list<Entry>::iterator;
  struct KeyView {  // hashes the key bytes the index's views point at
    size_t operator()(std::string_view key) const { return KeyHash{}(key); }
  };

  void evict_last() {
    const std::string& key = entries_.back().first;
    size_t hash = std::hash<std::string_view>{}(key);
    if (evicted_.insert(hash).second) {
      evicted_order_.push_back(hash);
      if (evicted_order_.size() > capacity_) {
        evicted_.erase(evicted_order_.front());
        evicted_order_.pop_front();
      }
    }
    index_.erase(std::string_view(key));
    entries_.pop_back();
    ++stats_.evictions;
  }

  void note_new_key(const std::string& key) {
    if (capacity_ == 0) return;  // unbounded: nothing is ever evicted
    if (evicted_.count(std::hash<std::string_view>{}(key)) != 0) {
      ++stats_.reinsertions;
      ++window_reinsertions_;
    }
    if (++window_insertions_ < capacity_) return;
    if (window_reinsertions_ > capacity_ / 2 && stats_.warnings == 0) {
      ++stats_.warnings;
      warn_thrashing();
    }
    window_insertions_ = 0;
    window_reinsertions_ = 0;
  }

  void warn_thrashing() const {
    std::string raise = capacity_variable_.empty()
                            ? std::string("raise its capacity")
                            : "raise " + capacity_variable_ + " (0 = unbounded)";
    plan_cache_warning(name_ + ": " + std::to_string(window_reinsertions_) + " of the last " +
                       std::to_string(window_insertions_) +
                       " insertions rebuilt entries it had evicted (capacity " +
                       std::to_string(capacity_) +
                       "); the working set does not fit and plans are rebuilt over and over. " +
                       raise + ". (Warned once.)");
  }

  size_t capacity_;
  std::string name_;
  std::string capacity_variable_;
  std::list<Entry> entries_;  // most recently used first
  // Views of the keys in entries_ (list nodes never move); equality compares all bytes.
  std::unordered_map<std::string_view, Iterator, KeyView> index_;
  std::unordered_set<size_t> evicted_;  // hashes of the last `capacity` evicted keys
  std::list<size_t> evicted_order_;     // the same, oldest first
  size_t window_insertions_ = 0;
  size_t window_reinsertions_ = 0;
  Stats stats_;
};

// Identity of the machine/software a serialized plan is valid for. Part of every file.
struct PlanCacheIdentity {
  std::string gpu_name;          // cudaDeviceProp::name
  int sm = 0;                    // major*10+minor
  int64_t cudnn_version = 0;     // cudnnGetVersion()
  std::string frontend_version;  // cudnn-frontend's version string
};

// Serialized plans on disk: one file per (identity, key), named by a 64-bit FNV-1a hash of
// identity and key (16 hex digits + ".plan"), in a subdirectory of the given root named after
// the identity ("NVIDIA_H100_80GB_HBM3-sm90-cudnn91000-fe1.8.0"), so that machines sharing a
// home directory keep their own plans.
//
// File layout (integers little-endian):
//   "FBXPLAN\n", u32 format version,
//   identity: u32 len + gpu name, i64 sm, i64 cudnn version, u32 len + frontend version,
//   u64 len + the FULL key, u64 len + payload,
//   u64 FNV-1a 64 of every byte before it (always the file's last 8 bytes).
//
// load() checks the file size (at most kMaxFileBytes, so a huge file is never read), the
// magic, the format version, the checksum (FNV-1a detects any single changed byte), every
// length against the bytes present, the identity and the key. A failure is a miss with a
// warning naming the file and the reason, once per file path and cache; the caller rebuilds
// the plan and store() replaces the file.
//
// store() writes a temporary file in the same directory (".tmp-<name>-<pid>-<thread>-<n>",
// created exclusively), then rename()s it over the target: atomic on POSIX, so readers and
// concurrent writers (threads or processes) see a whole old file or a whole new one, never a
// torn one; the last rename wins. No fsync: a crash may lose a plan, which is rebuilt. Any
// failure (directory not creatable, disk full, payload too large) removes the temporary file,
// leaves the existing file as it was, warns once per cache and returns false; nothing throws.
// load() never opens temporary files. Those left by a killed process are removed by the first
// successful store() of each cache when older than a day (one directory listing per process).
//
// An empty directory disables the cache: load() misses and store() returns false, silently.
// Thread-safe.
class DiskPlanCache {
 public:
  static constexpr uint64_t kFormatVersion = 1;
  static constexpr size_t kMaxFileBytes = size_t(64) << 20;  // 64 MiB: plans are KiBs

  struct Stats {
    uint64_t hits = 0;
    uint64_t misses = 0;   // every load() without a payload, including the four below
    uint64_t corrupt = 0;  // unreadable, truncated, oversized, bad magic or checksum
    uint64_t stale = 0;    // another format version or identity
    uint64_t writes = 0;   // successful store()s
    uint64_t write_failures = 0;
    uint64_t collisions = 0;  // a valid file holding another key (same file name)
  };

  DiskPlanCache(std::filesystem::path dir, PlanCacheIdentity identity);  // creates dir lazily
  // The same with the files in dir / `subdirectory`, named by the caller (the NVRTC image
  // cache's "sm90-nvrtc13.0", runtime/nvrtc.h: its identity holds NVRTC's version).
  DiskPlanCache(std::filesystem::path dir, PlanCacheIdentity identity, std::string subdirectory);

  std::optional<std::vector<uint8_t>> load(const std::string& key);
  // False on failure (warned once per cache); never throws.
  bool store(const std::string& key, std::span<const uint8_t> payload) noexcept;

  Stats stats() const;
  // The directory holding the files: the root given to the constructor / the identity's
  // subdirectory ("" when disabled).
  const std::filesystem::path& dir() const { return dir_; }
  // The file that holds `key`'s plan ("" when disabled).
  std::filesystem::path path_of(const std::string& key) const;
  bool enabled() const { return !dir_.empty(); }

 private:
  // A whole file's bytes.
  std::string encode(const std::string& key, std::span<const uint8_t> payload) const;
  void warn_write_once(std::string_view reason);
  void remove_old_temporaries();

  std::filesystem::path dir_;
  PlanCacheIdentity identity_;
  std::string identity_bytes_;  // the encoded identity, as in every file

  mutable std::mutex mutex_;  // guards everything below
  Stats stats_;
  std::set<std::string> warned_files_;
  bool warned_write_ = false;
  bool cleaned_temporaries_ = false;
  uint64_t temporary_counter_ = 0;
};

}  // namespace fusebox::cuda
