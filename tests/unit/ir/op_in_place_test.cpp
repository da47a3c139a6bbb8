// OpInfo::in_place: exactly the ops and (output, input) pairs whose kernels may write an
// output into an input's bytes; the CUDA executable computes aliased state in place by it.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fusebox/ir/op_info.h"

namespace fusebox {
namespace {

// (output, input role) pairs, by op: the rule set the executables rely on.
const std::map<OpKind, std::vector<std::pair<size_t, std::string>>>& expected_in_place() {
  static const std::map<OpKind, std::vector<std::pair<size_t, std::string>>> pairs = {
      {OpKind::sgd_update, {{0, "param"}, {1, "momentum_buf"}, {2, "low_param"}}},
      {OpKind::adamw_update, {{0, "param"}, {1, "m"}, {2, "v"}, {3, "low_param"}}},
      {OpKind::batch_norm, {{1, "mean"}, {2, "var"}}},
      {OpKind::loss_scale_update, {{0, "scale"}, {1, "growth_tracker"}, {2, "skipped"}}},
  };
  return pairs;
}

TEST(OpInPlace, TheTableHoldsExactlyTheInPlaceOps) {
  constexpr size_t kOutputs = 8;  // more than any op has
  for (const OpInfo& info : kOpTable) {
    SCOPED_TRACE(info.name);
    std::map<size_t, std::string> want;
    if (auto it = expected_in_place().find(info.op); it != expected_in_place().end())
      want.insert(it->second.begin(), it->second.end());
    for (size_t output = 0; output < kOutputs; ++output) {
      const int input = in_place_input(info, output);
      if (!want.count(output)) {
        EXPECT_EQ(input, -1) << "output " << output;
        continue;
      }
      ASSERT_GE(input, 0) << "output " << output;
      ASSERT_LT(size_t(input), info.roles.size());
      EXPECT_EQ(info.roles[size_t(input)], want[output]) << "output " << output;
    }
  }
}

TEST(OpInPlace, OutputsPastTheRowHaveNone) {
  EXPECT_EQ(in_place_input(op_info(OpKind::sgd_update), 3), -1);
  EXPECT_EQ(in_place_input(op_info(OpKind::batch_norm), 0), -1);  // y is not the input x
  EXPECT_EQ(in_place_input(op_info(OpKind::relu), 0), -1);
}

}  // namespace
}  // namespace fusebox
