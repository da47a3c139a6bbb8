// Evaluation on a held-out set: `fusebox train --eval-data` prints it each epoch.
#pragma once

#include <cstdint>
#include <string>

#include "fusebox/train/data.h"
#include "fusebox/train/session.h"

namespace fusebox {

struct EvalResult {
  double loss = 0;  // mean cross-entropy over the labelled positions (f64)
  double top1 = 0;  // fraction of positions whose label is the first largest logit (argmax)
  double top5 = 0;  // ... among the 5 largest (every class when there are fewer than 5)
  int64_t samples = 0;
  int64_t positions = 0;  // samples x pixels or tokens per sample
};

// Runs the session's eval graph (batch norms with their running statistics; TrainingSession::
// predict) over all of `data` in batches of `batch` samples, the model's own batch: the last
// one is completed with the set's first samples, which are not counted. `input` and `logits`
// name the model's input and its output [B, C, D...]; labels [B, D...] in [0, C) (checked:
// check_dataset). A label ties with another class's logit: the lower class ranks first, as
// argmax. Errors name `where`.
EvalResult evaluate(const TrainingSession& session, const Dataset& data, const std::string& input,
                    const std::string& logits, int64_t batch, const std::string& where);

}  // namespace fusebox
