#include "fusebox/ir/graph.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "fusebox/core/memory.h"
#include "fusebox/ir/op_info.h"
#include "fusebox/ir/pointwise_program.h"

namespace fusebox {

const char* op_name(OpKind k) {
  return op_info(k).name;
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::none:
      return "none";
    case Activation::relu:
      return "relu";
    case Activation::gelu:
      return "gelu";
    case Activation::gelu_tanh:
      return "gelu_tanh";
    case Activation::silu:
      return "silu";
    case Activation::sigmoid:
      return "sigmoid";
    case Activation::tanh:
      return "tanh";
    case Activation::clip:
      return "clip";
  }
  return "?";
}

const char* resize_mode_name(ResizeMode m) {
  switch (m) {
    case ResizeMode::nearest:
      return "nearest";
    case ResizeMode::linear:
      return "linear";
    case ResizeMode::cubic:
      return "cubic";
  }
  return "?";
}

const char* resize_coordinates_name(ResizeCoordinates c) {
  switch (c) {
    case ResizeCoordinates::half_pixel:
      return "half_pixel";
    case ResizeCoordinates::half_pixel_symmetric:
      return "half_pixel_symmetric";
    case ResizeCoordinates::pytorch_half_pixel:
      return "pytorch_half_pixel";
    case ResizeCoordinates::align_corners:
      return "align_corners";
    case ResizeCoordinates::asymmetric:
      return "asymmetric";
    case ResizeCoordinates::tf_crop_and_resize:
      return "tf_crop_and_resize";
    case ResizeCoordinates::tf_half_pixel_for_nn:
      return "tf_half_pixel_for_nn";
  }
  return "?";
}

const char* resize_nearest_name(ResizeNearest r) {
  switch (r) {
    case ResizeNearest::round_prefer_floor:
      return "round_prefer_floor";
    case ResizeNearest::round_prefer_ceil:
      return "round_prefer_ceil";
    case ResizeNearest::floor:
      return "floor";
    case ResizeNearest::ceil:
      return "ceil";
  }
  return "?";
}

bool parse_op_name(const std::string& name, OpKind* out) {
  for (const OpInfo& info : kOpTable) {
    if (name == info.name) {
      *out = info.op;
      return true;
    }
  }
  return false;
}

std::string node_label(const Node& n) {
  return cat(op_name(n.op), " '", n.name, "'");
}

namespace {

// Every value a graph holds is held to kMaxTensorBytes (core/memory.h) where it is made: shape
// inference multiplies extents (Expand to [2^44 + 1, 2^20], a Tile, a Resize's sizes) past what
// memory or int64 holds, and every op's outputs are checked here alike, so that no backend
// allocates, indexes or writes by a wrapped size.
void check_output_sizes(const Node& n, const std::vector<TensorType>& types) {
  for (size_t i = 0; i < types.size(); ++i)
    tensor_size_or_throw(types[i].shape, types[i].dtype, node_label(n), cat("output ", i));
}

}  // namespace

std::string Graph::unique_name(const std::string& base) {
  std::string b = base.empty() ? "v" : base;
  if (!value_names_.count(b)) return b;
  for (int i = 1;; ++i) {
    std::string c = cat(b, "_", i);
    if (!value_names_.count(c)) return c;
  }
}

ValueId Graph::new_value(const std::string& name, TensorType type, NodeId producer) {
  Value v;
  v.id = ValueId(values_.size());
  v.name = name;
  v.type = std::move(type);
  v.producer = producer;
  value_names_[v.name] = v.id;
  values_.push_back(std::move(v));
  return values_.back().id;
}

ValueId Graph::add_input(const std::string& name, DType dtype, Shape shape) {
  FUSEBOX_CHECK(!name.empty(), "graph " + name_, "a graph input needs a name");
  FUSEBOX_CHECK(!value_names_.count(name), "graph " + name_, "input name '", name,
                "' is already used by another value");
  for (int64_t d : shape) {
    FUSEBOX_CHECK(d >= 0, "graph " + name_, "input '", name, "' has a negative extent in ",
                  shape_str(shape));
  }
  tensor_size_or_throw(shape, dtype, "graph " + name_, cat("input '", name, "'"));
  ValueId v = new_value(name, {dtype, std::move(shape)}, -1);
  inputs_.push_back(v);
  return v;
}

ValueId Graph::add_constant(const std::string& name, Tensor value) {
  FUSEBOX_CHECK(value.defined(), "graph " + name_, "constant '", name, "' has no data");
  std::string n = unique_name(name.empty() ? "const" : name);
  ValueId v = new_value(n, {value.dtype(), value.shape()}, -1);
  constants_[v] = std::move(value);
  return v;
}

std::vector<ValueId> Graph::add_node(OpKind op, Attrs attrs, std::vector<ValueId> inputs,
                                     std::string name, std::vector<std::string> output_names) {
  Node n;
  n.id = NodeId(nodes_.size());
  n.op = op;
  n.attrs = std::move(attrs);
  n.inputs = std::move(inputs);
  if (name.empty()) name = cat(op_name(op), "_", n.id);
  if (node_names_.count(name)) name = cat(name, "_", n.id);
  n.name = name;
  std::vector<std::optional<TensorType>> in_types;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    ValueId v = n.inputs[i];
    if (v == kNoValue) {
      in_types.push_back(std::nullopt);
      continue;
    }
    FUSEBOX_CHECK(v >= 0 && size_t(v) < values_.size(), node_label(n), "input ", i,
                  " refers to value id ", v, " which does not exist");
    in_types.push_back(values_[size_t(v)].type);
  }
  std::vector<TensorType> out_types = infer_and_normalize(n, in_types);
  check_output_sizes(n, out_types);
  for (size_t i = 0; i < out_types.size(); ++i) {
    std::string out_name = i < output_names.size() && !output_names[i].empty()
                               ? output_names[i]
                               : (out_types.size() == 1 ? n.name : cat(n.name, ":", i));
    FUSEBOX_CHECK(!(i < output_names.size() && !output_names[i].empty() &&
                    value_names_.count(output_names[i])),
                  node_label(n), "output name '", output_names[i],
                  "' is already used by another value");
    n.outputs.push_back(new_value(unique_name(out_name), out_types[i], n.id));
  }
  node_names_[n.name] = n.id;
  nodes_.push_back(std::move(n));
  return nodes_.back().outputs;
}

void Graph::mark_output(ValueId v) {
  FUSEBOX_CHECK(v >= 0 && size_t(v) < values_.size(), "graph " + name_, "output value id ", v,
                " does not exist");
  outputs_.push_back(v);
}

void Graph::rename_value(ValueId v, const std::string& name) {
  FUSEBOX_CHECK(v >= 0 && size_t(v) < values_.size(), "graph " + name_, "value id ", v,
                " does not exist");
  Value& val = values_[size_t(v)];
  if (val.name == name) return;
  FUSEBOX_CHECK(!name.empty() && !value_names_.count(name), "graph " + name_, "cannot rename '",
                val.name, "' to '", name, "': name empty or taken");
  value_names_.erase(val.name);
  val.name = name;
  value_names_[name] = v;
}

const Value& Graph::value(ValueId v) const {
  FUSEBOX_CHECK(v >= 0 && size_t(v) < values_.size(), "graph " + name_, "value id ", v,
                " does not exist");
  return values_[size_t(v)];
}

const Node& Graph::node(NodeId n) const {
  FUSEBOX_CHECK(n >= 0 && size_t(n) < nodes_.size(), "graph " + name_, "node id ", n,
                " does not exist");
  return nodes_[size_t(n)];
}

const Tensor* Graph::constant(ValueId v) const {
  auto it = constants_.find(v);
  return it == constants_.end() ? nullptr : &it->second;
}

std::optional<ValueId> Graph::find_value(const std::string& name) const {
  auto it = value_names_.find(name);
  if (it == value_names_.end()) return std::nullopt;
  return it->second;
}

void Graph::verify() const {
  const std::string where = "verify " + name_;
  std::set<std::string> names;
  for (size_t i = 0; i < values_.size(); ++i) {
    const Value& v = values_[i];
    FUSEBOX_CHECK(v.id == ValueId(i), where, "value '", v.name, "' has id ", v.id, " at slot ", i);
    FUSEBOX_CHECK(names.insert(v.name).second, where, "two values are named '", v.name, "'");
    bool is_input = std::find(inputs_.begin(), inputs_.end(), v.id) != inputs_.end();
    if (v.producer < 0) {
      FUSEBOX_CHECK(is_input || is_constant(v.id), where, "value '", v.name,
                    "' has no producer and is neither an input nor a constant");
    }
    if (const Tensor* c = constant(v.id)) {
      FUSEBOX_CHECK(c->dtype() == v.type.dtype && c->shape() == v.type.shape, where, "constant '",
                    v.name, "' data does not match its declared type");
    }
  }
  std::set<std::string> node_names;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    FUSEBOX_CHECK(n.id == NodeId(i), where, node_label(n), " has id ", n.id, " at slot ", i);
    FUSEBOX_CHECK(node_names.insert(n.name).second, where, "two nodes are named '", n.name, "'");
    std::vector<std::optional<TensorType>> in_types;
    for (ValueId v : n.inputs) {
      if (v == kNoValue) {
        in_types.push_back(std::nullopt);
        continue;
      }
      FUSEBOX_CHECK(v >= 0 && size_t(v) < values_.size(), where, node_label(n), " reads value id ",
                    v, " which does not exist");
      const Value& val = values_[size_t(v)];
      FUSEBOX_CHECK(val.producer < n.id, where, node_label(n), " reads '", val.name,
                    "' before it is produced");
      in_types.push_back(val.type);
    }
    Node copy = n;
    std::vector<TensorType> types = infer_and_normalize(copy, in_types);
    check_output_sizes(n, types);
    FUSEBOX_CHECK(types.size() == n.outputs.size(), where, node_label(n), " has ", n.outputs.size(),
                  " outputs, inference gives ", types.size());
    for (size_t o = 0; o < types.size(); ++o) {
      const Value& out = value(n.outputs[o]);
      FUSEBOX_CHECK(out.producer == n.id, where, node_label(n), " output '", out.name,
                    "' names another producer");
      FUSEBOX_CHECK(out.type == types[o], where, node_label(n), " output '", out.name, "' is ",
                    dtype_name(out.type.dtype), shape_str(out.type.shape), " but inference gives ",
                    dtype_name(types[o].dtype), shape_str(types[o].shape));
    }
  }
  for (ValueId v : outputs_) value(v);
}

namespace {

std::string type_str(const TensorType& t) {
  return cat(dtype_name(t.dtype), shape_str(t.shape));
}

std::string ints(const std::vector<int64_t>& v) {
  return shape_str(v);
}

std::string activation_str(const FusedActivation& a) {
  if (a.kind != Activation::clip) return activation_name(a.kind);
  return cat("clip[", a.min, ",", a.max, "]");
}

std::string conv_attr_str(const ConvAttrs& a) {
  std::string s =
      cat("strides=", ints(a.strides), " dilations=", ints(a.dilations),
          " pads_begin=", ints(a.pads_begin), " pads_end=", ints(a.pads_end), " groups=", a.groups);
  if (a.activation) s += cat(" activation=", activation_str(a.activation));
  if (a.residual_activation)
    s += cat(" residual_activation=", activation_str(a.residual_activation));
  if (a.channel_stats) s += " channel_stats=1";
  return s;
}

// A short, one-line rendering of a node's attributes for dump().
std::string attr_str(const Attrs& attrs) {
  return std::visit(
      [](const auto& a) -> std::string {
        using A = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<A, std::monostate>)
          return "";
        else if constexpr (std::is_same_v<A, ConvAttrs>)
          return conv_attr_str(a);
        else if constexpr (std::is_same_v<A, ConvBackwardDataAttrs>)
          return cat(conv_attr_str(a.conv), " input_spatial=", ints(a.input_spatial));
        else if constexpr (std::is_same_v<A, ConvBackwardFilterAttrs>)
          return cat(conv_attr_str(a.conv), " filter_spatial=", ints(a.filter_spatial));
        else if constexpr (std::is_same_v<A, BatchNormAttrs>)
          return cat("epsilon=", a.epsilon, " momentum=", a.momentum, " training=", a.training,
                     a.relu ? " relu=1" : "", a.sync ? " sync=1" : "",
                     a.dy_output ? " dy_output=1" : "");
        else if constexpr (std::is_same_v<A, NormAttrs>)
          return cat("axis=", a.axis, " epsilon=", a.epsilon,
                     a.y_dtype ? cat(" y_dtype=", dtype_name(*a.y_dtype)) : "");
        else if constexpr (std::is_same_v<A, LeakyReluAttrs>)
          return cat("alpha=", a.alpha);
        else if constexpr (std::is_same_v<A, GeluAttrs>)
          return a.tanh_approximation ? "approximate=tanh" : "approximate=none";
        else if constexpr (std::is_same_v<A, ClipAttrs>)
          return cat("min=", a.min, " max=", a.max);
        else if constexpr (std::is_same_v<A, GemmAttrs>)
          return cat("trans_a=", a.trans_a, " trans_b=", a.trans_b, " alpha=", a.alpha,
                     " beta=", a.beta,
                     a.activation ? " activation=" + activation_str(a.activation) : "",
                     a.y_dtype ? cat(" y_dtype=", dtype_name(*a.y_dtype)) : "");
        else if constexpr (std::is_same_v<A, ReduceAttrs>)
          return cat("axes=", ints(a.axes), " keepdims=", a.keepdims);
        else if constexpr (std::is_same_v<A, SoftmaxAttrs>)
          return cat("axis=", a.axis);
        else if constexpr (std::is_same_v<A, ArgReduceAttrs>)
          return cat("axis=", a.axis, " keepdims=", a.keepdims,
                     a.select_last_index ? " select_last_index=1" : "");
        else if constexpr (std::is_same_v<A, TopKAttrs>)
          return cat("k=", a.k, " axis=", a.axis, " largest=", a.largest, " sorted=", a.sorted);
        else if constexpr (std::is_same_v<A, AllReduceAttrs>)
          return cat(a.mean ? "mean" : "sum", " reduce_dtype=", dtype_name(a.reduce_dtype));
        else if constexpr (std::is_same_v<A, AttentionAttrs>)
          return cat("scale=", a.scale, " causal=", a.causal, a.with_lse ? " with_lse=1" : "",
                     a.bias_grad ? " bias_grad=1" : "");
        else if constexpr (std::is_same_v<A, PoolAttrs>)
          return cat("kernel=", ints(a.kernel), " strides=", ints(a.strides),
                     " dilations=", ints(a.dilations), " pads_begin=", ints(a.pads_begin),
                     " pads_end=", ints(a.pads_end), " ceil_mode=", a.ceil_mode,
                     " count_include_pad=", a.count_include_pad);
        else if constexpr (std::is_same_v<A, ReshapeAttrs>)
          return cat("shape=", ints(a.shape));
        else if constexpr (std::is_same_v<A, FlattenAttrs>)
          return cat("axis=", a.axis);
        else if constexpr (std::is_same_v<A, TransposeAttrs>)
          return cat("perm=", ints(a.perm));
        else if constexpr (std::is_same_v<A, ConcatAttrs>)
          return cat("axis=", a.axis);
        else if constexpr (std::is_same_v<A, SliceAttrs>)
          return cat("starts=", ints(a.starts), " ends=", ints(a.ends), " axes=", ints(a.axes),
                     " steps=", ints(a.steps));
        else if constexpr (std::is_same_v<A, PadAttrs>)
          return cat("pads=", ints(a.pads), " mode=",
                     a.mode == PadMode::constant  ? "constant"
                     : a.mode == PadMode::reflect ? "reflect"
                                                  : "edge",
                     " value=", a.value);
        else if constexpr (std::is_same_v<A, AxesAttrs>)
          return cat("axes=", ints(a.axes));
        else if constexpr (std::is_same_v<A, CastAttrs>)
          return cat("to=", dtype_name(a.to));
        else if constexpr (std::is_same_v<A, ConstantAttrs>)
          return cat("value=", dtype_name(a.value.dtype()), shape_str(a.value.shape()));
        else if constexpr (std::is_same_v<A, CrossEntropyAttrs>)
          return cat("reduction=",
                     a.reduction == Reduction::mean  ? "mean"
                     : a.reduction == Reduction::sum ? "sum"
                                                     : "none",
                     a.ignore_index ? cat(" ignore_index=", *a.ignore_index) : std::string(),
                     a.lse_stash ? " lse_stash=1" : "",
                     a.classes ? cat(" classes=", *a.classes) : std::string());
        else if constexpr (std::is_same_v<A, ExpandAttrs>)
          return cat("shape=", ints(a.shape));
        else if constexpr (std::is_same_v<A, GatherAttrs>)
          return cat("axis=", a.axis);
        else if constexpr (std::is_same_v<A, CumSumAttrs>)
          return cat("axis=", a.axis, a.exclusive ? " exclusive=1" : "",
                     a.reverse ? " reverse=1" : "");
        else if constexpr (std::is_same_v<A, GatherBackwardAttrs>)
          return cat(attr_str(a.gather), " data_shape=", ints(a.data_shape));
        else if constexpr (std::is_same_v<A, ResizeAttrs>) {
          std::string s = cat("sizes=", ints(a.sizes), " mode=", resize_mode_name(a.mode),
                              " coordinates=", resize_coordinates_name(a.coordinates));
          if (a.mode == ResizeMode::nearest) s += cat(" nearest=", resize_nearest_name(a.nearest));
          if (a.mode == ResizeMode::cubic)
            s += cat(" cubic_a=", a.cubic_a, a.exclude_outside ? " exclude_outside=1" : "");
          return s;
        } else if constexpr (std::is_same_v<A, ResizeBackwardAttrs>)
          return cat(attr_str(a.resize), " input_shape=", ints(a.input_shape));
        else if constexpr (std::is_same_v<A, UnaryBackwardAttrs>) {
          std::string s = cat("op=", op_name(a.op));
          if (a.op == OpKind::leaky_relu) s += cat(" alpha=", a.alpha);
          if (a.op == OpKind::gelu)
            s += a.tanh_approximation ? " approximate=tanh" : " approximate=none";
          if (a.op == OpKind::clip) s += cat(" min=", a.min, " max=", a.max);
          return s;
        } else if constexpr (std::is_same_v<A, BinaryBackwardAttrs>)
          return cat("op=", op_name(a.op));
        else if constexpr (std::is_same_v<A, PoolBackwardAttrs>)
          return cat(attr_str(a.pool), " input_shape=", ints(a.input_shape));
        else if constexpr (std::is_same_v<A, SliceBackwardAttrs>)
          return cat(attr_str(a.slice), " input_shape=", ints(a.input_shape));
        else if constexpr (std::is_same_v<A, PadBackwardAttrs>)
          return cat(attr_str(a.pad), " input_shape=", ints(a.input_shape));
        else if constexpr (std::is_same_v<A, SgdAttrs>)
          return cat("momentum=", a.momentum, " dampening=", a.dampening,
                     " weight_decay=", a.weight_decay, " nesterov=", a.nesterov);
        else if constexpr (std::is_same_v<A, AdamWAttrs>)
          return cat("beta1=", a.beta1, " beta2=", a.beta2, " epsilon=", a.epsilon,
                     " weight_decay=", a.weight_decay);
        else if constexpr (std::is_same_v<A, LossScaleAttrs>)
          return cat("growth_factor=", a.growth_factor, " backoff_factor=", a.backoff_factor,
                     " growth_interval=", a.growth_interval);
        else if constexpr (std::is_same_v<A, PointwiseProgram>)
          return cat("program: ", pointwise_program_text(a));
        else
          return "";
      },
      attrs);
}

}  // namespace

std::string Graph::dump() const {
  std::ostringstream os;
  os << "graph " << name_ << " (" << nodes_.size() << " nodes, " << constants_.size()
     << " constants)\n";
  for (ValueId v : inputs_)
    os << "  input  %" << value(v).name << ": " << type_str(value(v).type) << "\n";
  int64_t const_bytes = 0;
  for (const auto& [v, t] : constants_) const_bytes += int64_t(t.nbytes());
  if (!constants_.empty())
    os << "  constants: " << constants_.size() << " tensors, " << const_bytes << " bytes\n";
  for (const Node& n : nodes_) {
    os << "  ";
    for (size_t i = 0; i < n.outputs.size(); ++i)
      os << (i ? ", " : "") << "%" << value(n.outputs[i]).name << ": "
         << type_str(value(n.outputs[i]).type);
    os << " = " << op_name(n.op) << "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      os << (i ? ", " : "");
      if (n.inputs[i] == kNoValue)
        os << "_";
      else
        os << (is_constant(n.inputs[i]) ? "$" : "%") << value(n.inputs[i]).name;
    }
    os << ")";
    std::string a = attr_str(n.attrs);
    if (!a.empty()) os << " {" << a << "}";
    os << "  # " << n.name << "\n";
  }
  for (ValueId v : outputs_)
    os << "  output %" << value(v).name << ": " << type_str(value(v).type) << "\n";
  return os.str();
}

}  // namespace fusebox
