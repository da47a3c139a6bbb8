// Synchronized batch norm for data-parallel training (session.h DataParallel::sync_batch_norm).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "fusebox/ir/graph.h"

namespace fusebox::train {

// Rewrites every training batch_norm of `g` (not yet fused with a relu or a residual) into
// ops whose statistics are all-reduced across the data-parallel world (all_reduce nodes), so
// that each rank normalises with the whole step's batch statistics. Returns, for each, the
// pair (running statistic input, the value holding its next value) by name, for the step's
// state updates. Values keep their names (y takes the batch_norm's).
std::vector<std::pair<std::string, std::string>> synchronize_batch_norms(Graph& g);

}  // namespace fusebox::train
