// DistEnv::from_env (fusebox/dist/rendezvous.h): none of the variables is a single process; all
// of them a rank of a run; some, or a value out of range, an Error naming the variable.
#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "fusebox/core/error.h"
#include "fusebox/dist/rendezvous.h"
#include "testing.h"

namespace fusebox::dist {
namespace {

using testing::ScopedEnv;

// Every launcher's variables unset for the test's scope (the machine running the tests may be
// a rank of something itself).
struct NoLaunchers {
  std::vector<std::unique_ptr<ScopedEnv>> unset;
  NoLaunchers() {
    for (const char* name : {"RANK",
                             "WORLD_SIZE",
                             "MASTER_ADDR",
                             "MASTER_PORT",
                             "LOCAL_RANK",
                             "OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK",
                             "SLURM_PROCID",
                             "SLURM_STEP_NUM_TASKS",
                             "SLURM_NTASKS",
                             "SLURM_LOCALID",
                             "SLURM_STEP_NODELIST",
                             "SLURM_JOB_NODELIST",
                             "SLURM_JOB_ID",
                             "SLURM_STEP_ID",
                             "FUSEBOX_RANK",
                             "FUSEBOX_WORLD_SIZE",
                             "FUSEBOX_MASTER_ADDR",
                             "FUSEBOX_MASTER_PORT",
                             "FUSEBOX_LOCAL_RANK",
                             "FUSEBOX_DIST_TIMEOUT"})
      unset.push_back(std::make_unique<ScopedEnv>(name, std::nullopt));
  }
};

struct Vars {
  NoLaunchers none;
  ScopedEnv rank, world, addr, port, local, torchrun_local, timeout;
  Vars(std::optional<std::string> r, std::optional<std::string> w, std::optional<std::string> a,
       std::optional<std::string> p)
      : rank("FUSEBOX_RANK", r),
        world("FUSEBOX_WORLD_SIZE", w),
        addr("FUSEBOX_MASTER_ADDR", a),
        port("FUSEBOX_MASTER_PORT", p),
        local("FUSEBOX_LOCAL_RANK", std::nullopt),
        torchrun_local("LOCAL_RANK", std::nullopt),
        timeout("FUSEBOX_DIST_TIMEOUT", std::nullopt) {}
};

std::string error_of(const Vars&) {
  return testing::error_message([] { DistEnv::from_env(); });
}

TEST(DistEnv, NoVariablesIsASingleProcess) {
  Vars v(std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  EXPECT_FALSE(DistEnv::from_env().has_value());
}

TEST(DistEnv, AllVariablesGiveTheRank) {
  Vars v("3", "4", "node0.cluster", "29500");
  ScopedEnv local("LOCAL_RANK", "1");  // torchrun's, read when ours is unset
  ScopedEnv timeout("FUSEBOX_DIST_TIMEOUT", "42");
  const std::optional<DistEnv> e = DistEnv::from_env();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->master_addr, "node0.cluster");
  EXPECT_EQ(e->master_port, 29500);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->timeout, std::chrono::seconds(42));
  ScopedEnv ours("FUSEBOX_LOCAL_RANK", "2");
  EXPECT_EQ(DistEnv::from_env()->local_rank, 2);
}

TEST(DistEnv, BadValuesAreErrorsNamingTheVariable) {
  {
    Vars v("0", "2", "127.0.0.1", std::nullopt);
    EXPECT_NE(error_of(v).find("FUSEBOX_MASTER_PORT is not set"), std::string::npos) << error_of(v);
  }
  {
    Vars v("2", "2", "127.0.0.1", "29500");
    EXPECT_NE(error_of(v).find("FUSEBOX_RANK=2 is outside [0, 1]"), std::string::npos)
        << error_of(v);
  }
  {
    Vars v("0", "two", "127.0.0.1", "29500");
    EXPECT_NE(error_of(v).find("FUSEBOX_WORLD_SIZE='two' is not an integer"), std::string::npos)
        << error_of(v);
  }
  {
    Vars v("0", "2", "127.0.0.1", "70000");
    EXPECT_NE(error_of(v).find("FUSEBOX_MASTER_PORT=70000 is outside"), std::string::npos)
        << error_of(v);
  }
  {
    Vars v("0", "2", "127.0.0.1", "29500");
    ScopedEnv timeout("FUSEBOX_DIST_TIMEOUT", "0");
    EXPECT_NE(error_of(v).find("FUSEBOX_DIST_TIMEOUT=0 is outside"), std::string::npos)
        << error_of(v);
  }
}

// torchrun's variables: the rank; FUSEBOX_LOCAL_RANK still overrides; the FUSEBOX_* set wins
// where both are set; a world of 1, or RANK alone, is a single process; a rank without the
// master's address an Error.
TEST(DistEnv, TorchrunVariablesGiveTheRank) {
  NoLaunchers none;
  ScopedEnv rank("RANK", "1"), world("WORLD_SIZE", "4"), addr("MASTER_ADDR", "node3"),
      port("MASTER_PORT", "29400"), local("LOCAL_RANK", "1");
  std::optional<DistEnv> e = DistEnv::from_env();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->launcher, "torchrun");
  EXPECT_EQ(e->rank, 1);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->master_addr, "node3");
  EXPECT_EQ(e->master_port, 29400);
  {
    ScopedEnv ours("FUSEBOX_LOCAL_RANK", "0");
    EXPECT_EQ(DistEnv::from_env()->local_rank, 0);
  }
  {
    ScopedEnv r("FUSEBOX_RANK", "0"), w("FUSEBOX_WORLD_SIZE", "2"), a("FUSEBOX_MASTER_ADDR", "x"),
        p("FUSEBOX_MASTER_PORT", "1234");
    EXPECT_EQ(DistEnv::from_env()->launcher, "FUSEBOX_*");
    EXPECT_EQ(DistEnv::from_env()->world_size, 2);
  }
  {
    ScopedEnv one("WORLD_SIZE", "1"), zero("RANK", "0");
    EXPECT_FALSE(DistEnv::from_env().has_value());
  }
  {
    ScopedEnv unset("MASTER_PORT", std::nullopt);
    const std::string m = testing::error_message([] { DistEnv::from_env(); });
    EXPECT_NE(m.find("torchrun started rank 1 of 4, but MASTER_PORT is not set"), std::string::npos)
        << m;
  }
  {
    // RANK alone (another tool's variable) is not torchrun: a single process.
    ScopedEnv unset("WORLD_SIZE", std::nullopt);
    EXPECT_FALSE(DistEnv::from_env().has_value());
  }
}

// mpirun (Open MPI): the rank from OMPI_COMM_WORLD_*, the address from MASTER_ADDR/PORT, which
// an Error asks for (with mpirun's -x) where they are missing.
TEST(DistEnv, OpenMpiVariablesGiveTheRank) {
  NoLaunchers none;
  ScopedEnv rank("OMPI_COMM_WORLD_RANK", "2"), world("OMPI_COMM_WORLD_SIZE", "4"),
      local("OMPI_COMM_WORLD_LOCAL_RANK", "0");
  const std::string m = testing::error_message([] { DistEnv::from_env(); });
  EXPECT_NE(m.find("Open MPI started rank 2 of 4, but MASTER_ADDR is not set"), std::string::npos)
      << m;
  EXPECT_NE(m.find("mpirun -x MASTER_ADDR="), std::string::npos) << m;
  ScopedEnv addr("MASTER_ADDR", "10.0.0.1"), port("MASTER_PORT", "29500");
  const std::optional<DistEnv> e = DistEnv::from_env();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->launcher, "Open MPI");
  EXPECT_EQ(e->rank, 2);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->local_rank, 0);
  EXPECT_EQ(e->master_addr, "10.0.0.1");
}

// srun: the rank from SLURM_PROCID of SLURM_STEP_NUM_TASKS, rank 0's address the step's first
// node and a port from the job and step ids unless MASTER_ADDR/PORT say; a batch script (no
// step task count: its one process must not wait for the job's other tasks) is no rank.
TEST(DistEnv, SlurmVariablesGiveTheRank) {
  NoLaunchers none;
  ScopedEnv rank("SLURM_PROCID", "3"), world("SLURM_STEP_NUM_TASKS", "8"),
      local("SLURM_LOCALID", "3"), nodes("SLURM_STEP_NODELIST", "gpu[07-09,12],cpu1"),
      job("SLURM_JOB_ID", "123456"), step("SLURM_STEP_ID", "2");
  std::optional<DistEnv> e = DistEnv::from_env();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->launcher, "Slurm");
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 8);
  EXPECT_EQ(e->local_rank, 3);
  EXPECT_EQ(e->master_addr, "gpu07");
  EXPECT_EQ(e->master_port, 20000 + (31 * 123456 + 2) % 20000);
  {
    ScopedEnv addr("MASTER_ADDR", "head"), port("MASTER_PORT", "29501");
    EXPECT_EQ(DistEnv::from_env()->master_addr, "head");
    EXPECT_EQ(DistEnv::from_env()->master_port, 29501);
  }
  {
    ScopedEnv batch("SLURM_STEP_NUM_TASKS", std::nullopt), tasks("SLURM_NTASKS", "8");
    EXPECT_FALSE(DistEnv::from_env().has_value());
  }
  {
    ScopedEnv bad("SLURM_PROCID", "8");
    const std::string m = testing::error_message([] { DistEnv::from_env(); });
    EXPECT_NE(m.find("SLURM_PROCID=8 is outside [0, 7]"), std::string::npos) << m;
  }
}

TEST(DistEnv, FirstSlurmHost) {
  EXPECT_EQ(first_slurm_host("gpu[07-09,12],cpu1"), "gpu07");
  EXPECT_EQ(first_slurm_host("node[001-004]"), "node001");
  EXPECT_EQ(first_slurm_host("n[3,5]-ib,m1"), "n3-ib");
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("single"), "single");
}

// Ranks on threads, one store: the same signature passes everywhere; a different model or
// world size stops every rank with the same error naming the ranks and the entry.
std::vector<std::string> run_ranks(const std::vector<std::map<std::string, std::string>>& sigs,
                                   const std::vector<int>& worlds) {
  TcpStore server("127.0.0.1", 0, true, std::chrono::milliseconds(3000));
  std::vector<std::string> errors(sigs.size());
  std::vector<std::thread> ranks;
  for (size_t r = 0; r < sigs.size(); ++r)
    ranks.emplace_back([&, r] {
      TcpStore c("127.0.0.1", server.port(), false, std::chrono::milliseconds(3000));
      errors[r] = testing::error_message([&] { check_same_run(c, int(r), worlds[r], sigs[r]); });
    });
  for (std::thread& t : ranks) t.join();
  return errors;
}

TEST(CheckSameRun, EqualSignaturesPassAndADifferenceStopsEveryRank) {
  const std::map<std::string, std::string> a = {{"model", "resnet50"}, {"batch", "256"}};
  std::map<std::string, std::string> b = a;
  b["model"] = "resnet18";
  for (const std::string& e : run_ranks({a, a, a}, {3, 3, 3})) EXPECT_EQ(e, "<no error>");
  for (const std::string& e : run_ranks({a, a, b}, {3, 3, 3}))
    EXPECT_NE(e.find("rank 2's model is 'resnet18' where rank 0's is 'resnet50'"),
              std::string::npos)
        << e;
  const std::vector<std::string> worlds = run_ranks({a, a}, {2, 3});
  EXPECT_NE(worlds[1].find("rank 1's world size is 3 where rank 0's is 2"), std::string::npos)
      << worlds[1];
}

}  // namespace
}  // namespace fusebox::dist
