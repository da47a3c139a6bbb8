// Shared by src/ir/infer_*.cpp: the per-node inference context and one inference
// function per op family. infer.cpp checks the generic parts of a node (input
// count, required inputs, the attribute alternative, non-negative extents) before
// calling a family function, so those functions may read present inputs and
// std::get their attribute struct directly.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fusebox/ir/graph.h"

// Fails context `ctx`'s node with the message the parts make when `cond` is false. A macro so
// that the parts (shape_str, a role's name, cat) are evaluated only then: inference runs for
// every node each graph rebuild adds, and formatting them for checks that pass took half of it.
#define FUSEBOX_INFER_CHECK(ctx, cond, ...)               \
  do {                                                    \
    if (!(cond)) (ctx).fail(::fusebox::cat(__VA_ARGS__)); \
  } while (0)

namespace fusebox::infer {

// One node's inference: the node (whose attributes are normalised in place), its
// input types, and checks that throw an Error naming the node, the input's
// position and role ("input 1 (w)") and the shapes involved.
class Context {
 public:
  Context(Node& node, std::span<const std::optional<TensorType>> inputs)
      : node_(node), inputs_(inputs) {}

  Node& node() { return node_; }
  OpKind op() const { return node_.op; }
  const char* op_name() const { return fusebox::op_name(node_.op); }
  template <class A>
  A& attrs() {
    return std::get<A>(node_.attrs);
  }

  int count() const { return int(inputs_.size()); }
  bool has(int i) const { return i < count() && inputs_[size_t(i)].has_value(); }
  const TensorType& type(int i) const;  // i must be present
  const Shape& shape(int i) const { return type(i).shape; }
  DType dtype(int i) const { return type(i).dtype; }
  int64_t rank(int i) const { return int64_t(shape(i).size()); }

  const char* role(int i) const;    // "w"; "" for ops whose inputs have no role (concat)
  std::string input(int i) const;   // "input 1 (w)"
  std::string shaped(int i) const;  // "w [8, 4, 3, 3]" (or "input 2 [8, 4]")

  [[noreturn]] void fail(const std::string& message) const;

  // Dtype classes: floating point; numeric (floating or integer, not bool).
  void expect_float(int i) const;
  void expect_numeric(int i) const;
  void expect_same_dtype(int i, int reference) const;
  // `layout` describes the expected shape in the message, e.g. "[N, C, D...]".
  void expect_rank(int i, int64_t rank, const char* layout) const;
  void expect_rank_between(int i, int64_t lo, int64_t hi, const char* layout) const;
  void expect_shape(int i, const Shape& expected, const std::string& why) const;

  // Normalises `axis` against `rank`; `what` names it in the message ("axis", "perm[2]").
  int64_t axis(int64_t axis, int64_t rank, const std::string& what) const;
  // Normalises each axis and rejects duplicates (order kept).
  std::vector<int64_t> axes(const std::vector<int64_t>& axes, int64_t rank,
                            const std::string& what) const;

  // Overflow-checked arithmetic on extents and attribute values.
  int64_t add(int64_t a, int64_t b) const;
  int64_t mul(int64_t a, int64_t b) const;
  int64_t product(const Shape& s, size_t begin, size_t end) const;

 private:
  Node& node_;
  std::span<const std::optional<TensorType>> inputs_;
};

// A fused epilogue activation (ir/ops.h FusedActivation; `what` names the attribute):
// clip bounds only on clip, and min <= max there.
void expect_activation(const Context& c, const FusedActivation& a, const char* what);

// batch_norm's and batch_norm_backward's per-channel inputs [first, last] (scale, bias,
// statistics) share one dtype: x's, or f32 when x is f16 or bf16 (mixed precision: PyTorch
// autocast and cuDNN keep the weights and running statistics f32 for low-precision
// activations). Returns that dtype; the errors name both inputs and their dtypes.
DType expect_channel_params(const Context& c, int x, int first, int last);

using Types = std::vector<TensorType>;

// infer_conv.cpp
Types infer_conv(Context& c);
Types infer_conv_backward_data(Context& c);
Types infer_conv_backward_filter(Context& c);
Types infer_pool(Context& c);  // max_pool, avg_pool
Types infer_global_avg_pool(Context& c);

// infer_math.cpp
Types infer_unary(Context& c);
Types infer_binary(Context& c);
Types infer_logic(Context& c);  // FUSEBOX_LOGIC_OPS
Types infer_where(Context& c);
Types infer_matmul(Context& c);
Types infer_gemm(Context& c);
Types infer_reduce(Context& c);
Types infer_arg_reduce(Context& c);
Types infer_cumsum(Context& c);
Types infer_top_k(Context& c);
Types infer_softmax(Context& c);
Types infer_attention(Context& c);
Types infer_attention_backward(Context& c);

// infer_norm.cpp
Types infer_batch_norm(Context& c);
Types infer_batch_norm_apply(Context& c);
Types infer_layer_norm(Context& c);  // layer_norm, rms_norm
Types infer_cross_entropy(Context& c);

// infer_shape_ops.cpp
Types infer_reshape(Context& c);
Types infer_flatten(Context& c);
Types infer_transpose(Context& c);
Types infer_concat(Context& c);
Types infer_slice(Context& c);
Types infer_pad(Context& c);
Types infer_squeeze(Context& c);
Types infer_unsqueeze(Context& c);
Types infer_cast(Context& c);
Types infer_constant(Context& c);
Types infer_identity(Context& c);
Types infer_expand(Context& c);
Types infer_gather(Context& c);
Types infer_gather_elements(Context& c);
Types infer_resize(Context& c);

// infer_backward.cpp: the backward ops, each checked against its forward op; optimizer
// updates.
Types infer_unary_backward(Context& c);
Types infer_binary_backward(Context& c);
Types infer_batch_norm_backward(Context& c);
Types infer_norm_backward(Context& c);     // layer_norm_backward, rms_norm_backward
Types infer_softmax_backward(Context& c);  // softmax_backward, log_softmax_backward
Types infer_cross_entropy_backward(Context& c);
Types infer_reduce_max_backward(Context& c);
Types infer_pool_backward(Context& c);  // max_pool_backward, avg_pool_backward
Types infer_slice_backward(Context& c);
Types infer_pad_backward(Context& c);
Types infer_gather_backward(Context& c);  // and gather_elements_backward
Types infer_resize_backward(Context& c);
Types infer_optimizer(Context& c);  // sgd_update, adamw_update
Types infer_nonfinite_any(Context& c);
Types infer_all_reduce(Context& c);
Types infer_loss_scale_update(Context& c);

// pointwise_program.cpp
Types infer_fused_pointwise(Context& c);

}  // namespace fusebox::infer
