// infer_and_normalize: the generic checks every node gets (input count, required
// inputs, attribute alternative, extents), then the op family's inference
// (infer_conv.cpp, infer_math.cpp, infer_norm.cpp, infer_shape_ops.cpp, infer_backward.cpp).
#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "fusebox/ir/graph.h"
#include "fusebox/ir/op_groups.h"
#include "fusebox/ir/op_info.h"
#include "infer_common.h"

namespace fusebox {
namespace {

// Names of Attrs' alternatives, in order, for messages.
// clang-format off
constexpr std::array<const char*, 42> kAttrsNames = {
    "no attributes (std::monostate)", "ConvAttrs", "ConvBackwardDataAttrs",
    "ConvBackwardFilterAttrs", "BatchNormAttrs", "NormAttrs", "LeakyReluAttrs", "GeluAttrs",
    "ClipAttrs", "GemmAttrs", "ReduceAttrs", "SoftmaxAttrs", "PoolAttrs", "ReshapeAttrs",
    "FlattenAttrs", "TransposeAttrs", "ConcatAttrs", "SliceAttrs", "PadAttrs", "AxesAttrs",
    "CastAttrs", "ConstantAttrs", "CrossEntropyAttrs", "ExpandAttrs", "UnaryBackwardAttrs",
    "BinaryBackwardAttrs", "PoolBackwardAttrs", "SliceBackwardAttrs", "PadBackwardAttrs",
    "SgdAttrs", "AdamWAttrs", "LossScaleAttrs", "PointwiseProgram", "AttentionAttrs",
    "ArgReduceAttrs", "GatherAttrs", "GatherBackwardAttrs",
    "CumSumAttrs", "ResizeAttrs", "ResizeBackwardAttrs", "TopKAttrs", "AllReduceAttrs"};
// clang-format on
static_assert(kAttrsNames.size() == std::variant_size_v<Attrs>);
static_assert(attrs_index<ConvAttrs>() == 1 && attrs_index<PoolAttrs>() == 12 &&
              attrs_index<AllReduceAttrs>() == kAttrsNames.size() - 1);

template <size_t... I>
Attrs default_attrs(size_t index, std::index_sequence<I...>) {
  Attrs a;
  ((I == index ? (a.emplace<I>(), 0) : 0), ...);
  return a;
}
// The default-constructed alternative number `index` of Attrs.
Attrs default_attrs(size_t index) {
  return default_attrs(index, std::make_index_sequence<std::variant_size_v<Attrs>>());
}

// "(x, w, bias?)": the inputs an op takes, optional ones marked.
std::string signature(const OpInfo& s) {
  if (s.roles.empty()) return "";
  std::string out = " (";
  for (size_t i = 0; i < s.roles.size(); ++i) {
    const bool optional = int(i) >= s.min_inputs || (s.optional_inputs >> i & 1u);
    out += cat(i ? ", " : "", s.roles[i], optional ? "?" : "");
  }
  return out + ")";
}

// Input count, required inputs present, the attribute alternative, extents >= 0.
void check_generic(infer::Context& c, const OpInfo& s) {
  const int n = c.count();
  if (s.max_inputs == 0) {
    FUSEBOX_INFER_CHECK(c, n == 0, "takes no inputs but got ", n);
  } else if (s.max_inputs == kUnboundedInputs) {
    FUSEBOX_INFER_CHECK(c, n >= s.min_inputs, "takes at least ", s.min_inputs, " input",
                        s.min_inputs == 1 ? "" : "s", " but got ", n);
  } else if (s.min_inputs == s.max_inputs) {
    FUSEBOX_INFER_CHECK(c, n == s.min_inputs, "takes ", s.min_inputs, " input",
                        s.min_inputs == 1 ? "" : "s", signature(s), " but got ", n);
  } else {
    FUSEBOX_INFER_CHECK(c, n >= s.min_inputs && n <= s.max_inputs, "takes ", s.min_inputs, " to ",
                        s.max_inputs, " inputs", signature(s), " but got ", n);
  }
  for (int i = 0; i < n; ++i) {
    const bool optional =
        (i >= s.min_inputs && s.max_inputs != kUnboundedInputs) || (s.optional_inputs >> i & 1u);
    FUSEBOX_INFER_CHECK(c, optional || c.has(i), c.input(i), " is required but absent");
  }

  Attrs& attrs = c.node().attrs;
  // Every field of a defaultable struct has a usable default, so the empty
  // alternative means "all defaults".
  if (attrs.index() == 0 && s.attrs_defaultable) attrs = default_attrs(s.attrs);
  if (attrs.index() != s.attrs) {
    c.fail(s.attrs == 0 ? cat("takes no attributes but the node holds ", kAttrsNames[attrs.index()])
                        : cat("needs ", kAttrsNames[s.attrs], " but the node holds ",
                              kAttrsNames[attrs.index()]));
  }

  for (int i = 0; i < n; ++i) {
    if (!c.has(i)) continue;
    for (int64_t d : c.shape(i))
      FUSEBOX_INFER_CHECK(c, d >= 0, c.input(i), " has a negative extent in ",
                          shape_str(c.shape(i)));
  }
}

}  // namespace

namespace infer {

const TensorType& Context::type(int i) const {
  if (!has(i)) fail(cat(input(i), " is required but absent"));
  return *inputs_[size_t(i)];
}

const char* Context::role(int i) const {
  std::span<const char* const> roles = op_info(node_.op).roles;
  return i >= 0 && size_t(i) < roles.size() ? roles[size_t(i)] : "";
}

std::string Context::input(int i) const {
  const char* r = role(i);
  return *r ? cat("input ", i, " (", r, ")") : cat("input ", i);
}

std::string Context::shaped(int i) const {
  const char* r = role(i);
  return cat(*r ? std::string(r) : cat("input ", i), " ", shape_str(shape(i)));
}

void Context::fail(const std::string& message) const {
  throw Error(node_label(node_), message);
}

void Context::expect_float(int i) const {
  FUSEBOX_INFER_CHECK(*this, is_floating(dtype(i)), input(i), " is ", dtype_name(dtype(i)), " but ",
                      op_name(), " needs a floating-point dtype (f64, f32, f16, bf16)");
}

void Context::expect_numeric(int i) const {
  FUSEBOX_INFER_CHECK(*this, dtype(i) != DType::boolean, input(i), " is bool but ", op_name(),
                      " needs a numeric dtype");
}

void Context::expect_same_dtype(int i, int reference) const {
  FUSEBOX_INFER_CHECK(*this, dtype(i) == dtype(reference), input(i), " is ", dtype_name(dtype(i)),
                      " but ", input(reference), " is ", dtype_name(dtype(reference)),
                      ": they must match");
}

void Context::expect_rank(int i, int64_t r, const char* layout) const {
  FUSEBOX_INFER_CHECK(*this, rank(i) == r, input(i), " must be ", layout, " (rank ", r, ") but is ",
                      shape_str(shape(i)));
}

void Context::expect_rank_between(int i, int64_t lo, int64_t hi, const char* layout) const {
  FUSEBOX_INFER_CHECK(*this, rank(i) >= lo && rank(i) <= hi, input(i), " must be ", layout,
                      " (rank ", lo,
                      hi == lo                                    ? std::string()
                      : hi == std::numeric_limits<int64_t>::max() ? std::string(" or more")
                                                                  : cat(" to ", hi),
                      ") but is ", shape_str(shape(i)));
}

void expect_activation(const Context& c, const FusedActivation& a, const char* what) {
  if (a.kind != Activation::clip) {
    FUSEBOX_INFER_CHECK(c, std::isinf(a.min) && a.min < 0 && std::isinf(a.max) && a.max > 0, what,
                        " ", activation_name(a.kind), " has clip bounds [", a.min, ", ", a.max,
                        "]");
    return;
  }
  FUSEBOX_INFER_CHECK(c, !std::isnan(a.min) && !std::isnan(a.max) && a.min <= a.max, what,
                      " clip needs min <= max, got [", a.min, ", ", a.max, "]");
}

void Context::expect_shape(int i, const Shape& expected, const std::string& why) const {
  FUSEBOX_INFER_CHECK(*this, shape(i) == expected, input(i), " is ", shape_str(shape(i)),
                      " but must be ", shape_str(expected), why.empty() ? "" : " ", why);
}

int64_t Context::axis(int64_t a, int64_t r, const std::string& what) const {
  int64_t out = 0;
  FUSEBOX_INFER_CHECK(*this, normalize_axis(a, r, &out), what, " ", a, " is out of range for rank ",
                      r, " (valid: ", -r, " to ", r - 1, ")");
  return out;
}

std::vector<int64_t> Context::axes(const std::vector<int64_t>& in, int64_t r,
                                   const std::string& what) const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t a = axis(in[i], r, cat(what, "[", i, "]"));
    for (size_t j = 0; j < out.size(); ++j)
      FUSEBOX_INFER_CHECK(*this, out[j] != a, what, " ", shape_str(in), " names axis ", a,
                          " twice (rank ", r, ")");
    out.push_back(a);
  }
  return out;
}

int64_t Context::add(int64_t a, int64_t b) const {
  int64_t out = 0;
  FUSEBOX_INFER_CHECK(*this, !__builtin_add_overflow(a, b, &out),
                      "extent arithmetic overflows int64 (", a, " + ", b, ")");
  return out;
}

int64_t Context::mul(int64_t a, int64_t b) const {
  int64_t out = 0;
  FUSEBOX_INFER_CHECK(*this, !__builtin_mul_overflow(a, b, &out),
                      "extent arithmetic overflows int64 (", a, " * ", b, ")");
  return out;
}

int64_t Context::product(const Shape& s, size_t begin, size_t end) const {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p = mul(p, s[i]);
  return p;
}

}  // namespace infer

std::vector<TensorType> infer_and_normalize(Node& node,
                                            std::span<const std::optional<TensorType>> inputs) {
  using namespace infer;
  Context c(node, inputs);
  check_generic(c, op_info(node.op));
  switch (node.op) {
    case OpKind::conv:
      return infer_conv(c);
    case OpKind::conv_backward_data:
      return infer_conv_backward_data(c);
    case OpKind::conv_backward_filter:
      return infer_conv_backward_filter(c);
    case OpKind::batch_norm:
      return infer_batch_norm(c);
    case OpKind::batch_norm_apply:
      return infer_batch_norm_apply(c);
    case OpKind::layer_norm:
    case OpKind::rms_norm:
      return infer_layer_norm(c);
      FUSEBOX_UNARY_POINTWISE_OPS(FUSEBOX_OP_CASE)
      return infer_unary(c);
      FUSEBOX_BINARY_POINTWISE_OPS(FUSEBOX_OP_CASE)
      return infer_binary(c);
      FUSEBOX_LOGIC_OPS(FUSEBOX_OP_CASE)
      return infer_logic(c);
    case OpKind::where:
      return infer_where(c);
    case OpKind::matmul:
      return infer_matmul(c);
    case OpKind::gemm:
      return infer_gemm(c);
      FUSEBOX_REDUCE_OPS(FUSEBOX_OP_CASE)
      return infer_reduce(c);
    case OpKind::arg_max:
    case OpKind::arg_min:
      return infer_arg_reduce(c);
    case OpKind::cumsum:
      return infer_cumsum(c);
    case OpKind::top_k:
      return infer_top_k(c);
    case OpKind::softmax:
    case OpKind::log_softmax:
      return infer_softmax(c);
    case OpKind::attention:
      return infer_attention(c);
    case OpKind::attention_backward:
      return infer_attention_backward(c);
    case OpKind::max_pool:
    case OpKind::avg_pool:
      return infer_pool(c);
    case OpKind::global_avg_pool:
      return infer_global_avg_pool(c);
    case OpKind::reshape:
      return infer_reshape(c);
    case OpKind::flatten:
      return infer_flatten(c);
    case OpKind::transpose:
      return infer_transpose(c);
    case OpKind::concat:
      return infer_concat(c);
    case OpKind::slice:
      return infer_slice(c);
    case OpKind::pad:
      return infer_pad(c);
    case OpKind::squeeze:
      return infer_squeeze(c);
    case OpKind::unsqueeze:
      return infer_unsqueeze(c);
    case OpKind::cast:
      return infer_cast(c);
    case OpKind::constant:
      return infer_constant(c);
    case OpKind::identity:
      return infer_identity(c);
    case OpKind::cross_entropy:
      return infer_cross_entropy(c);
    case OpKind::expand:
      return infer_expand(c);
    case OpKind::gather:
      return infer_gather(c);
    case OpKind::gather_elements:
      return infer_gather_elements(c);
    case OpKind::resize:
      return infer_resize(c);
    case OpKind::unary_backward:
      return infer_unary_backward(c);
    case OpKind::binary_backward:
      return infer_binary_backward(c);
    case OpKind::batch_norm_backward:
      return infer_batch_norm_backward(c);
    case OpKind::layer_norm_backward:
    case OpKind::rms_norm_backward:
      return infer_norm_backward(c);
    case OpKind::softmax_backward:
    case OpKind::log_softmax_backward:
      return infer_softmax_backward(c);
    case OpKind::cross_entropy_backward:
      return infer_cross_entropy_backward(c);
    case OpKind::reduce_max_backward:
      return infer_reduce_max_backward(c);
    case OpKind::max_pool_backward:
    case OpKind::avg_pool_backward:
      return infer_pool_backward(c);
    case OpKind::slice_backward:
      return infer_slice_backward(c);
    case OpKind::pad_backward:
      return infer_pad_backward(c);
    case OpKind::gather_backward:
    case OpKind::gather_elements_backward:
      return infer_gather_backward(c);
    case OpKind::resize_backward:
      return infer_resize_backward(c);
    case OpKind::sgd_update:
    case OpKind::adamw_update:
      return infer_optimizer(c);
    case OpKind::nonfinite_any:
      return infer_nonfinite_any(c);
    case OpKind::loss_scale_update:
      return infer_loss_scale_update(c);
    case OpKind::fused_pointwise:
      return infer_fused_pointwise(c);
    case OpKind::all_reduce:
      return infer_all_reduce(c);
  }
  c.fail("unknown op kind");
}

}  // namespace fusebox
