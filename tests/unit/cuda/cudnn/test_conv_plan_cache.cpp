// The convolution plan caches on the GPU: an in-memory hit skips the heuristics, a tiny
// capacity evicts (the evicted plan comes back from disk), a second PROCESS (this binary run
// again with a filter) reuses the disk cache with no heuristics query, corrupt or unusable
// cache files are rebuilt with a warning and correct results, two processes writing the
// same cache at once leave it usable, autotuning is stored and reused, and the decision
// record (fusebox run --report) names path and plan.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cudnn.h>

#include <fstream>

#include "backends/cuda/cudnn/conv.h"
#include "backends/cuda/kernels/conv/selection.h"
#include "backends/cuda/runtime/plan_cache.h"
#include "conv_test_util.h"

extern char** environ;

namespace fusebox::cuda::testing {
namespace {

constexpr const char* kChildResultVar = "FUSEBOX_TEST_CONV_CHILD_RESULT";

ConvConfig config(OpKind op, DType dtype, Shape spatial, Shape filter, int64_t c, int64_t k,
                  bool bias, bool channels_last) {
  ConvConfig cfg;
  cfg.op = op;
  cfg.dtype = dtype;
  cfg.batch = 2, cfg.in_channels = c, cfg.out_channels = k;
  cfg.spatial = std::move(spatial);
  cfg.filter = std::move(filter);
  const size_t rank = cfg.spatial.size();
  cfg.strides.assign(rank, 1);
  cfg.dilations.assign(rank, 1);
  cfg.pads_begin.assign(rank, 1);
  cfg.pads_end.assign(rank, 1);
  cfg.bias = bias;
  cfg.channels_last = channels_last;
  return cfg;
}

// The problems the cache tests run: all three ops, three dtypes, 1-D to 3-D.
std::vector<ConvConfig> problem_set() {
  return {
      config(OpKind::conv, DType::bf16, {12, 12}, {3, 3}, 16, 32, true, true),
      config(OpKind::conv_backward_data, DType::f16, {10, 10}, {3, 3}, 8, 16, true, true),
      config(OpKind::conv_backward_filter, DType::f32, {9, 9}, {3, 3}, 8, 8, false, false),
      config(OpKind::conv, DType::f32, {30}, {3}, 4, 8, false, false),
      config(OpKind::conv, DType::f16, {4, 6, 6}, {3, 3, 3}, 8, 8, false, true),
  };
}

// Runs every problem of the set and checks it against the CPU (failures are test failures).
void run_problem_set(OpHarness& h) {
  uint64_t seed = 500;
  for (const ConvConfig& c : problem_set()) {
    SCOPED_TRACE(c.describe());
    const std::vector<Tensor> in = conv_inputs(c, seed += 10);
    const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
    EXPECT_LE(relative_l2_error(run_conv_on_gpu(h, c, in), want), conv_l2_tolerance(c.dtype, true));
  }
}

void run_one(OpHarness& h, const ConvConfig& c, uint64_t seed = 1) {
  const std::vector<Tensor> in = conv_inputs(c, seed);
  const Tensor want = run_op(c.op, c.node_attrs(), in)[0];
  EXPECT_LE(relative_l2_error(run_conv_on_gpu(h, c, in), want), conv_l2_tolerance(c.dtype, true))
      << c.describe();
}

// Runs this test binary again with only `filter`, with `env` added, and waits for it.
// Returns its exit status (-1 when it did not exit normally).
int run_child(const std::string& filter, const std::vector<std::string>& env) {
  std::vector<std::string> strings(env);
  for (char** e = environ; *e != nullptr; ++e) strings.emplace_back(*e);  // later ones lose
  std::vector<char*> envp;
  for (std::string& s : strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string filter_arg = "--gtest_filter=" + filter;
  char* argv[] = {exe.data(), filter_arg.data(), nullptr};
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    execve(exe.c_str(), argv, envp.data());
    _exit(127);
  }
  if (pid < 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Starts children like run_child, all at once, and waits for all; their exit statuses.
std::vector<int> run_children_at_once(const std::string& filter,
                                      const std::vector<std::vector<std::string>>& envs) {
  std::vector<pid_t> pids;
  std::vector<std::vector<std::string>> keep;  // strings alive until fork
  for (const std::vector<std::string>& env : envs) {
    std::vector<std::string> strings(env);
    for (char** e = environ; *e != nullptr; ++e) strings.emplace_back(*e);
    std::vector<char*> envp;
    for (std::string& s : strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
    std::string filter_arg = "--gtest_filter=" + filter;
    char* argv[] = {exe.data(), filter_arg.data(), nullptr};
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      execve(exe.c_str(), argv, envp.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<int> statuses;
  for (pid_t pid : pids) {
    int status = 0;
    const bool waited = pid > 0 && waitpid(pid, &status, 0) == pid;
    statuses.push_back(waited && WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  return statuses;
}

// "key=value" lines of a child's result file.
std::map<std::string, uint64_t> read_result(const std::filesystem::path& path) {
  std::map<std::string, uint64_t> values;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) values[line.substr(0, eq)] = std::stoull(line.substr(eq + 1));
  }
  return values;
}

class ConvPlanCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FUSEBOX_REQUIRE_GPU();
    clear_conv_plan_memory_cache();
    reset_conv_plan_stats();
    clear_conv_decisions();  // process-wide: earlier tests in this binary leave theirs
  }
};

TEST_F(ConvPlanCacheTest, InMemoryHitSkipsHeuristics) {
  OpHarness h;
  TempDir dir("conv_mem");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", dir.str()), backend("FUSEBOX_CONV_BACKEND", "cudnn"),
      autotune("FUSEBOX_AUTOTUNE", "0");
  const ConvConfig c = problem_set()[0];
  run_one(h, c, 1);
  const ConvPlanStats first = conv_plan_stats();
  EXPECT_GE(first.heuristics_queries, 1u);  // 2 when the fused-bias graph has no plan
  EXPECT_EQ(first.disk_writes, 1u);
  run_one(h, c, 2);  // new tensors, same problem
  const ConvPlanStats second = conv_plan_stats();
  EXPECT_EQ(second.heuristics_queries, first.heuristics_queries)
      << "the second run queried the heuristics again";
  EXPECT_EQ(second.memory_hits, first.memory_hits + 1);
  // The decision record has the node on cuDNN with a named plan, and the report shows it.
  bool found = false;
  for (const ConvDecision& d : conv_decisions()) {  // only this test's rows (SetUp clears)
    if (d.node == "conv 'node'" && d.problem.find("bf16") != std::string::npos) {
      found = true;
      EXPECT_EQ(d.path.rfind("cudnn", 0), 0u) << d.path;
      EXPECT_FALSE(d.plan.empty());
      EXPECT_GE(d.calls, 2u);
    }
  }
  EXPECT_TRUE(found);
  EXPECT_NE(format_conv_report().find("conv 'node'"), std::string::npos);
}

TEST_F(ConvPlanCacheTest, TinyCapacityEvictsAndDiskServesTheEvicted) {
  OpHarness h;
  TempDir dir("conv_evict");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", dir.str()), capacity("FUSEBOX_CONV_PLAN_CACHE", "2"),
      autotune("FUSEBOX_AUTOTUNE", "0");
  const std::vector<ConvConfig> set = problem_set();
  run_one(h, set[0]);
  run_one(h, set[1]);
  run_one(h, set[2]);  // evicts set[0]
  const ConvPlanStats before = conv_plan_stats();
  EXPECT_EQ(before.problems, 3u);
  run_one(h, set[2]);  // most recent: a memory hit
  EXPECT_EQ(conv_plan_stats().memory_hits, before.memory_hits + 1);
  run_one(h, set[0]);  // evicted: from disk, no heuristics
  const ConvPlanStats after = conv_plan_stats();
  EXPECT_EQ(after.memory_hits, before.memory_hits + 1);
  EXPECT_EQ(after.disk_hits, before.disk_hits + 1);
  EXPECT_EQ(after.heuristics_queries, before.heuristics_queries);
}

// The second process: skipped unless started by DiskRoundTripInSecondProcess.
TEST(ConvPlanCacheChild, RunsProblemSetFromDisk) {
  const char* result = std::getenv(kChildResultVar);
  if (result == nullptr) GTEST_SKIP() << "runs only as the child of a plan-cache test";
  FUSEBOX_REQUIRE_GPU();
  OpHarness h;
  run_problem_set(h);
  const ConvPlanStats s = conv_plan_stats();
  std::ofstream out(result);
  out << "ok=" << (::testing::Test::HasFailure() ? 0 : 1) << "\n"
      << "heuristics=" << s.heuristics_queries << "\n"
      << "disk_hits=" << s.disk_hits << "\n"
      << "disk_writes=" << s.disk_writes << "\n"
      << "autotune=" << s.autotune_runs << "\n"
      << "problems=" << s.problems << "\n";
  std::printf("[child %d] heuristics queries %llu, disk hits %llu, disk writes %llu\n", getpid(),
              (unsigned long long)s.heuristics_queries, (unsigned long long)s.disk_hits,
              (unsigned long long)s.disk_writes);
}

TEST_F(ConvPlanCacheTest, DiskRoundTripInSecondProcess) {
  OpHarness h;
  TempDir dir("conv_disk");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", dir.str()), autotune("FUSEBOX_AUTOTUNE", "0");
  run_problem_set(h);
  const size_t problems = problem_set().size();
  EXPECT_EQ(conv_plan_stats().disk_writes, problems);
  const std::filesystem::path result = dir.path() / "child.txt";
  ASSERT_EQ(run_child("ConvPlanCacheChild.*", {cat(kChildResultVar, "=", result.string())}), 0);
  const auto child = read_result(result);
  ASSERT_EQ(child.count("ok"), 1u) << "the child wrote no result";
  EXPECT_EQ(child.at("ok"), 1u) << "the child's results were wrong";
  EXPECT_EQ(child.at("heuristics"), 0u) << "the child queried the heuristics";
  EXPECT_EQ(child.at("disk_hits"), problems);
  EXPECT_EQ(child.at("disk_writes"), 0u);
}

TEST_F(ConvPlanCacheTest, ConcurrentWritersLeaveAUsableCache) {
  TempDir dir("conv_concurrent");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", dir.str()), autotune("FUSEBOX_AUTOTUNE", "0");
  const std::filesystem::path a = dir.path() / "a.txt", b = dir.path() / "b.txt";
  const std::vector<int> statuses = run_children_at_once(
      "ConvPlanCacheChild.*",
      {{cat(kChildResultVar, "=", a.string())}, {cat(kChildResultVar, "=", b.string())}});
  ASSERT_EQ(statuses, (std::vector<int>{0, 0}));
  EXPECT_EQ(read_result(a).at("ok"), 1u);
  EXPECT_EQ(read_result(b).at("ok"), 1u);
  // Whatever the interleaving, every file is whole: this process reads them all.
  OpHarness h;
  ::testing::internal::CaptureStderr();
  run_problem_set(h);
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  const ConvPlanStats s = conv_plan_stats();
  EXPECT_EQ(s.heuristics_queries, 0u) << warnings;
  EXPECT_EQ(s.disk_hits, problem_set().size()) << warnings;
  EXPECT_EQ(s.disk_rejects, 0u) << warnings;
}

TEST_F(ConvPlanCacheTest, CorruptFileIsRebuiltWithAWarning) {
  OpHarness h;
  TempDir dir("conv_corrupt");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", dir.str()), autotune("FUSEBOX_AUTOTUNE", "0");
  run_problem_set(h);
  const size_t problems = problem_set().size();
  const uint64_t queries = conv_plan_stats().heuristics_queries;
  // Flip a byte in the middle of every file, and truncate one of them.
  size_t files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path() / "conv")) {
    if (!entry.is_regular_file()) continue;
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    const auto size = std::filesystem::file_size(entry.path());
    f.seekg(std::streamoff(size / 2));
    char byte = 0;
    f.read(&byte, 1);
    f.seekp(std::streamoff(size / 2));
    byte = char(~byte);
    f.write(&byte, 1);
    f.close();
    if (files++ == 0) std::filesystem::resize_file(entry.path(), size / 3);
  }
  EXPECT_EQ(files, problems);
  clear_conv_plan_memory_cache();
  reset_conv_plan_stats();
  ::testing::internal::CaptureStderr();
  run_problem_set(h);  // results checked against the CPU
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(warnings.empty()) << "no warning about the corrupt files";
  const ConvPlanStats s = conv_plan_stats();
  EXPECT_EQ(s.disk_hits, 0u);
  EXPECT_EQ(s.heuristics_queries, queries) << "every plan rebuilt";
  EXPECT_EQ(s.disk_writes, problems) << "every file rewritten";
  // Rewritten files are good again.
  clear_conv_plan_memory_cache();
  reset_conv_plan_stats();
  run_problem_set(h);
  EXPECT_EQ(conv_plan_stats().disk_hits, problems);
}

TEST_F(ConvPlanCacheTest, UnusablePayloadIsRebuiltWithAWarning) {
  // A well-formed cache file whose payload is not a plan (as a blob from another cuDNN
  // build could be): written with the cache's own writer under the problem's real key.
  OpHarness h;
  TempDir dir("conv_payload");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", dir.str()), autotune("FUSEBOX_AUTOTUNE", "0");
  const ConvConfig c = problem_set()[2];  // wgrad f32, NCHW
  const std::vector<Tensor> in = conv_inputs(c, 3);
  const BuiltNode built = build_node(c.op, c.node_attrs(), in);
  // Shapes and 256-byte-aligned addresses, as the allocator's blocks are.
  DeviceTensor x, dy, dw;
  x.dtype = dy.dtype = dw.dtype = c.dtype;
  x.shape = c.x_shape(), dy.shape = c.y_shape(), dw.shape = c.w_shape();
  x.strides = contiguous_strides(x.shape), dy.strides = contiguous_strides(dy.shape);
  dw.strides = contiguous_strides(dw.shape);
  const ConvProblem p = make_conv_problem(built.node, {&x, &dy}, dw, conv_settings(), 0);
  const DeviceProperties& props = Device::get(0).properties();
  DiskPlanCache disk(dir.path() / "conv", {props.name, props.compute_capability(),
                                           int64_t(cudnnGetVersion()), cudnn_frontend_version()});
  const std::string garbage = "fusebox-conv-plan 1\nplan\neng0\n0\n-1\n\nnot a serialized graph";
  ASSERT_TRUE(disk.store(
      conv_problem_key(p),
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(garbage.data()), garbage.size())));
  ::testing::internal::CaptureStderr();
  run_one(h, c, 3);
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warnings.find("unusable"), std::string::npos) << warnings;
  const ConvPlanStats s = conv_plan_stats();
  EXPECT_EQ(s.disk_rejects, 1u);
  EXPECT_EQ(s.heuristics_queries, 1u);
  EXPECT_EQ(s.disk_writes, 1u);
}

TEST_F(ConvPlanCacheTest, AutotuneIsStoredAndReused) {
  OpHarness h;
  TempDir dir("conv_tune");
  // cuDNN's own autotuning (with the backend unset, our kernel is timed too: the next test).
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", dir.str()), autotune("FUSEBOX_AUTOTUNE", "1"),
      backend("FUSEBOX_CONV_BACKEND", "cudnn");
  const ConvConfig c = problem_set()[0];
  ::testing::internal::CaptureStderr();
  run_one(h, c, 1);
  const std::string progress = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(progress.find("autotuned"), std::string::npos) << progress;
  EXPECT_EQ(conv_plan_stats().autotune_runs, 1u);
  double tuned = -1;
  for (const ConvDecision& d : conv_decisions())
    if (d.problem.find("bf16") != std::string::npos && d.tuned_ms > 0) tuned = d.tuned_ms;
  EXPECT_GT(tuned, 0) << "no tuned time in the decision record";
  clear_conv_plan_memory_cache();
  run_one(h, c, 2);
  const ConvPlanStats s = conv_plan_stats();
  EXPECT_EQ(s.autotune_runs, 1u) << "the stored tuned plan was tuned again";
  EXPECT_EQ(s.disk_hits, 1u);
}

// Autotuning with the backend unset times our engines beside cuDNN's, runs the faster
// and stores the decision (kernels/conv/selection.h): a second process-like run (memory
// caches cleared) reads it back without timing either side; a corrupt decision file is timed
// again with a warning. Results match the CPU whichever side wins.
TEST_F(ConvPlanCacheTest, AutotuneSelectsBetweenCudnnAndOwnAndStoresIt) {
  OpHarness h;
  TempDir dir("conv_select");
  ScopedEnv cache_dir("FUSEBOX_CACHE_DIR", dir.str()), autotune("FUSEBOX_AUTOTUNE", "1"),
      backend("FUSEBOX_CONV_BACKEND", std::nullopt);
  clear_conv_selections();
  const ConvConfig c = problem_set()[0];  // bf16 3x3: the implicit GEMM takes it
  auto selection_row = [] {
    for (const ConvDecision& d : conv_decisions())
      if (d.reason.find("autotuned: ") != std::string::npos) return d;
    return ConvDecision{};
  };
  ::testing::internal::CaptureStderr();
  run_one(h, c, 1);
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("autotuned: "), std::string::npos) << log;
  ConvDecision d = selection_row();
  ASSERT_FALSE(d.reason.empty()) << "no decision names the selection";
  // Ours: the engine that won, "(autotuned)" (conv.cpp path_of).
  const bool own = d.path.rfind("cudnn", 0) != 0 && d.path.find("(autotuned") != std::string::npos;
  EXPECT_TRUE(own || d.path.rfind("cudnn", 0) == 0) << d.path;
  EXPECT_GT(d.tuned_ms, 0);
  std::printf("[selection] %s: %s\n", d.path.c_str(), d.reason.c_str());
  // Read back from disk: neither side timed again, the same winner.
  auto run_from_disk = [&](uint64_t seed) {
    clear_conv_selections();
    clear_conv_plan_memory_cache();
    clear_conv_decisions();
    reset_conv_plan_stats();
    ::testing::internal::CaptureStderr();
    run_one(h, c, seed);
    return ::testing::internal::GetCapturedStderr();
  };
  log = run_from_disk(2);
  EXPECT_EQ(log.find("autotuned"), std::string::npos) << log;
  EXPECT_EQ(conv_plan_stats().autotune_runs, 0u);
  EXPECT_EQ(selection_row().path.rfind("cudnn", 0) != 0, own) << selection_row().path;
  // A corrupt decision file: a warning, both timed again, the file rewritten.
  size_t files = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path() / "conv-select"))
    if (e.is_regular_file()) {
      std::ofstream(e.path(), std::ios::binary | std::ios::trunc) << "not a selection";
      ++files;
    }
  EXPECT_EQ(files, 1u);
  log = run_from_disk(3);
  EXPECT_NE(log.find("conv-select"), std::string::npos) << "no warning naming the file: " << log;
  EXPECT_NE(log.find("autotuned: "), std::string::npos) << log;
  EXPECT_EQ(run_from_disk(4).find("autotuned"), std::string::npos) << "the file was not rewritten";
}

}  // namespace
}  // namespace fusebox::cuda::testing
