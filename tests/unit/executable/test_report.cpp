// Executable::report: what an executable's own recordings decided (its convolutions and the
// plan caches' counters over them), apart from other executables of the process; the
// per-thread scope that routes the kernels' decisions to it; its table. The CUDA test skips
// without a GPU.
#include <gtest/gtest.h>

#include <thread>

#include "backends/cuda/kernels/conv/report.h"
#include "executable_test_util.h"
#include "fusebox/runtime/report.h"

namespace fusebox::testing {
namespace {

ConvDecision decision(const std::string& node, const std::string& problem, double tuned_ms = -1) {
  ConvDecision d;
  d.node = node;
  d.op = "conv_fprop";
  d.problem = problem;
  d.path = "cudnn";
  d.plan = "engine 0";
  d.tuned_ms = tuned_ms;
  return d;
}

TEST(ConvReportScope, DecisionsGoToTheInnermostScopeOfTheirThread) {
  cuda::ConvReportSink outer, inner;
  cuda::record_conv_decision(decision("conv 'none'", "p"));  // no scope: the process only
  {
    const cuda::ConvReportScope outer_scope(outer);
    cuda::record_conv_decision(decision("conv 'a'", "p", 0.5));
    {
      const cuda::ConvReportScope inner_scope(inner);
      cuda::record_conv_decision(decision("conv 'b'", "p"));
    }
    cuda::record_conv_decision(decision("conv 'a'", "p"));  // the same row: one more call
    std::thread([] { cuda::record_conv_decision(decision("conv 'thread'", "p")); }).join();
  }
  cuda::record_conv_decision(decision("conv 'after'", "p"));
  ASSERT_EQ(outer.report().convolutions.size(), 1u);
  const ConvDecision& a = outer.report().convolutions[0];
  EXPECT_EQ(a.node, "conv 'a'");
  EXPECT_EQ(a.calls, 2u);
  EXPECT_EQ(a.tuned_ms, 0.5);  // kept from the tuned decision
  ASSERT_EQ(inner.report().convolutions.size(), 1u);
  EXPECT_EQ(inner.report().convolutions[0].node, "conv 'b'");
  EXPECT_EQ(inner.report().convolutions[0].calls, 1u);
  // The process's record has them all.
  size_t seen = 0;
  for (const ConvDecision& d : cuda::conv_decisions())
    for (const char* node :
         {"conv 'none'", "conv 'a'", "conv 'b'", "conv 'thread'", "conv 'after'"})
      seen += d.node == node;
  EXPECT_GE(seen, 5u);
}

TEST(ConvReport, TheTableListsEachRowAndSumsUp) {
  EXPECT_EQ(format_conv_report({}), "");
  ExecutableReport r;
  r.convolutions = {decision("conv 'a'", "problem a"), decision("conv 'b'", "problem b")};
  r.convolutions[1].path = "own";
  r.convolutions[1].plan = "";
  r.convolutions[1].reason = "why not cuDNN";
  r.plan_cache.memory_hits = 3;
  r.plan_cache.disk_writes = 2;
  const std::string table = format_conv_report(r);
  EXPECT_EQ(table.rfind("convolutions (path, plan, why):\n", 0), 0u) << table;
  for (const char* want : {"conv 'a'", "problem a", "engine 0", "problem b  [why not cuDNN]",
                           "2 convolution rows: 1 on cuDNN, 1 on the direct kernel; plan cache: 3 "
                           "memory hits, 0 heuristics queries, 0 autotuned, 0 disk hits, 2 disk "
                           "writes\n"})
    EXPECT_NE(table.find(want), std::string::npos) << want << " in\n" << table;
}

TEST(CpuExecutable, ReportsNothing) {
  auto exe = Executable::compile(chain_graph(2, 16), {.device = Device::cpu});
  exe->run(chain_feeds(16, 1));
  EXPECT_TRUE(exe->report().convolutions.empty());
  EXPECT_EQ(exe->report().plan_cache.problems + exe->report().plan_cache.memory_hits, 0u);
}

// x [1, 8, 6, 6] through `count` 3x3 convolutions named `prefix`0, `prefix`1, ...
Graph conv_chain(const std::string& prefix, int count) {
  Graph g("convs");
  Builder b(g);
  ValueId x = g.add_input("x", DType::f32, {1, 8, 6, 6});
  const ValueId w = g.add_input("w", DType::f32, {8, 8, 3, 3});
  for (int i = 0; i < count; ++i)
    x = b.name(prefix + std::to_string(i))
            .conv(x, w, kNoValue, ConvAttrs{.pads_begin = {1, 1}, .pads_end = {1, 1}});
  g.rename_value(x, "y");
  g.mark_output(x);
  return g;
}

TEST(CudaExecutable, ReportHoldsItsOwnRecordings) {
  FUSEBOX_RUNTIME_REQUIRE_GPU();
  const ConvPlanStats before = cuda::conv_plan_stats();
  auto a = Executable::compile(conv_chain("a", 2), {.device = Device::cuda});
  const ConvPlanStats after = cuda::conv_plan_stats();
  auto b = Executable::compile(conv_chain("b", 1), {.device = Device::cuda});
  const NamedTensors feeds = {{"x", random_tensor(DType::f32, {1, 8, 6, 6}, 1)},
                              {"w", random_tensor(DType::f32, {8, 8, 3, 3}, 2)}};
  a->run(feeds);
  b->run(feeds);
  const auto nodes = [](const Executable& e) {
    std::vector<std::string> out;
    for (const ConvDecision& d : e.report().convolutions) out.push_back(d.node);
    return out;
  };
  EXPECT_EQ(nodes(*a), (std::vector<std::string>{"conv 'a0'", "conv 'a1'"}));
  EXPECT_EQ(nodes(*b), (std::vector<std::string>{"conv 'b0'"}));
  // The counters of a's compile, and only them (this thread alone plans convolutions).
  EXPECT_EQ(a->report().plan_cache.problems, after.problems - before.problems);
  EXPECT_EQ(a->report().plan_cache.memory_hits, after.memory_hits - before.memory_hits);
  EXPECT_EQ(a->report().plan_cache.heuristics_queries,
            after.heuristics_queries - before.heuristics_queries);
  const std::string table = format_conv_report(a->report());
  EXPECT_NE(table.find("conv 'a1'"), std::string::npos) << table;
  EXPECT_EQ(table.find("conv 'b0'"), std::string::npos) << table;
  // A profile records each node again, `repeats` times: its calls join a's rows alone.
  const uint64_t a_calls = a->report().convolutions[0].calls;
  const uint64_t b_calls = b->report().convolutions[0].calls;
  a->profile(3);
  EXPECT_EQ(a->report().convolutions[0].calls, a_calls + 3);
  EXPECT_EQ(b->report().convolutions[0].calls, b_calls);
}

}  // namespace
}  // namespace fusebox::testing
