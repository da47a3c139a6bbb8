// The plan caches: keys, the in-memory LRU and the files on disk. These need no GPU.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/runtime/plan_cache.h"
#include "backends/cuda/runtime/settings.h"
#include "fusebox/core/error.h"
#include "testing.h"

extern char** environ;

namespace fusebox::cuda {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

// ---- helpers ---------------------------------------------------------------------------------

using fusebox::testing::TempDir;
// Sets (a value) or unsets (std::nullopt) a variable for one scope.
using ScopedEnvVar = fusebox::testing::ScopedEnv;

PlanCacheIdentity h100() {
  return {"NVIDIA H100 80GB HBM3", 90, 91000, "1.23.0"};
}

Bytes bytes_of(std::string_view text) {
  return Bytes(text.begin(), text.end());
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const fs::path& path, std::string_view bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// The names of the files in `dir`.
std::vector<std::string> file_names(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

size_t count_of(const std::string& text, std::string_view part) {
  size_t count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) {
    ++count;
  }
  return count;
}

// The file format's checksum (runtime/plan_cache.h), to forge files whose checksum is right.
uint64_t fnv1a64(std::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

void put_u64_at(std::string& file, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) file[at + size_t(i)] = char((v >> (8 * i)) & 0xFF);
}

// Replaces the last 8 bytes with the checksum of the rest.
void reseal(std::string& file) {
  put_u64_at(file, file.size() - 8, fnv1a64(std::string_view(file).substr(0, file.size() - 8)));
}

// The key of a small convolution problem.
std::string conv_key(int64_t batch) {
  std::vector<int64_t> dims{batch, 3, 17, 19};
  return CacheKeyBuilder().add("op", "conv_fprop").add("x.dim", dims).add("dtype", 2).bytes();
}

// ---- CacheKeyBuilder -------------------------------------------------------------------------

TEST(PlanCacheKey, EqualFieldsGiveEqualBytes) {
  std::vector<int64_t> dims{1, 3, 224, 224};
  auto build = [&] {
    return CacheKeyBuilder().add("op", "conv_fprop").add("x.dim", dims).add("groups", 1).bytes();
  };
  EXPECT_EQ(build(), build());
  EXPECT_EQ(conv_key(4), conv_key(4));
  EXPECT_NE(conv_key(4), conv_key(5));
  // Integers are 8 little-endian bytes, whatever the host: the last field of the key.
  std::string key = CacheKeyBuilder().add("v", int64_t(0x0102030405060708)).bytes();
  EXPECT_EQ(key.substr(key.size() - 8), std::string("\x08\x07\x06\x05\x04\x03\x02\x01", 8));
}

TEST(PlanCacheKey, NamesOrderTypesAndValuesAllMatter) {
  std::vector<int64_t> one_two{1, 2};
  std::vector<int64_t> none;
  std::vector<std::string> keys = {
      CacheKeyBuilder().bytes(),
      CacheKeyBuilder().add("a", 1).bytes(),
      CacheKeyBuilder().add("a", 2).bytes(),
      CacheKeyBuilder().add("a", -1).bytes(),
      CacheKeyBuilder().add("b", 1).bytes(),
      CacheKeyBuilder().add("a", "1").bytes(),  // string, not integer
      CacheKeyBuilder().add("a", 1).add("b", 2).bytes(),
      CacheKeyBuilder().add("b", 2).add("a", 1).bytes(),  // order
      CacheKeyBuilder().add("a", one_two).bytes(),
      CacheKeyBuilder().add("a", 1).add("a", 2).bytes(),  // two fields, not an array
      CacheKeyBuilder().add("a", none).bytes(),
      CacheKeyBuilder().add("a", "").bytes(),
      CacheKeyBuilder().add("ab", "c").bytes(),  // field boundaries are length-prefixed
      CacheKeyBuilder().add("a", "bc").bytes(),
      CacheKeyBuilder().add("a", std::string_view("b\0c", 3)).bytes(),
      CacheKeyBuilder().add("a", std::string_view("b\0d", 3)).bytes(),
  };
  for (size_t i = 0; i < keys.size(); ++i) {
    for (size_t j = i + 1; j < keys.size(); ++j) {
      EXPECT_NE(keys[i], keys[j]) << "keys " << i << " and " << j;
    }
  }
}

TEST(PlanCacheKey, DescribeListsFieldsInOrder) {
  std::vector<int64_t> dims{8, 64, 56, 56};
  std::vector<int64_t> none;
  CacheKeyBuilder key;
  key.add("op", "conv_fprop").add("x.dim", dims).add("pad", none).add("groups", -2);
  EXPECT_EQ(key.describe(), "op=conv_fprop x.dim=[8,64,56,56] pad=[] groups=-2");
  EXPECT_EQ(CacheKeyBuilder().describe(), "");
}

// ---- LruCache --------------------------------------------------------------------------------

TEST(PlanCacheLru, HitsMissesAndEvictionOrder) {
  LruCache<int> cache(3, "test cache");
  EXPECT_EQ(cache.capacity(), 3u);
  EXPECT_EQ(cache.find("a"), nullptr);
  cache.insert("a", 1);
  cache.insert("b", 2);
  cache.insert("c", 3);
  ASSERT_NE(cache.find("a"), nullptr);  // order now a, c, b (most recent first)
  EXPECT_EQ(*cache.find("a"), 1);
  cache.insert("d", 4);  // evicts b, the least recently used
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.find("b"), nullptr);
  EXPECT_NE(cache.find("c"), nullptr);  // order c, d, a
  cache.insert("e", 5);                 // evicts a
  EXPECT_EQ(cache.find("a"), nullptr);
  ASSERT_NE(cache.find("d"), nullptr);
  EXPECT_EQ(*cache.find("d"), 4);
  EXPECT_EQ(*cache.find("e"), 5);
  auto stats = cache.stats();
  EXPECT_EQ(stats.hits, 6u);
  EXPECT_EQ(stats.misses, 3u);
  EXPECT_EQ(stats.insertions, 5u);
  EXPECT_EQ(stats.evictions, 2u);
  cache.clear();
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.find("d"), nullptr);
}

TEST(PlanCacheLru, InsertReplacesAndRefreshes) {
  LruCache<std::unique_ptr<int>> cache(2, "test cache");  // move-only values work
  cache.insert("a", std::make_unique<int>(1));
  cache.insert("b", std::make_unique<int>(2));
  std::unique_ptr<int>& replaced = cache.insert("a", std::make_unique<int>(10));  // a now newest
  EXPECT_EQ(*replaced, 10);
  EXPECT_EQ(cache.size(), 2u);
  cache.insert("c", std::make_unique<int>(3));  // evicts b, not the refreshed a
  EXPECT_EQ(cache.find("b"), nullptr);
  ASSERT_NE(cache.find("a"), nullptr);
  EXPECT_EQ(**cache.find("a"), 10);
  EXPECT_EQ(cache.stats().evictions, 1u);
  EXPECT_EQ(cache.stats().insertions, 4u);
}

// Every key hashes alike: only a whole-key comparison can tell them apart.
struct CollidingHash {
  size_t operator()(std::string_view) const { return 42; }
};

TEST(PlanCacheLru, WholeKeyIsComparedWhenHashesCollide) {
  LruCache<int, CollidingHash> cache(0, "test cache");
  std::vector<std::string> keys;
  for (int64_t i = 0; i < 50; ++i) keys.push_back(conv_key(i));
  keys.push_back(std::string("\0\0", 2));
  keys.push_back(std::string("\0", 1));
  keys.push_back("");
  for (size_t i = 0; i < keys.size(); ++i) cache.insert(keys[i], int(i));
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_NE(cache.find(keys[i]), nullptr) << i;
    EXPECT_EQ(*cache.find(keys[i]), int(i));
  }
  EXPECT_EQ(cache.find(conv_key(50)), nullptr);
  EXPECT_EQ(cache.find(std::string("\0\0\0", 3)), nullptr);
}

TEST(PlanCacheLru, UnboundedNeverEvicts) {
  LruCache<int> cache(0, "test cache");
  for (int i = 0; i < 1000; ++i) cache.insert(std::to_string(i), i);
  EXPECT_EQ(cache.size(), 1000u);
  EXPECT_EQ(cache.stats().evictions, 0u);
  EXPECT_EQ(*cache.find("0"), 0);
}

TEST(PlanCacheLru, ThrashingWarnsOnceAndKeepsWorking) {
  LruCache<int> cache(4, "conv plan cache", "FUSEBOX_TEST_PLAN_CACHE");
  ::testing::internal::CaptureStderr();
  // A cycle over 5 keys through 4 places: every lookup misses, every insertion evicts the
  // key asked for next.
  for (int round = 0; round < 20; ++round) {
    for (int k = 0; k < 5; ++k) {
      std::string key = "k" + std::to_string(k);
      if (cache.find(key) == nullptr) cache.insert(key, k);
    }
  }
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(err, "[cuda]"), 1u) << err;
  EXPECT_NE(err.find("conv plan cache"), std::string::npos) << err;
  EXPECT_NE(err.find("FUSEBOX_TEST_PLAN_CACHE"), std::string::npos) << err;
  EXPECT_NE(err.find("capacity 4"), std::string::npos) << err;
  auto stats = cache.stats();
  EXPECT_EQ(stats.hits, 0u);
  EXPECT_EQ(stats.misses, 100u);
  EXPECT_EQ(stats.evictions, 96u);
  EXPECT_EQ(stats.reinsertions, 95u);
  EXPECT_EQ(stats.warnings, 1u);
  EXPECT_EQ(cache.size(), 4u);
  EXPECT_EQ(*cache.find("k4"), 4);
}

TEST(PlanCacheLru, NoThrashingWarningWhenEvictedKeysAreNotAskedAgain) {
  LruCache<int> cache(4, "conv plan cache", "FUSEBOX_TEST_PLAN_CACHE");
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 1000; ++i) {  // a stream of new keys evicts all the time: no thrashing
    std::string key = "k" + std::to_string(i);
    if (cache.find(key) == nullptr) cache.insert(key, i);
    if (i % 4 == 0) {
      ASSERT_NE(cache.find("k" + std::to_string(i)), nullptr);
    }
  }
  // A working set of 4 fits: hits only.
  for (int round = 0; round < 50; ++round) {
    for (int k = 0; k < 4; ++k) {
      std::string key = "w" + std::to_string(k);
      if (cache.find(key) == nullptr) cache.insert(key, k);
    }
  }
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "");
  EXPECT_EQ(cache.stats().warnings, 0u);
  EXPECT_EQ(cache.stats().evictions, 1000u);
  EXPECT_EQ(cache.stats().reinsertions, 0u);
}

TEST(PlanCacheLru, CapacityOneThrashingWarns) {
  LruCache<int> cache(1, "tiny cache");
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 10; ++i) {
    std::string key = i % 2 == 0 ? "a" : "b";
    if (cache.find(key) == nullptr) cache.insert(key, i);
  }
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(err, "[cuda] tiny cache"), 1u) << err;
  EXPECT_NE(err.find("raise its capacity"), std::string::npos) << err;
}

TEST(PlanCacheLru, CapacityFromEnvironment) {
  {
    ScopedEnvVar unset("FUSEBOX_CONV_PLAN_CACHE", std::nullopt);
    EXPECT_EQ(settings().conv.plan_cache_capacity, 256u);
  }
  {
    ScopedEnvVar set("FUSEBOX_CONV_PLAN_CACHE", "17");
    EXPECT_EQ(settings().conv.plan_cache_capacity, 17u);
  }
  {
    ScopedEnvVar unbounded("FUSEBOX_CONV_PLAN_CACHE", "0");
    EXPECT_EQ(settings().conv.plan_cache_capacity, 0u);
  }
  ScopedEnvVar bad("FUSEBOX_CONV_PLAN_CACHE", "many");
  try {
    settings();
    FAIL() << "no error for a malformed capacity";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FUSEBOX_CONV_PLAN_CACHE='many'"), std::string::npos)
        << e.what();
  }
}

// ---- BackendSettings::cache_dir ----------------------------------------------------------------

TEST(DiskPlanCache, DefaultDirectoryFollowsTheEnvironment) {
  ScopedEnvVar home("HOME", "/home/someone");
  {
    ScopedEnvVar dir("FUSEBOX_CACHE_DIR", "/scratch/plans");
    ScopedEnvVar xdg("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(settings().cache_dir, fs::path("/scratch/plans"));
  }
  ScopedEnvVar dir("FUSEBOX_CACHE_DIR", std::nullopt);
  {
    ScopedEnvVar xdg("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(settings().cache_dir, fs::path("/xdg/fusebox"));
  }
  {
    ScopedEnvVar relative_xdg("XDG_CACHE_HOME", "relative");  // ignored, as the spec says
    EXPECT_EQ(settings().cache_dir, fs::path("/home/someone/.cache/fusebox"));
  }
  ScopedEnvVar xdg("XDG_CACHE_HOME", std::nullopt);
  EXPECT_EQ(settings().cache_dir, fs::path("/home/someone/.cache/fusebox"));
  ScopedEnvVar no_home("HOME", std::nullopt);
  EXPECT_EQ(settings().cache_dir, fs::path());
}

// ---- DiskPlanCache: round trips --------------------------------------------------------------

TEST(DiskPlanCache, RoundTrip) {
  TempDir tmp;
  DiskPlanCache cache(tmp.path(), h100());
  EXPECT_TRUE(cache.enabled());
  EXPECT_EQ(cache.dir(), tmp.path() / "NVIDIA_H100_80GB_HBM3-sm90-cudnn91000-fe1.23.0");
  std::string key = conv_key(1);
  EXPECT_EQ(cache.load(key), std::nullopt);  // nothing stored, no directory yet
  EXPECT_FALSE(fs::exists(cache.dir()));

  Bytes payload = bytes_of(std::string("serialized\0plan\xff", 16));
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(cache.store(key, payload));
  EXPECT_EQ(cache.load(key), payload);
  // Binary keys, an empty payload, a replacement.
  std::string binary_key("\0\x01\xff", 3);
  EXPECT_TRUE(cache.store(binary_key, Bytes{}));
  EXPECT_EQ(cache.load(binary_key), Bytes{});
  EXPECT_TRUE(cache.store(key, bytes_of("newer plan")));
  EXPECT_EQ(cache.load(key), bytes_of("newer plan"));
  EXPECT_EQ(cache.load(conv_key(2)), std::nullopt);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");  // plain misses are silent

  EXPECT_EQ(cache.path_of(key).parent_path(), cache.dir());
  EXPECT_EQ(cache.path_of(key).extension(), ".plan");
  EXPECT_NE(cache.path_of(key), cache.path_of(binary_key));
  std::vector<std::string> names = file_names(cache.dir());
  EXPECT_EQ(names.size(), 2u);
  auto stats = cache.stats();
  EXPECT_EQ(stats.hits, 3u);
  EXPECT_EQ(stats.misses, 2u);
  EXPECT_EQ(stats.writes, 3u);
  EXPECT_EQ(stats.corrupt + stats.stale + stats.collisions + stats.write_failures, 0u);

  // Another cache object (another process, in effect) with the same identity reads them.
  DiskPlanCache again(tmp.path(), h100());
  EXPECT_EQ(again.load(key), bytes_of("newer plan"));
}

TEST(DiskPlanCache, EmptyDirectoryDisablesIt) {
  DiskPlanCache cache("", h100());
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.enabled());
  EXPECT_FALSE(cache.store("k", bytes_of("plan")));
  EXPECT_EQ(cache.load("k"), std::nullopt);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(cache.stats().misses, 1u);
}

TEST(DiskPlanCache, ThreadsShareOneCache) {
  TempDir tmp;
  DiskPlanCache cache(tmp.path(), h100());
  std::vector<std::thread> threads;
  std::array<int, 4> failures{};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        std::string key = conv_key(i % 5);
        Bytes payload = bytes_of("plan " + std::to_string(i % 5) + " from " + std::to_string(t));
        if (!cache.store(key, payload)) ++failures[size_t(t)];
        std::optional<Bytes> loaded = cache.load(key);
        // Some thread's plan for this key, whole.
        std::string text = loaded ? std::string(loaded->begin(), loaded->end()) : "";
        if (text.rfind("plan " + std::to_string(i % 5) + " from ", 0) != 0) {
          ++failures[size_t(t)];
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures, (std::array<int, 4>{}));
  EXPECT_EQ(cache.stats().writes, 200u);
  EXPECT_EQ(file_names(cache.dir()).size(), 5u);
}

// ---- DiskPlanCache: a second process ---------------------------------------------------------

constexpr const char* kChildDirVariable = "FUSEBOX_PLAN_CACHE_TEST_CHILD_DIR";

// Runs in a child process only (SecondProcessReusesPlans starts it): loads what the parent
// stored, and stores a plan of its own for the parent to load.
TEST(DiskPlanCache, DISABLED_ChildProcessHelper) {
  const char* dir = std::getenv(kChildDirVariable);
  ASSERT_NE(dir, nullptr) << "run by DiskPlanCache.SecondProcessReusesPlans";
  DiskPlanCache cache(dir, h100());
  EXPECT_EQ(cache.load(conv_key(7)), bytes_of("plan written by the parent"));
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_TRUE(cache.store(conv_key(8), bytes_of("plan written by the child")));
}

TEST(DiskPlanCache, SecondProcessReusesPlans) {
  TempDir tmp;
  DiskPlanCache cache(tmp.path(), h100());
  ASSERT_TRUE(cache.store(conv_key(7), bytes_of("plan written by the parent")));

  std::string log = (tmp.path() / "child.log").string();
  std::string dir_setting = std::string(kChildDirVariable) + "=" + tmp.path().string();
  std::vector<std::string> args = {"/proc/self/exe", "--gtest_also_run_disabled_tests",
                                   "--gtest_filter=DiskPlanCache.DISABLED_ChildProcessHelper"};
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(dir_setting.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t child = 0;
  int spawned = posix_spawn(&child, "/proc/self/exe", &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ASSERT_EQ(spawned, 0) << "posix_spawn failed";
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  std::string child_output = read_file(log);
  ASSERT_TRUE(WIFEXITED(status)) << child_output;
  EXPECT_EQ(WEXITSTATUS(status), 0) << child_output;
  EXPECT_NE(child_output.find("[  PASSED  ] 1 test"), std::string::npos) << child_output;

  EXPECT_EQ(cache.load(conv_key(8)), bytes_of("plan written by the child"));
}

// ---- DiskPlanCache: damaged files ------------------------------------------------------------

// Loads `key` with a fresh cache (warnings are once per cache and file) and expects a miss
// with one warning naming the file; returns the warning.
std::string expect_miss_with_warning(const fs::path& root, const std::string& key,
                                     const std::string& context) {
  DiskPlanCache cache(root, h100());
  ::testing::internal::CaptureStderr();
  std::optional<Bytes> loaded = cache.load(key);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(loaded, std::nullopt) << context;
  EXPECT_EQ(count_of(err, "[cuda] plan cache on disk: ignoring " + cache.path_of(key).string()), 1u)
      << context << ": " << err;
  auto stats = cache.stats();
  EXPECT_EQ(stats.misses, 1u) << context;
  EXPECT_EQ(stats.hits, 0u) << context;
  return err;
}

TEST(DiskPlanCache, EveryFlippedByteIsAMissWithAWarning) {
  TempDir tmp;
  DiskPlanCache cache(tmp.path(), h100());
  std::string key = CacheKeyBuilder().add("op", "conv").add("n", 3).bytes();
  ASSERT_TRUE(cache.store(key, bytes_of("tiny plan")));
  fs::path path = cache.path_of(key);
  const std::string good = read_file(path);
  ASSERT_GT(good.size(), 60u);
  for (size_t at = 0; at < good.size(); ++at) {
    for (uint8_t mask : {0x01, 0x80, 0xFF}) {
      std::string bad = good;
      bad[at] = char(uint8_t(bad[at]) ^ mask);
      write_file(path, bad);
      expect_miss_with_warning(tmp.path(), key, "byte " + std::to_string(at));
    }
  }
  // Warned once per file: a second load of the same bad file by the same cache is quiet.
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(cache.load(key), std::nullopt);
  EXPECT_EQ(cache.load(key), std::nullopt);
  EXPECT_EQ(count_of(::testing::internal::GetCapturedStderr(), "[cuda]"), 1u);
  EXPECT_EQ(cache.stats().corrupt, 2u);
  // Rebuilt: store() replaces the damaged file.
  EXPECT_TRUE(cache.store(key, bytes_of("rebuilt plan")));
  EXPECT_EQ(cache.load(key), bytes_of("rebuilt plan"));
}

TEST(DiskPlanCache, EveryTruncationIsAMissWithAWarning) {
  TempDir tmp;
  DiskPlanCache cache(tmp.path(), h100());
  std::string key = conv_key(3);
  ASSERT_TRUE(cache.store(key, bytes_of("a plan of a few bytes")));
  fs::path path = cache.path_of(key);
  const std::string good = read_file(path);
  for (size_t size = 0; size < good.size(); ++size) {
    write_file(path, good.substr(0, size));
    expect_miss_with_warning(tmp.path(), key, "truncated to " + std::to_string(size));
  }
  write_file(path, good + "x");  // one byte too many
  expect_miss_with_warning(tmp.path(), key, "one byte appended");
  write_file(path, good);
  EXPECT_EQ(DiskPlanCache(tmp.path(), h100()).load(key), bytes_of("a plan of a few bytes"));
}

TEST(DiskPlanCache, LengthFieldsAreNeverTrusted) {
  TempDir tmp;
  DiskPlanCache cache(tmp.path(), h100());
  std::string key = conv_key(3);
  const std::string payload = "abc";
  ASSERT_TRUE(cache.store(key, bytes_of(payload)));
  fs::path path = cache.path_of(key);
  const std::string good = read_file(path);
  // Layout: ..., u64 key size, key, u64 payload size, payload, u64 checksum.
  size_t payload_size_at = good.size() - 8 - payload.size() - 8;
  size_t key_size_at = payload_size_at - key.size() - 8;
  for (size_t at : {payload_size_at, key_size_at}) {
    for (uint64_t claim : {uint64_t(4) << 30, ~uint64_t(0), uint64_t(1), uint64_t(0)}) {
      std::string forged = good;
      put_u64_at(forged, at, claim);
      reseal(forged);  // the checksum is right: only the length checks can catch it
      write_file(path, forged);
      std::string err = expect_miss_with_warning(tmp.path(), key, "claim " + std::to_string(claim));
      EXPECT_NE(err.find("length fields"), std::string::npos) << err;
    }
  }
}

TEST(DiskPlanCache, HugeFileIsNotRead) {
  TempDir tmp;
  DiskPlanCache cache(tmp.path(), h100());
  std::string key = conv_key(3);
  ASSERT_TRUE(cache.store(key, bytes_of("plan")));
  fs::path path = cache.path_of(key);
  fs::resize_file(path, uint64_t(5) << 30);  // sparse: 5 GiB claimed, nothing written
  auto start = std::chrono::steady_clock::now();
  std::string err = expect_miss_with_warning(tmp.path(), key, "5 GiB file");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_NE(err.find("exceed the limit"), std::string::npos) << err;
  EXPECT_TRUE(cache.store(key, bytes_of("plan")));  // replaced
  EXPECT_EQ(fs::file_size(path), read_file(path).size());
  EXPECT_LT(fs::file_size(path), 1000u);
}

TEST(DiskPlanCache, OtherIdentityOrFormatIsStale) {
  TempDir tmp;
  std::string key = conv_key(1);
  PlanCacheIdentity a = h100();
  DiskPlanCache writer(tmp.path(), a);
  ASSERT_TRUE(writer.store(key, bytes_of("plan for a")));
  const std::string file_of_a = read_file(writer.path_of(key));

  std::vector<PlanCacheIdentity> others(4, a);
  others[0].gpu_name = "NVIDIA H200";
  others[1].sm = 100;
  others[2].cudnn_version = 90800;
  others[3].frontend_version = "1.22.0";
  for (const PlanCacheIdentity& b : others) {
    DiskPlanCache reader(tmp.path(), b);
    EXPECT_EQ(reader.load(key), std::nullopt);  // another directory and file name: a plain miss
    EXPECT_EQ(reader.stats().stale, 0u);
    // A's file where B looks (as if file names collided): detected by the identity fields.
    write_file(reader.path_of(key), file_of_a);
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(reader.load(key), std::nullopt);
    std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(reader.stats().stale, 1u) << b.gpu_name;
    EXPECT_NE(err.find("written for 'NVIDIA H100 80GB HBM3' sm90, cuDNN 91000"), std::string::npos)
        << err;
    EXPECT_TRUE(reader.store(key, bytes_of("plan for b")));
    EXPECT_EQ(reader.load(key), bytes_of("plan for b"));
  }
  EXPECT_EQ(writer.load(key), bytes_of("plan for a"));  // untouched

  // Another format version (after the magic), with a right checksum.
  std::string future = file_of_a;
  future[8] = char(2);
  reseal(future);
  write_file(writer.path_of(key), future);
  std::string err = expect_miss_with_warning(tmp.path(), key, "format 2");
  EXPECT_NE(err.find("format version 2"), std::string::npos) << err;
}

TEST(DiskPlanCache, AnotherKeyUnderTheSameFileNameIsAMiss) {
  TempDir tmp;
  DiskPlanCache cache(tmp.path(), h100());
  std::string key_a = conv_key(1), key_b = conv_key(2);
  ASSERT_TRUE(cache.store(key_b, bytes_of("plan for b")));
  // Force a file-name collision: b's file where a's belongs.
  fs::copy_file(cache.path_of(key_b), cache.path_of(key_a));
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(cache.load(key_a), std::nullopt);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("another key"), std::string::npos) << err;
  EXPECT_EQ(cache.stats().collisions, 1u);
  EXPECT_EQ(cache.load(key_b), bytes_of("plan for b"));
}

TEST(DiskPlanCache, NonFileIsAMissWithAWarning) {
  TempDir tmp;
  DiskPlanCache cache(tmp.path(), h100());
  std::string key = conv_key(1);
  fs::create_directories(cache.path_of(key));  // a directory where the file belongs
  std::string err = expect_miss_with_warning(tmp.path(), key, "directory");
  EXPECT_NE(err.find("not a regular file"), std::string::npos) << err;
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.store(key, bytes_of("plan")));  // rename over a directory fails
  EXPECT_EQ(count_of(::testing::internal::GetCapturedStderr(), "[cuda]"), 1u);
  EXPECT_EQ(file_names(cache.dir()).size(), 1u);  // no temporary file left behind
}

// ---- DiskPlanCache: failed writes ------------------------------------------------------------

TEST(DiskPlanCache, UncreatableDirectoryWarnsOnceAndNeverThrows) {
  TempDir tmp;
  write_file(tmp.path() / "a_file", "not a directory");
  DiskPlanCache cache(tmp.path() / "a_file" / "cache", h100());  // even root cannot create it
  ::testing::internal::CaptureStderr();
  bool stored_first = true, stored_second = true;
  EXPECT_NO_THROW(stored_first = cache.store(conv_key(1), bytes_of("plan")));
  EXPECT_NO_THROW(stored_second = cache.store(conv_key(2), bytes_of("plan")));
  EXPECT_FALSE(stored_first);
  EXPECT_FALSE(stored_second);
  EXPECT_EQ(cache.load(conv_key(1)), std::nullopt);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(err, "[cuda]"), 1u) << err;
  EXPECT_NE(err.find("cannot create the directory"), std::string::npos) << err;
  EXPECT_NE(err.find("kept in memory only"), std::string::npos) << err;
  EXPECT_EQ(cache.stats().write_failures, 2u);
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_EQ(read_file(tmp.path() / "a_file"), "not a directory");

  if (::geteuid() != 0) {  // permissions do not bind root
    DiskPlanCache locked(tmp.path() / "locked", h100());
    ASSERT_TRUE(locked.store(conv_key(1), bytes_of("old plan")));
    fs::permissions(locked.dir(), fs::perms::owner_read | fs::perms::owner_exec);
    ::testing::internal::CaptureStderr();
    EXPECT_FALSE(locked.store(conv_key(1), bytes_of("new plan")));
    EXPECT_EQ(count_of(::testing::internal::GetCapturedStderr(), "[cuda]"), 1u);
    EXPECT_EQ(locked.load(conv_key(1)), bytes_of("old plan"));
  }
}

TEST(DiskPlanCache, WriteFailingHalfwayKeepsTheOldFile) {
  TempDir tmp;
  DiskPlanCache cache(tmp.path(), h100());
  std::string key = conv_key(1);
  ASSERT_TRUE(cache.store(key, bytes_of("old plan")));
  // A child whose files may not exceed 200 bytes (write() then fails with EFBIG, as on a
  // full disk) tries to replace the plan with a larger one.
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (std::freopen("/dev/null", "w", stderr) == nullptr) ::_exit(2);  // its expected warning
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{200, 200};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    DiskPlanCache writer(tmp.path(), h100());
    bool stored = writer.store(key, Bytes(1000, 7));
    bool one_failure = writer.stats().write_failures == 1;
    ::_exit(!stored && one_failure ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "store() did not report the failed write";
  EXPECT_EQ(cache.load(key), bytes_of("old plan"));
  EXPECT_EQ(file_names(cache.dir()),
            std::vector<std::string>{cache.path_of(key).filename().string()});
}

TEST(DiskPlanCache, OversizedPayloadIsRefused) {
  TempDir tmp;
  DiskPlanCache cache(tmp.path(), h100());
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.store(conv_key(1), Bytes(DiskPlanCache::kMaxFileBytes + 1)));
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("exceeds the file limit"), std::string::npos) << err;
  EXPECT_EQ(cache.stats().write_failures, 1u);
}

// ---- DiskPlanCache: temporary files ----------------------------------------------------------

TEST(DiskPlanCache, OldTemporaryFilesAreRemovedFreshOnesKept) {
  TempDir tmp;
  DiskPlanCache first(tmp.path(), h100());
  std::string key = conv_key(1);
  ASSERT_TRUE(first.store(key, bytes_of("plan")));
  const std::string good = read_file(first.path_of(key));
  std::string stem = first.path_of(key).stem().string();
  // Left by killed writers: a whole file and a torn one, a day and a half ago and just now.
  fs::path old_whole = first.dir() / (".tmp-" + stem + "-1-2-3");
  fs::path old_torn = first.dir() / (".tmp-" + stem + "-4-5-6");
  fs::path fresh = first.dir() / (".tmp-" + stem + "-7-8-9");
  write_file(old_whole, good);
  write_file(old_torn, good.substr(0, 10));
  write_file(fresh, good.substr(0, 10));
  auto long_ago = fs::file_time_type::clock::now() - std::chrono::hours(36);
  fs::last_write_time(old_whole, long_ago);
  fs::last_write_time(old_torn, long_ago);
  fs::remove(first.path_of(key));

  DiskPlanCache second(tmp.path(), h100());
  EXPECT_EQ(second.load(key), std::nullopt);                       // temporary files are never read
  EXPECT_TRUE(second.store(conv_key(2), bytes_of("other plan")));  // cleans up once
  EXPECT_FALSE(fs::exists(old_whole));
  EXPECT_FALSE(fs::exists(old_torn));
  EXPECT_TRUE(fs::exists(fresh));  // may belong to a writer still running
}

// ---- DiskPlanCache: concurrent processes -----------------------------------------------------

// Payload `iteration` of writer `writer` for key `key_id`: a header naming them, then bytes
// derived from them, up to 24 KiB long, so that a mix of two writes cannot pass for one.
Bytes writer_payload(uint32_t writer, uint32_t iteration, uint32_t key_id) {
  uint32_t seed = writer * 1000003u + iteration * 7919u + key_id * 104729u + 1;
  size_t size = 12 + seed % (24 << 10);
  Bytes payload(size);
  for (int i = 0; i < 4; ++i) {
    payload[size_t(i)] = uint8_t(writer >> (8 * i));
    payload[size_t(4 + i)] = uint8_t(iteration >> (8 * i));
    payload[size_t(8 + i)] = uint8_t(key_id >> (8 * i));
  }
  for (size_t i = 12; i < size; ++i) {
    seed = seed * 1664525u + 1013904223u;
    payload[i] = uint8_t(seed >> 24);
  }
  return payload;
}

uint32_t field_of(const Bytes& payload, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(payload[at + size_t(i)]) << (8 * i);
  return v;
}

// Whether `payload` is exactly one that some writer stored for `key_id`.
bool is_stored_payload(const Bytes& payload, uint32_t key_id, uint32_t writers, uint32_t stores) {
  if (payload.size() < 12) return false;
  uint32_t writer = field_of(payload, 0), iteration = field_of(payload, 4);
  return writer < writers && iteration < stores && field_of(payload, 8) == key_id &&
         payload == writer_payload(writer, iteration, key_id);
}

TEST(DiskPlanCache, ConcurrentWriterProcessesNeverTearAFile) {
  constexpr uint32_t kWriters = 8, kStores = 200, kShared = 4, kOwn = 4;
  TempDir tmp;
  // Keys 0..3 are written by every writer, keys 100*w + 0..3 by writer w only.
  auto key_of = [](uint32_t key_id) { return conv_key(int64_t(key_id)); };
  int gate[2];
  ASSERT_EQ(::pipe(gate), 0);
  std::vector<pid_t> children;
  for (uint32_t w = 0; w < kWriters; ++w) {
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {  // only file system calls here, then _exit
      ::close(gate[1]);
      char byte;
      while (::read(gate[0], &byte, 1) < 0 && errno == EINTR) {
      }  // EOF: every writer starts at once
      DiskPlanCache cache(tmp.path(), h100());
      int status = 0;
      for (uint32_t i = 0; i < kStores; ++i) {
        uint32_t key_id = i % 2 == 0 ? (i / 2) % kShared : 100 * (w + 1) + (i / 2) % kOwn;
        if (!cache.store(key_of(key_id), writer_payload(w, i, key_id))) status |= 1;
        // Read while the others write: always some writer's whole payload, never a torn one.
        std::optional<Bytes> seen = cache.load(key_of(key_id));
        if (!seen || !is_stored_payload(*seen, key_id, kWriters, kStores)) status |= 2;
      }
      ::_exit(status);
    }
    children.push_back(child);
  }
  ::close(gate[0]);
  ::close(gate[1]);  // go
  for (pid_t child : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "1: a store() failed, 2: a load() did not return a "
                                         "whole stored payload, 3: both";
  }

  DiskPlanCache reader(tmp.path(), h100());
  std::vector<uint32_t> key_ids;
  for (uint32_t k = 0; k < kShared; ++k) key_ids.push_back(k);
  for (uint32_t w = 0; w < kWriters; ++w) {
    for (uint32_t k = 0; k < kOwn; ++k) key_ids.push_back(100 * (w + 1) + k);
  }
  for (uint32_t key_id : key_ids) {
    std::optional<Bytes> loaded = reader.load(key_of(key_id));
    ASSERT_TRUE(loaded.has_value()) << "key " << key_id;
    ASSERT_GE(loaded->size(), 12u);
    uint32_t writer = field_of(*loaded, 0), iteration = field_of(*loaded, 4);
    EXPECT_EQ(field_of(*loaded, 8), key_id);
    ASSERT_LT(writer, kWriters);
    ASSERT_LT(iteration, kStores);
    if (key_id >= 100) {
      EXPECT_EQ(writer + 1, key_id / 100);
    }
    EXPECT_TRUE(*loaded == writer_payload(writer, iteration, key_id))
        << "key " << key_id << ": not exactly what writer " << writer << " stored";
  }
  std::vector<std::string> names = file_names(reader.dir());
  EXPECT_EQ(names.size(), key_ids.size());
  for (const std::string& name : names) {
    EXPECT_EQ(name.rfind(".tmp-", 0), std::string::npos) << "temporary file left: " << name;
  }
  EXPECT_EQ(reader.stats().hits, key_ids.size());
}

}  // namespace
}  // namespace fusebox::cuda
