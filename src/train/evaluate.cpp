// evaluate (fusebox/train/evaluate.h): batches through TrainingSession::predict, then per
// labelled position the log-softmax at the label and its rank among the classes, on the host.
#include "fusebox/train/evaluate.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "fusebox/core/error.h"

namespace fusebox {

namespace {

struct Totals {
  double loss = 0;
  int64_t top1 = 0, top5 = 0, positions = 0;
};

// Adds the first `samples` rows of logits [B, C, D] (f32) against labels [B, D] (i64).
void accumulate(const Tensor& logits, const Tensor& labels, int64_t samples, Totals& t) {
  const Shape& s = logits.shape();
  const int64_t classes = s[1], inner = logits.numel() / (s[0] * classes);
  const float* x = logits.data<float>();
  const int64_t* y = labels.data<int64_t>();
  for (int64_t b = 0; b < samples; ++b) {
    for (int64_t d = 0; d < inner; ++d) {
      const float* row = x + b * classes * inner + d;  // class c at row[c * inner]
      const int64_t label = y[b * inner + d];
      const float v = row[label * inner];
      double m = -INFINITY;
      for (int64_t c = 0; c < classes; ++c) m = std::max(m, double(row[c * inner]));
      double sum = 0;
      int64_t above = 0;  // classes ranked before the label
      for (int64_t c = 0; c < classes; ++c) {
        const float o = row[c * inner];
        sum += std::exp(double(o) - m);
        above += o > v || (o == v && c < label);
      }
      t.loss += -(double(v) - m - std::log(sum));
      t.top1 += above < 1;
      t.top5 += above < 5;
      ++t.positions;
    }
  }
}

}  // namespace

EvalResult evaluate(const TrainingSession& session, const Dataset& data, const std::string& input,
                    const std::string& logits, int64_t batch, const std::string& where) {
  FUSEBOX_CHECK(data.size() > 0, where, "the evaluation set is empty");
  FUSEBOX_CHECK(batch > 0, where, "batch must be positive, got ", batch);
  const std::optional<ValueId> in = session.eval_graph().find_value(input);
  FUSEBOX_CHECK(in.has_value(), where, "the model has no input '", input, "'");
  const DType input_dtype = session.eval_graph().value(*in).type.dtype;
  const BatchSampler batches(data, batch, /*shuffle=*/false, 0);
  const int64_t count = (data.size() + batch - 1) / batch;
  Totals t;
  for (int64_t i = 0; i < count; ++i) {
    auto [x, y] = batches.batch(i);  // the last wraps around to the first samples
    if (x.dtype() != input_dtype) x = x.cast(input_dtype);
    const NamedTensors out = session.predict({{input, x}});
    const auto it = out.find(logits);
    FUSEBOX_CHECK(it != out.end(), where, "the model has no output '", logits, "'");
    const Tensor& l = it->second;
    FUSEBOX_CHECK(l.rank() >= 2 && l.dim(0) == batch, where, "logits ", shape_str(l.shape()),
                  " are not [", batch, ", classes, ...]");
    const Tensor f = l.dtype() == DType::f32 ? l : l.cast(DType::f32);
    const Tensor labels = y.dtype() == DType::i64 ? y : y.cast(DType::i64);
    accumulate(f, labels, std::min(batch, data.size() - i * batch), t);
  }
  const double n = double(t.positions);
  return {t.loss / n, double(t.top1) / n, double(t.top5) / n, data.size(), t.positions};
}

}  // namespace fusebox
