// DistEnv::from_env (fusebox/dist/rendezvous.h): none of the variables is a single process; all
// of them a rank of a run; some, or a value out of range, an Error naming the variable.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace fusebox::dist
