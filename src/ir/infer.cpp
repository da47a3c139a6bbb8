// infer_and_normalize: the generic checks every node gets (input count, required
// inputs, attribute alternative, extents), then the op family's inference
// (infer_conv.cpp, infer_math.cpp, infer_norm.cpp, infer_shape_ops.cpp).
#include <array>
#include <limits>
#include <type_traits>
#include <utility>

#include "fusebox/ir/graph.h"
#include "fusebox/ir/op_groups.h"
#include "infer_common.h"

namespace fusebox {
namespace {

// Index of attribute struct A among Attrs' alternatives.
template <class A, size_t I = 0>
constexpr size_t attrs_index() {
  if constexpr (std::is_same_v<std::variant_alternative_t<I, Attrs>, A>)
    return I;
  else
    return attrs_index<A, I + 1>();
}

// Names of Attrs' alternatives, in order, for messages.
// clang-format off
constexpr std::array<const char*, 31> kAttrsNames = {
    "no attributes (std::monostate)", "ConvAttrs", "ConvBackwardDataAttrs",
    "ConvBackwardFilterAttrs", "BatchNormAttrs", "NormAttrs", "LeakyReluAttrs", "GeluAttrs",
    "ClipAttrs", "GemmAttrs", "ReduceAttrs", "SoftmaxAttrs", "PoolAttrs", "ReshapeAttrs",
    "FlattenAttrs", "TransposeAttrs", "ConcatAttrs", "SliceAttrs", "PadAttrs", "AxesAttrs",
    "CastAttrs", "ConstantAttrs", "CrossEntropyAttrs", "ExpandAttrs", "UnaryBackwardAttrs",
    "BinaryBackwardAttrs", "PoolBackwardAttrs", "SliceBackwardAttrs", "PadBackwardAttrs",
    "SgdAttrs", "AdamWAttrs"};
// clang-format on
static_assert(kAttrsNames.size() == std::variant_size_v<Attrs>);
static_assert(attrs_index<ConvAttrs>() == 1 && attrs_index<PoolAttrs>() == 12 &&
              attrs_index<AdamWAttrs>() == kAttrsNames.size() - 1);

constexpr const char* kX[] = {"x"};
constexpr const char* kConv[] = {"x", "w", "bias"};
constexpr const char* kConvBackwardData[] = {"dy", "w", "bias"};
constexpr const char* kConvBackwardFilter[] = {"x", "dy"};
constexpr const char* kBatchNorm[] = {"x", "scale", "bias", "mean", "var"};
constexpr const char* kLayerNorm[] = {"x", "scale", "bias"};
constexpr const char* kRmsNorm[] = {"x", "scale"};
constexpr const char* kBinary[] = {"a", "b"};
constexpr const char* kPow[] = {"base", "exponent"};
constexpr const char* kGemm[] = {"a", "b", "c"};
constexpr const char* kCrossEntropy[] = {"logits", "labels", "weight"};
constexpr const char* kDyX[] = {"dy", "x"};
constexpr const char* kDy[] = {"dy"};
constexpr const char* kDyY[] = {"dy", "y"};
constexpr const char* kDyXY[] = {"dy", "x", "y"};
constexpr const char* kBinaryBackward[] = {"dy", "a", "b"};
constexpr const char* kBatchNormBackward[] = {"dy", "x", "scale", "saved_mean", "saved_inv_std"};
constexpr const char* kLayerNormBackward[] = {"dy", "x", "scale", "mean", "inv_std_dev"};
constexpr const char* kRmsNormBackward[] = {"dy", "x", "scale", "inv_rms"};
constexpr const char* kCrossEntropyBackward[] = {"dloss", "log_prob", "labels", "weight"};
constexpr const char* kSgd[] = {"param", "grad", "momentum_buf", "lr"};
constexpr const char* kAdamW[] = {"param", "grad", "m", "v", "lr", "step"};

// What a node of an op looks like: input count range, input roles, and its
// attribute struct (`defaultable`: std::monostate is accepted and replaced by
// the default-constructed struct, because every field has a usable default).
struct OpSpec {
  int min_inputs;
  int max_inputs;
  std::span<const char* const> roles;
  size_t attrs;
  bool defaultable;
  // Bit i: input i may be absent although it comes before min_inputs (a middle
  // optional input such as layer_norm_backward's scale).
  uint32_t optional_inputs = 0;
};

template <class A>
constexpr OpSpec spec(int min_inputs, int max_inputs, std::span<const char* const> roles,
                      bool defaultable, uint32_t optional_inputs = 0) {
  return {min_inputs, max_inputs, roles, attrs_index<A>(), defaultable, optional_inputs};
}

constexpr int kUnbounded = std::numeric_limits<int>::max();

OpSpec op_spec(OpKind op) {
  using M = std::monostate;
  switch (op) {
    case OpKind::conv:
      return spec<ConvAttrs>(2, 3, kConv, true);
    case OpKind::conv_backward_data:
      return spec<ConvBackwardDataAttrs>(2, 3, kConvBackwardData, false);
    case OpKind::conv_backward_filter:
      return spec<ConvBackwardFilterAttrs>(2, 2, kConvBackwardFilter, false);
    case OpKind::batch_norm:
      return spec<BatchNormAttrs>(5, 5, kBatchNorm, true);
    case OpKind::layer_norm:
      return spec<NormAttrs>(1, 3, kLayerNorm, true);
    case OpKind::rms_norm:
      return spec<NormAttrs>(1, 2, kRmsNorm, true);
    case OpKind::relu:
    case OpKind::silu:
    case OpKind::sigmoid:
    case OpKind::tanh:
    case OpKind::exp:
    case OpKind::log:
    case OpKind::sqrt:
    case OpKind::rsqrt:
    case OpKind::reciprocal:
    case OpKind::neg:
    case OpKind::abs:
    case OpKind::erf:
    case OpKind::identity:
    case OpKind::global_avg_pool:
      return spec<M>(1, 1, kX, false);
    case OpKind::leaky_relu:
      return spec<LeakyReluAttrs>(1, 1, kX, true);
    case OpKind::gelu:
      return spec<GeluAttrs>(1, 1, kX, true);
    case OpKind::clip:
      return spec<ClipAttrs>(1, 1, kX, true);
    case OpKind::add:
    case OpKind::sub:
    case OpKind::mul:
    case OpKind::div:
    case OpKind::max:
    case OpKind::min:
    case OpKind::matmul:
      return spec<M>(2, 2, kBinary, false);
    case OpKind::pow:
      return spec<M>(2, 2, kPow, false);
    case OpKind::gemm:
      return spec<GemmAttrs>(2, 3, kGemm, true);
    FUSEBOX_REDUCE_OPS(FUSEBOX_OP_CASE)
      return spec<ReduceAttrs>(1, 1, kX, true);
    case OpKind::softmax:
    case OpKind::log_softmax:
      return spec<SoftmaxAttrs>(1, 1, kX, true);
    case OpKind::max_pool:
    case OpKind::avg_pool:
      return spec<PoolAttrs>(1, 1, kX, false);
    case OpKind::reshape:
      return spec<ReshapeAttrs>(1, 1, kX, false);
    case OpKind::flatten:
      return spec<FlattenAttrs>(1, 1, kX, true);
    case OpKind::transpose:
      return spec<TransposeAttrs>(1, 1, kX, true);
    case OpKind::concat:
      return spec<ConcatAttrs>(1, kUnbounded, {}, false);
    case OpKind::slice:
      return spec<SliceAttrs>(1, 1, kX, false);
    case OpKind::pad:
      return spec<PadAttrs>(1, 1, kX, false);
    case OpKind::squeeze:
      return spec<AxesAttrs>(1, 1, kX, true);
    case OpKind::unsqueeze:
      return spec<AxesAttrs>(1, 1, kX, false);
    case OpKind::cast:
      return spec<CastAttrs>(1, 1, kX, false);
    case OpKind::constant:
      return spec<ConstantAttrs>(0, 0, {}, false);
    case OpKind::cross_entropy:
      return spec<CrossEntropyAttrs>(2, 3, kCrossEntropy, true);
    case OpKind::expand:
      return spec<ExpandAttrs>(1, 1, kX, false);
    case OpKind::unary_backward:
      return spec<UnaryBackwardAttrs>(2, 2, kDyX, false);
    case OpKind::binary_backward:
      return spec<BinaryBackwardAttrs>(3, 3, kBinaryBackward, false);
    case OpKind::batch_norm_backward:
      return spec<BatchNormAttrs>(5, 5, kBatchNormBackward, true);
    case OpKind::layer_norm_backward:
      return spec<NormAttrs>(5, 5, kLayerNormBackward, true, 1u << 2);
    case OpKind::rms_norm_backward:
      return spec<NormAttrs>(4, 4, kRmsNormBackward, true, 1u << 2);
    case OpKind::softmax_backward:
    case OpKind::log_softmax_backward:
      return spec<SoftmaxAttrs>(2, 2, kDyY, true);
    case OpKind::cross_entropy_backward:
      return spec<CrossEntropyAttrs>(3, 4, kCrossEntropyBackward, true);
    case OpKind::reduce_max_backward:
      return spec<ReduceAttrs>(3, 3, kDyXY, false);
    case OpKind::max_pool_backward:
      return spec<PoolBackwardAttrs>(2, 2, kDyX, false);
    case OpKind::avg_pool_backward:
      return spec<PoolBackwardAttrs>(1, 1, kDy, false);
    case OpKind::slice_backward:
      return spec<SliceBackwardAttrs>(1, 1, kDy, false);
    case OpKind::pad_backward:
      return spec<PadBackwardAttrs>(1, 1, kDy, false);
    case OpKind::sgd_update:
      return spec<SgdAttrs>(4, 4, kSgd, true);
    case OpKind::adamw_update:
      return spec<AdamWAttrs>(6, 6, kAdamW, true);
  }
  throw Error("infer", cat("unknown op kind ", int(op)));
}

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
std::string signature(const OpSpec& s) {
  if (s.roles.empty()) return "";
  std::string out = " (";
  for (size_t i = 0; i < s.roles.size(); ++i) {
    const bool optional = int(i) >= s.min_inputs || (s.optional_inputs >> i & 1u);
    out += cat(i ? ", " : "", s.roles[i], optional ? "?" : "");
  }
  return out + ")";
}

// Input count, required inputs present, the attribute alternative, extents >= 0.
void check_generic(infer::Context& c, const OpSpec& s) {
  const int n = c.count();
  if (s.max_inputs == 0) {
    c.check(n == 0, "takes no inputs but got ", n);
  } else if (s.max_inputs == kUnbounded) {
    c.check(n >= s.min_inputs, "takes at least ", s.min_inputs, " input",
            s.min_inputs == 1 ? "" : "s", " but got ", n);
  } else if (s.min_inputs == s.max_inputs) {
    c.check(n == s.min_inputs, "takes ", s.min_inputs, " input", s.min_inputs == 1 ? "" : "s",
            signature(s), " but got ", n);
  } else {
    c.check(n >= s.min_inputs && n <= s.max_inputs, "takes ", s.min_inputs, " to ", s.max_inputs,
            " inputs", signature(s), " but got ", n);
  }
  for (int i = 0; i < n; ++i) {
    const bool optional =
        (i >= s.min_inputs && s.max_inputs != kUnbounded) || (s.optional_inputs >> i & 1u);
    c.check(optional || c.has(i), c.input(i), " is required but absent");
  }

  Attrs& attrs = c.node().attrs;
  // Every field of a defaultable struct has a usable default, so the empty
  // alternative means "all defaults".
  if (attrs.index() == 0 && s.defaultable) attrs = default_attrs(s.attrs);
  if (attrs.index() != s.attrs) {
    c.fail(s.attrs == 0 ? cat("takes no attributes but the node holds ", kAttrsNames[attrs.index()])
                        : cat("needs ", kAttrsNames[s.attrs], " but the node holds ",
                              kAttrsNames[attrs.index()]));
  }

  for (int i = 0; i < n; ++i) {
    if (!c.has(i)) continue;
    for (int64_t d : c.shape(i))
      c.check(d >= 0, c.input(i), " has a negative extent in ", shape_str(c.shape(i)));
  }
}

}  // namespace

namespace infer {

const TensorType& Context::type(int i) const {
  if (!has(i)) fail(cat(input(i), " is required but absent"));
  return *inputs_[size_t(i)];
}

const char* Context::role(int i) const {
  std::span<const char* const> roles = input_roles(node_.op);
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
  check(is_floating(dtype(i)), input(i), " is ", dtype_name(dtype(i)), " but ", op_name(),
        " needs a floating-point dtype (f64, f32, f16, bf16)");
}

void Context::expect_numeric(int i) const {
  check(dtype(i) != DType::boolean, input(i), " is bool but ", op_name(), " needs a numeric dtype");
}

void Context::expect_same_dtype(int i, int reference) const {
  check(dtype(i) == dtype(reference), input(i), " is ", dtype_name(dtype(i)), " but ",
        input(reference), " is ", dtype_name(dtype(reference)), ": they must match");
}

void Context::expect_rank(int i, int64_t r, const char* layout) const {
  check(rank(i) == r, input(i), " must be ", layout, " (rank ", r, ") but is ",
        shape_str(shape(i)));
}

void Context::expect_rank_between(int i, int64_t lo, int64_t hi, const char* layout) const {
  check(rank(i) >= lo && rank(i) <= hi, input(i), " must be ", layout, " (rank ", lo,
        hi == lo                                    ? std::string()
        : hi == std::numeric_limits<int64_t>::max() ? std::string(" or more")
                                                    : cat(" to ", hi),
        ") but is ", shape_str(shape(i)));
}

void Context::expect_shape(int i, const Shape& expected, const std::string& why) const {
  check(shape(i) == expected, input(i), " is ", shape_str(shape(i)), " but must be ",
        shape_str(expected), why.empty() ? "" : " ", why);
}

int64_t Context::axis(int64_t a, int64_t r, const std::string& what) const {
  int64_t out = 0;
  check(normalize_axis(a, r, &out), what, " ", a, " is out of range for rank ", r, " (valid: ", -r,
        " to ", r - 1, ")");
  return out;
}

std::vector<int64_t> Context::axes(const std::vector<int64_t>& in, int64_t r,
                                   const std::string& what) const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t a = axis(in[i], r, cat(what, "[", i, "]"));
    for (size_t j = 0; j < out.size(); ++j)
      check(out[j] != a, what, " ", shape_str(in), " names axis ", a, " twice (rank ", r, ")");
    out.push_back(a);
  }
  return out;
}

int64_t Context::add(int64_t a, int64_t b) const {
  int64_t out = 0;
  check(!__builtin_add_overflow(a, b, &out), "extent arithmetic overflows int64 (", a, " + ", b,
        ")");
  return out;
}

int64_t Context::mul(int64_t a, int64_t b) const {
  int64_t out = 0;
  check(!__builtin_mul_overflow(a, b, &out), "extent arithmetic overflows int64 (", a, " * ", b,
        ")");
  return out;
}

int64_t Context::product(const Shape& s, size_t begin, size_t end) const {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p = mul(p, s[i]);
  return p;
}

std::span<const char* const> input_roles(OpKind op) {
  return op_spec(op).roles;
}

DType stash_dtype(DType x) {
  return x == DType::f64 ? DType::f64 : DType::f32;
}

}  // namespace infer

OpArity op_arity(OpKind op) {
  OpSpec s = op_spec(op);
  return {s.min_inputs, s.max_inputs};
}

std::vector<TensorType> infer_and_normalize(Node& node,
                                            std::span<const std::optional<TensorType>> inputs) {
  using namespace infer;
  Context c(node, inputs);
  check_generic(c, op_spec(node.op));
  switch (node.op) {
    case OpKind::conv:
      return infer_conv(c);
    case OpKind::conv_backward_data:
      return infer_conv_backward_data(c);
    case OpKind::conv_backward_filter:
      return infer_conv_backward_filter(c);
    case OpKind::batch_norm:
      return infer_batch_norm(c);
    case OpKind::layer_norm:
    case OpKind::rms_norm:
      return infer_layer_norm(c);
    FUSEBOX_UNARY_POINTWISE_OPS(FUSEBOX_OP_CASE)
      return infer_unary(c);
    FUSEBOX_BINARY_POINTWISE_OPS(FUSEBOX_OP_CASE)
      return infer_binary(c);
    case OpKind::matmul:
      return infer_matmul(c);
    case OpKind::gemm:
      return infer_gemm(c);
    FUSEBOX_REDUCE_OPS(FUSEBOX_OP_CASE)
      return infer_reduce(c);
    case OpKind::softmax:
    case OpKind::log_softmax:
      return infer_softmax(c);
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
    case OpKind::unary_backward:
    case OpKind::binary_backward:
    case OpKind::batch_norm_backward:
    case OpKind::layer_norm_backward:
    case OpKind::rms_norm_backward:
    case OpKind::softmax_backward:
    case OpKind::log_softmax_backward:
    case OpKind::cross_entropy_backward:
    case OpKind::reduce_max_backward:
    case OpKind::max_pool_backward:
    case OpKind::avg_pool_backward:
    case OpKind::slice_backward:
    case OpKind::pad_backward:
      return infer_backward(c);
    case OpKind::sgd_update:
    case OpKind::adamw_update:
      return infer_optimizer(c);
  }
  c.fail("unknown op kind");
}

}  // namespace fusebox
