// DistEnv::from_env (fusebox/dist/rendezvous.h): none of the variables is a single process; all
// of them a rank of a run; some, or a value out of range, an Error naming the variable.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "fusebox/core/error.h"
#include "fusebox/dist/rendezvous.h"
#include "testing.h"

namespace fusebox::dist {
namespace {

using testing::ScopedEnv;

struct Vars {
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
