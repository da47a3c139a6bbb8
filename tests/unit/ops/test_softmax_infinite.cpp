// Softmax, log_softmax and cross_entropy of rows holding infinities, as PyTorch and
// onnxruntime give them: a row with a +inf is NaN throughout (x - max is inf - inf), not
// [nan, 0, ...]; a row of -inf only is NaN throughout too; other rows are unaffected. On the
// CPU, and on CUDA where a GPU is present, along the last axis (CUDA: a warp per row, a
// block per row past 1024 elements) and along another axis (a thread per row).
#include <cmath>
#include <string>
#include <vector>

#include "testing.h"

namespace fusebox::testing {
namespace {

constexpr float kInf = INFINITY;

// softmax / log_softmax of one finite row, in f64.
std::vector<double> softmax_of(const std::vector<float>& row, bool log) {
  double m = -INFINITY, sum = 0;
  for (float v : row) m = std::max(m, double(v));
  for (float v : row) sum += std::exp(double(v) - m);
  std::vector<double> out;
  for (float v : row)
    out.push_back(log ? double(v) - m - std::log(sum) : std::exp(double(v) - m) / sum);
  return out;
}

// Rows [len] of x: the first holds a +inf, the second -inf only, the third +inf and -inf,
// the fourth is finite; `len` >= 3.
Tensor rows_with_infinities(int64_t len) {
  std::vector<float> values;
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t j = 0; j < len; ++j) {
      const float finite = 0.25f * float(j % 7) - 0.5f;
      switch (r) {
        case 0:
          values.push_back(j == 1 ? kInf : finite);
          break;
        case 1:
          values.push_back(-kInf);
          break;
        case 2:
          values.push_back(j == 0 ? kInf : j == 2 ? -kInf : finite);
          break;
        default:
          values.push_back(finite);
          break;
      }
    }
  }
  return Tensor::from_vector<float>({4, len}, values);
}

// Runs a one-node graph on `device`.
Tensor run_on(Device device, OpKind op, Attrs attrs, const std::vector<Tensor>& inputs,
              size_t output = 0) {
  Graph g("softmax_infinite");
  std::vector<ValueId> ids;
  NamedTensors feeds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string name = cat("in", i);
    ids.push_back(g.add_input(name, inputs[i].dtype(), inputs[i].shape()));
    feeds[name] = inputs[i];
  }
  const std::vector<ValueId> outs = g.add_node(op, std::move(attrs), ids, "node");
  for (ValueId v : outs) g.mark_output(v);
  return run_graph(g, feeds, {.device = device}).at(g.value(outs[output]).name);
}

std::vector<Device> devices() {
  std::vector<Device> d{Device::cpu};
  if (cuda_available()) d.push_back(Device::cuda);
  return d;
}

void expect_rows(const Tensor& y, int64_t len, bool log) {
  const std::vector<double> got = y.to_doubles();
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t j = 0; j < len; ++j)
      EXPECT_TRUE(std::isnan(got[size_t(r * len + j)])) << "row " << r << " element " << j;
  }
  const Tensor x = rows_with_infinities(len);
  const std::vector<float> finite(x.data<float>() + 3 * len, x.data<float>() + 4 * len);
  const std::vector<double> want = softmax_of(finite, log);
  for (int64_t j = 0; j < len; ++j)
    EXPECT_NEAR(got[size_t(3 * len + j)], want[size_t(j)], 1e-5) << "finite row, element " << j;
}

TEST(SoftmaxInfinite, RowWithPlusInfIsNanAlongTheLastAxis) {
  for (Device device : devices()) {
    for (int64_t len : {5, 1500}) {  // CUDA: a warp per row, a block per row
      for (OpKind op : {OpKind::softmax, OpKind::log_softmax}) {
        SCOPED_TRACE(cat(device_name(device), " ", op_name(op), " len ", len));
        expect_rows(run_on(device, op, SoftmaxAttrs{-1}, {rows_with_infinities(len)}), len,
                    op == OpKind::log_softmax);
      }
    }
  }
}

TEST(SoftmaxInfinite, RowWithPlusInfIsNanAlongAnotherAxis) {
  const int64_t len = 6;
  const Tensor x = rows_with_infinities(len);
  const Tensor xt = run_on(Device::cpu, OpKind::transpose, TransposeAttrs{{1, 0}}, {x});
  for (Device device : devices()) {
    for (OpKind op : {OpKind::softmax, OpKind::log_softmax}) {
      SCOPED_TRACE(cat(device_name(device), " ", op_name(op)));
      const Tensor yt = run_on(device, op, SoftmaxAttrs{0}, {xt});
      expect_rows(run_on(Device::cpu, OpKind::transpose, TransposeAttrs{{1, 0}}, {yt}), len,
                  op == OpKind::log_softmax);
    }
  }
}

// cross_entropy over the same rows: the rows with an infinity give NaN log-probabilities, so
// the mean loss is NaN, as torch.nn.functional.cross_entropy's.
TEST(SoftmaxInfinite, CrossEntropyOfARowWithPlusInfIsNan) {
  const Tensor logits = rows_with_infinities(5);
  const Tensor labels = Tensor::from_vector<int64_t>({4}, {0, 1, 3, 4});
  for (Device device : devices()) {
    SCOPED_TRACE(device_name(device));
    const Tensor loss =
        run_on(device, OpKind::cross_entropy, CrossEntropyAttrs{}, {logits, labels});
    EXPECT_TRUE(std::isnan(loss.get(0)));
    const Tensor log_prob =
        run_on(device, OpKind::cross_entropy, CrossEntropyAttrs{}, {logits, labels}, 1);
    expect_rows(log_prob, 5, true);
  }
}

}  // namespace
}  // namespace fusebox::testing
