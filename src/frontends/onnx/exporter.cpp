// fusebox::Graph -> ONNX ModelProto (opset 17, ir_version 8).
//
// Graph inputs and outputs keep their names and get full value_info types;
// constants become initializers; each node becomes one ONNX node, or a few for
// ops that opset 17 lacks (rms_norm, gelu, silu, rsqrt). Our attributes that ONNX
// takes as inputs (Reshape's shape, Slice's starts, Clip's bounds, ...) become
// initializers named after the node. Attributes are written after normalisation
// (explicit axes, pads, strides), so nothing depends on ONNX defaults.
#include <cmath>
#include <limits>
#include <numbers>
#include <set>

#include "fusebox/frontends/onnx.h"
#include "fusebox/io/tensor_file.h"
#include "fusebox/ir/op_info.h"
#include "io/tensor_proto.h"

namespace fusebox {
namespace {

using onnx::AttributeProto;
using onnx::NodeProto;

constexpr int64_t kOpset = 17;
constexpr int64_t kIrVersion = 8;

void set_int(NodeProto* n, const char* name, int64_t v) {
  AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(AttributeProto::INT);
  a->set_i(v);
}
void set_float(NodeProto* n, const char* name, double v) {
  AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(AttributeProto::FLOAT);
  a->set_f(float(v));
}
void set_ints(NodeProto* n, const char* name, const std::vector<int64_t>& v) {
  AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}
void set_string(NodeProto* n, const char* name, const std::string& v) {
  AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(AttributeProto::STRING);
  a->set_s(v);
}

std::vector<int64_t> joined(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

void set_type(onnx::ValueInfoProto* vi, const std::string& name, const TensorType& t) {
  vi->set_name(name);
  onnx::TypeProto::Tensor* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(dtype_to_onnx(t.dtype));
  onnx::TensorShapeProto* shape = tt->mutable_shape();
  for (int64_t d : t.shape) shape->add_dim()->set_dim_value(d);
}

class Exporter {
 public:
  explicit Exporter(const Graph& g) : g_(g) {
    for (const Value& v : g.values()) used_names_.insert(v.name);
    for (const Node& n : g.nodes()) used_node_names_.insert(n.name);
  }

  onnx::ModelProto run() {
    onnx::ModelProto model;
    model.set_ir_version(kIrVersion);
    model.set_producer_name("fusebox");
    model.set_producer_version("0.1.0");
    onnx::OperatorSetIdProto* opset = model.add_opset_import();
    opset->set_domain("");
    opset->set_version(kOpset);
    graph_ = model.mutable_graph();
    graph_->set_name(g_.name());

    for (ValueId v : g_.inputs()) set_type(graph_->add_input(), g_.value(v).name, g_.value(v).type);
    std::set<ValueId> output_constants;
    for (ValueId v : g_.outputs())
      if (g_.is_constant(v)) output_constants.insert(v);
    for (const auto& [v, t] : g_.constants()) {
      const std::string& name = g_.value(v).name;
      if (!output_constants.count(v)) {
        tensor_to_proto(t, name, graph_->add_initializer());
        continue;
      }
      // A graph output must be computed by a node: the initializer gets another name
      // and an Identity produces the output's name.
      std::string init = fresh(name + "/value");
      tensor_to_proto(t, init, graph_->add_initializer());
      add("Identity", fresh_node(name + "/identity"), {init}, {name});
    }
    for (const Node& n : g_.nodes()) export_node(n);
    std::set<ValueId> seen;
    for (ValueId v : g_.outputs()) {
      if (!seen.insert(v).second) continue;
      set_type(graph_->add_output(), g_.value(v).name, g_.value(v).type);
    }
    return model;
  }

 private:
  [[noreturn]] void fail(const Node& n, const std::string& message) const {
    throw Error("onnx export: " + node_label(n), message);
  }

  std::string fresh(const std::string& base) {
    std::string name = base;
    for (int k = 1; used_names_.count(name); ++k) name = cat(base, "_", k);
    used_names_.insert(name);
    return name;
  }
  std::string fresh_node(const std::string& base) {
    std::string name = base;
    for (int k = 1; used_node_names_.count(name); ++k) name = cat(base, "_", k);
    used_node_names_.insert(name);
    return name;
  }

  NodeProto* add(const std::string& op_type, const std::string& node_name,
                 const std::vector<std::string>& inputs, const std::vector<std::string>& outputs) {
    NodeProto* p = graph_->add_node();
    p->set_op_type(op_type);
    p->set_name(node_name);
    for (const std::string& s : inputs) p->add_input(s);
    for (const std::string& s : outputs) p->add_output(s);
    return p;
  }

  // An initializer named after node `n`; returns its name.
  std::string initializer(const Node& n, const std::string& what, const Tensor& t) {
    std::string name = fresh(cat(n.name, "/", what));
    tensor_to_proto(t, name, graph_->add_initializer());
    return name;
  }
  std::string ints_initializer(const Node& n, const std::string& what,
                               const std::vector<int64_t>& v) {
    return initializer(n, what, Tensor::from_vector<int64_t>({int64_t(v.size())}, v));
  }
  std::string scalar_initializer(const Node& n, const std::string& what, DType dtype, double v) {
    return initializer(n, what, Tensor::scalar(dtype, v));
  }

  std::string in(const Node& n, size_t i) const {
    return i < n.inputs.size() && n.inputs[i] != kNoValue ? g_.value(n.inputs[i]).name : "";
  }
  std::string out(const Node& n, size_t i) const { return g_.value(n.outputs.at(i)).name; }
  std::vector<std::string> ins(const Node& n) const {
    std::vector<std::string> v;
    for (size_t i = 0; i < n.inputs.size(); ++i) v.push_back(in(n, i));
    while (!v.empty() && v.back().empty()) v.pop_back();
    return v;
  }
  std::vector<std::string> outs(const Node& n) const {
    std::vector<std::string> v;
    for (size_t i = 0; i < n.outputs.size(); ++i) v.push_back(out(n, i));
    return v;
  }
  const TensorType& in_type(const Node& n, size_t i) const { return g_.value(n.inputs.at(i)).type; }
  // A helper node of `n`'s decomposition writing a fresh value; returns its name.
  std::string step(const Node& n, const std::string& op_type, const std::string& what,
                   const std::vector<std::string>& inputs, NodeProto** proto = nullptr) {
    std::string value = fresh(cat(n.name, "/", what));
    NodeProto* p = add(op_type, fresh_node(cat(n.name, "/", what)), inputs, {value});
    if (proto) *proto = p;
    return value;
  }
  // True when output i of `n` is read by a node or is a graph output.
  bool output_used(const Node& n, size_t i) const {
    ValueId v = n.outputs.at(i);
    for (ValueId o : g_.outputs())
      if (o == v) return true;
    for (const Node& m : g_.nodes())
      for (ValueId x : m.inputs)
        if (x == v) return true;
    return false;
  }

  void export_conv_attrs(NodeProto* p, const ConvAttrs& a, const Shape& w) {
    set_ints(p, "kernel_shape", Shape(w.begin() + 2, w.end()));
    set_ints(p, "strides", a.strides);
    set_ints(p, "dilations", a.dilations);
    set_ints(p, "pads", joined(a.pads_begin, a.pads_end));
    set_int(p, "group", a.groups);
  }

  void export_node(const Node& n);
  void export_rms_norm(const Node& n);
  void export_gelu(const Node& n);
  // gelu(x) into value y; the last node is named node_name.
  void export_gelu_of(const Node& n, const std::string& x, const std::string& y, DType dt,
                      bool tanh_approximation, const std::string& node_name);
  // A fused activation (ir/ops.h) of x into value y, as ONNX nodes named after `n`.
  void export_activation(const Node& n, const FusedActivation& a, const std::string& x,
                         const std::string& y, DType dt);

  const Graph& g_;
  onnx::GraphProto* graph_ = nullptr;
  std::set<std::string> used_names_;
  std::set<std::string> used_node_names_;
};

void Exporter::export_node(const Node& n) {
  if (const char* simple = op_info(n.op).onnx_type) {
    add(simple, n.name, ins(n), outs(n));
    return;
  }
  switch (n.op) {
    case OpKind::conv: {
      // A fused epilogue (ir/ops.h) is ONNX's Conv, then the activation, Add and the
      // residual's activation; the last writes y's name.
      const auto& a = std::get<ConvAttrs>(n.attrs);
      if (a.channel_stats)
        fail(n, "a conv with channel_stats (a training step's form) has no ONNX operator");
      const bool residual = !in(n, 3).empty();
      std::vector<std::string> conv_inputs = ins(n);
      if (conv_inputs.size() > 3) conv_inputs.resize(3);
      while (!conv_inputs.empty() && conv_inputs.back().empty()) conv_inputs.pop_back();
      const std::string y = out(n, 0);
      const DType dt = in_type(n, 0).dtype;
      std::string last = (a.activation || residual) ? fresh(n.name + "/conv") : y;
      NodeProto* p = add("Conv", n.name, conv_inputs, {last});
      export_conv_attrs(p, a, in_type(n, 1).shape);
      if (a.activation) {
        const std::string activated = residual ? fresh(n.name + "/activated") : y;
        export_activation(n, a.activation, last, activated, dt);
        last = activated;
      }
      if (residual) {
        const std::string sum = a.residual_activation ? fresh(n.name + "/residual_sum") : y;
        add("Add", fresh_node(n.name + "/residual_add"), {last, in(n, 3)}, {sum});
        if (a.residual_activation) export_activation(n, a.residual_activation, sum, y, dt);
      }
      return;
    }
    case OpKind::conv_backward_data: {
      // ConvTranspose's output extent is stride*(O-1) + output_padding + dil*(R-1) + 1
      // - pads; output_padding makes up the difference to our D (always < stride).
      const auto& a = std::get<ConvBackwardDataAttrs>(n.attrs);
      const Shape& dy = in_type(n, 0).shape;
      const Shape& w = in_type(n, 1).shape;
      std::vector<int64_t> output_padding;
      for (size_t d = 0; d < a.input_spatial.size(); ++d) {
        const int64_t natural = a.conv.strides[d] * (dy[d + 2] - 1) - a.conv.pads_begin[d] -
                                a.conv.pads_end[d] + a.conv.dilations[d] * (w[d + 2] - 1) + 1;
        output_padding.push_back(a.input_spatial[d] - natural);
      }
      NodeProto* p = add("ConvTranspose", n.name, ins(n), outs(n));
      export_conv_attrs(p, a.conv, w);
      set_ints(p, "output_padding", output_padding);
      return;
    }
    case OpKind::conv_backward_filter:
      fail(n, "conv_backward_filter has no ONNX operator (ONNX graphs hold no gradients)");
    case OpKind::batch_norm: {
      const auto& a = std::get<BatchNormAttrs>(n.attrs);
      if (a.sync)
        fail(n, "a synchronized batch_norm (statistics over every rank) has no ONNX operator");
      std::vector<std::string> o{out(n, 0)};
      if (a.training) {
        // ONNX's training form has no saved statistics: they must be unused.
        for (size_t i = 3; i < n.outputs.size(); ++i) {
          if (output_used(n, i))
            fail(n, cat("batch_norm training output ", i, " ('", out(n, i),
                        "', a saved statistic) is used, but ONNX BatchNormalization has no "
                        "such output"));
        }
        o = {out(n, 0), out(n, 1), out(n, 2)};
      }
      // A fused residual and relu (passes/fusion.h) are ONNX's BatchNormalization, then Add,
      // then Relu; the last writes y's name.
      const bool residual = n.inputs.size() > 5 && n.inputs[5] != kNoValue;
      std::vector<std::string> bn_inputs = ins(n);
      bn_inputs.resize(5);  // batch_stats (input 6): the statistics ONNX computes from x
      const std::string y = out(n, 0);
      if (residual || a.relu) o[0] = fresh(n.name + "/normalised");
      NodeProto* p = add("BatchNormalization", n.name, bn_inputs, o);
      set_float(p, "epsilon", a.epsilon);
      set_float(p, "momentum", a.momentum);
      if (a.training) set_int(p, "training_mode", 1);
      std::string last = o[0];
      if (residual) {
        const std::string sum = a.relu ? fresh(n.name + "/residual_sum") : y;
        add("Add", fresh_node(n.name + "/residual_add"), {last, in(n, 5)}, {sum});
        last = sum;
      }
      if (a.relu) add("Relu", fresh_node(n.name + "/relu"), {last}, {y});
      return;
    }
    case OpKind::layer_norm: {
      const auto& a = std::get<NormAttrs>(n.attrs);
      if (a.y_dtype || (n.inputs.size() > 1 && n.inputs[1] != kNoValue &&
                        in_type(n, 1).dtype != in_type(n, 0).dtype))
        fail(n,
             "the mixed-dtype form (fold_norm_casts: an inference graph after its passes) "
             "has no ONNX node; export the graph before compiling it");
      std::vector<std::string> i = {in(n, 0), in(n, 1), in(n, 2)};
      if (i[1].empty()) {  // ONNX requires Scale
        const Shape& x = in_type(n, 0).shape;
        i[1] = initializer(
            n, "scale", Tensor::full(in_type(n, 0).dtype, Shape(x.begin() + a.axis, x.end()), 1.0));
      }
      if (i[2].empty()) i.pop_back();
      NodeProto* p = add("LayerNormalization", n.name, i, outs(n));
      set_int(p, "axis", a.axis);
      set_float(p, "epsilon", a.epsilon);
      set_int(p, "stash_type", 1);
      return;
    }
    case OpKind::rms_norm:
      return export_rms_norm(n);
    case OpKind::leaky_relu: {
      NodeProto* p = add("LeakyRelu", n.name, ins(n), outs(n));
      set_float(p, "alpha", std::get<LeakyReluAttrs>(n.attrs).alpha);
      return;
    }
    case OpKind::gelu:
      return export_gelu(n);
    case OpKind::silu: {  // x * sigmoid(x)
      std::string s = step(n, "Sigmoid", "sigmoid", {in(n, 0)});
      add("Mul", n.name, {in(n, 0), s}, outs(n));
      return;
    }
    case OpKind::rsqrt: {  // 1 / sqrt(x)
      std::string s = step(n, "Sqrt", "sqrt", {in(n, 0)});
      add("Reciprocal", n.name, {s}, outs(n));
      return;
    }
    case OpKind::clip: {
      const auto& a = std::get<ClipAttrs>(n.attrs);
      const DType dt = in_type(n, 0).dtype;
      std::vector<std::string> i{in(n, 0), "", ""};
      if (!std::isinf(a.min)) i[1] = scalar_initializer(n, "min", dt, a.min);
      if (!std::isinf(a.max)) i[2] = scalar_initializer(n, "max", dt, a.max);
      while (i.back().empty()) i.pop_back();
      add("Clip", n.name, i, outs(n));
      return;
    }
    case OpKind::gemm: {
      // A fused activation (ir/ops.h GemmAttrs) is ONNX's Gemm, then the activation.
      const auto& a = std::get<GemmAttrs>(n.attrs);
      if (a.y_dtype && *a.y_dtype != in_type(n, 0).dtype)
        fail(n,
             "the mixed-dtype form (fold_product_casts: an inference graph after its passes) "
             "has no ONNX node; export the graph before compiling it");
      const std::string product = a.activation ? fresh(n.name + "/gemm") : out(n, 0);
      NodeProto* p = add("Gemm", n.name, ins(n), {product});
      set_float(p, "alpha", a.alpha);
      set_float(p, "beta", a.beta);
      set_int(p, "transA", a.trans_a);
      set_int(p, "transB", a.trans_b);
      if (a.activation) export_activation(n, a.activation, product, out(n, 0), in_type(n, 0).dtype);
      return;
    }
    case OpKind::reduce_sum: {
      const auto& a = std::get<ReduceAttrs>(n.attrs);
      NodeProto* p =
          add("ReduceSum", n.name, {in(n, 0), ints_initializer(n, "axes", a.axes)}, outs(n));
      set_int(p, "keepdims", a.keepdims);
      return;
    }
    case OpKind::reduce_mean:
    case OpKind::reduce_max: {
      const auto& a = std::get<ReduceAttrs>(n.attrs);
      NodeProto* p =
          add(n.op == OpKind::reduce_mean ? "ReduceMean" : "ReduceMax", n.name, ins(n), outs(n));
      set_ints(p, "axes", a.axes);
      set_int(p, "keepdims", a.keepdims);
      return;
    }
    case OpKind::arg_max:
    case OpKind::arg_min: {
      const auto& a = std::get<ArgReduceAttrs>(n.attrs);
      NodeProto* p = add(n.op == OpKind::arg_max ? "ArgMax" : "ArgMin", n.name, ins(n), outs(n));
      set_int(p, "axis", a.axis);
      set_int(p, "keepdims", a.keepdims);
      set_int(p, "select_last_index", a.select_last_index);
      return;
    }
    case OpKind::top_k: {
      const auto& a = std::get<TopKAttrs>(n.attrs);
      NodeProto* p = add("TopK", n.name, {in(n, 0), ints_initializer(n, "k", {a.k})}, outs(n));
      set_int(p, "axis", a.axis);
      set_int(p, "largest", a.largest);
      set_int(p, "sorted", a.sorted);
      return;
    }
    case OpKind::softmax:
    case OpKind::log_softmax: {
      NodeProto* p =
          add(n.op == OpKind::softmax ? "Softmax" : "LogSoftmax", n.name, ins(n), outs(n));
      set_int(p, "axis", std::get<SoftmaxAttrs>(n.attrs).axis);
      return;
    }
    case OpKind::max_pool:
    case OpKind::avg_pool: {
      const auto& a = std::get<PoolAttrs>(n.attrs);
      const bool max = n.op == OpKind::max_pool;
      NodeProto* p = add(max ? "MaxPool" : "AveragePool", n.name, ins(n), outs(n));
      set_ints(p, "kernel_shape", a.kernel);
      set_ints(p, "strides", a.strides);
      set_ints(p, "pads", joined(a.pads_begin, a.pads_end));
      set_int(p, "ceil_mode", a.ceil_mode);
      if (max) set_ints(p, "dilations", a.dilations);
      if (!max) set_int(p, "count_include_pad", a.count_include_pad);
      return;
    }
    case OpKind::reshape: {
      const auto& a = std::get<ReshapeAttrs>(n.attrs);
      NodeProto* p =
          add("Reshape", n.name, {in(n, 0), ints_initializer(n, "shape", a.shape)}, outs(n));
      // The shape holds final extents; a 0 among them means 0, not "copy".
      for (int64_t d : a.shape)
        if (d == 0) return set_int(p, "allowzero", 1);
      return;
    }
    case OpKind::expand: {  // the IR's shape is the final one: Expand's broadcast gives it back
      const auto& a = std::get<ExpandAttrs>(n.attrs);
      add("Expand", n.name, {in(n, 0), ints_initializer(n, "shape", a.shape)}, outs(n));
      return;
    }
    case OpKind::gather:
    case OpKind::gather_elements: {
      NodeProto* p =
          add(n.op == OpKind::gather ? "Gather" : "GatherElements", n.name, ins(n), outs(n));
      set_int(p, "axis", std::get<GatherAttrs>(n.attrs).axis);
      return;
    }
    case OpKind::cumsum: {
      const auto& a = std::get<CumSumAttrs>(n.attrs);
      NodeProto* p = add(
          "CumSum", n.name,
          {in(n, 0), initializer(n, "axis", Tensor::from_vector<int64_t>({}, {a.axis}))}, outs(n));
      if (a.exclusive) set_int(p, "exclusive", 1);
      if (a.reverse) set_int(p, "reverse", 1);
      return;
    }
    case OpKind::resize: {
      // Resize-13: sizes where the scales are out / in, else the scales themselves (which
      // the coordinate mappings read) as f32, each nudged up by an ulp or two where the
      // rounded value would floor to one element fewer (1.8f * 5 = 8.99999976).
      const auto& a = std::get<ResizeAttrs>(n.attrs);
      const Shape& x = in_type(n, 0).shape;
      if (a.coordinates == ResizeCoordinates::half_pixel_symmetric ||
          a.coordinates == ResizeCoordinates::tf_half_pixel_for_nn)
        fail(n, cat("coordinate mode ", resize_coordinates_name(a.coordinates),
                    " has no Resize of opset 17 (the exporter's)"));
      bool ratios = true;
      std::vector<float> scales;
      for (size_t d = 0; d < x.size(); ++d) {
        ratios = ratios && x[d] > 0 && a.scales[d] == double(a.sizes[d]) / double(x[d]);
        scales.push_back(float(a.scales[d]));
      }
      for (size_t d = 0; d < x.size() && !ratios; ++d) {
        for (int ulp = 0;
             ulp < 4 && std::floor(double(scales[d]) * double(x[d])) < double(a.sizes[d]); ++ulp)
          scales[d] = std::nextafter(scales[d], std::numeric_limits<float>::infinity());
        if (std::floor(double(scales[d]) * double(x[d])) != double(a.sizes[d]))
          fail(n, cat("scale ", a.scales[d], " of dim ", d, " does not give ", a.sizes[d],
                      " elements as an f32 ONNX scale"));
      }
      std::vector<float> roi(a.roi_start.begin(), a.roi_start.end());
      roi.insert(roi.end(), a.roi_end.begin(), a.roi_end.end());
      std::vector<std::string> i{in(n, 0)};
      i.push_back(
          a.coordinates == ResizeCoordinates::tf_crop_and_resize
              ? initializer(n, "roi", Tensor::from_vector<float>({int64_t(roi.size())}, roi))
              : "");
      if (ratios) {
        i.push_back("");
        i.push_back(ints_initializer(n, "sizes", a.sizes));
      } else {
        i.push_back(
            initializer(n, "scales", Tensor::from_vector<float>({int64_t(scales.size())}, scales)));
      }
      NodeProto* p = add("Resize", n.name, i, outs(n));
      set_string(p, "mode", resize_mode_name(a.mode));
      set_string(p, "coordinate_transformation_mode", resize_coordinates_name(a.coordinates));
      set_string(p, "nearest_mode", resize_nearest_name(a.nearest));
      set_float(p, "cubic_coeff_a", a.cubic_a);
      if (a.exclude_outside) set_int(p, "exclude_outside", 1);
      if (a.extrapolation_value != 0) set_float(p, "extrapolation_value", a.extrapolation_value);
      return;
    }
    case OpKind::flatten: {
      NodeProto* p = add("Flatten", n.name, ins(n), outs(n));
      set_int(p, "axis", std::get<FlattenAttrs>(n.attrs).axis);
      return;
    }
    case OpKind::transpose: {
      NodeProto* p = add("Transpose", n.name, ins(n), outs(n));
      set_ints(p, "perm", std::get<TransposeAttrs>(n.attrs).perm);
      return;
    }
    case OpKind::concat: {
      NodeProto* p = add("Concat", n.name, ins(n), outs(n));
      set_int(p, "axis", std::get<ConcatAttrs>(n.attrs).axis);
      return;
    }
    case OpKind::slice: {
      // Normalised ends use -1 for "before index 0" with a negative step; in ONNX -1
      // means the last index, so that end is written as INT64_MIN (clamped to -1).
      SliceAttrs a = std::get<SliceAttrs>(n.attrs);
      for (size_t i = 0; i < a.ends.size(); ++i)
        if (a.steps[i] < 0 && a.ends[i] < 0) a.ends[i] = std::numeric_limits<int64_t>::min();
      add("Slice", n.name,
          {in(n, 0), ints_initializer(n, "starts", a.starts), ints_initializer(n, "ends", a.ends),
           ints_initializer(n, "axes", a.axes), ints_initializer(n, "steps", a.steps)},
          outs(n));
      return;
    }
    case OpKind::pad: {
      const auto& a = std::get<PadAttrs>(n.attrs);
      std::vector<std::string> i{in(n, 0), ints_initializer(n, "pads", a.pads)};
      if (a.mode == PadMode::constant)
        i.push_back(scalar_initializer(n, "value", in_type(n, 0).dtype, a.value));
      NodeProto* p = add("Pad", n.name, i, outs(n));
      set_string(p, "mode",
                 a.mode == PadMode::constant  ? "constant"
                 : a.mode == PadMode::reflect ? "reflect"
                                              : "edge");
      return;
    }
    case OpKind::squeeze:
    case OpKind::unsqueeze: {
      const auto& a = std::get<AxesAttrs>(n.attrs);
      add(n.op == OpKind::squeeze ? "Squeeze" : "Unsqueeze", n.name,
          {in(n, 0), ints_initializer(n, "axes", a.axes)}, outs(n));
      return;
    }
    case OpKind::cast: {
      NodeProto* p = add("Cast", n.name, ins(n), outs(n));
      set_int(p, "to", dtype_to_onnx(std::get<CastAttrs>(n.attrs).to));
      return;
    }
    case OpKind::constant: {
      NodeProto* p = add("Constant", n.name, {}, outs(n));
      AttributeProto* a = p->add_attribute();
      a->set_name("value");
      a->set_type(AttributeProto::TENSOR);
      tensor_to_proto(std::get<ConstantAttrs>(n.attrs).value, "", a->mutable_t());
      return;
    }
    case OpKind::cross_entropy: {
      const auto& a = std::get<CrossEntropyAttrs>(n.attrs);
      if (a.lse_stash)
        fail(n, "the lse_stash form of cross_entropy (a training step's) has no ONNX equivalent");
      NodeProto* p = add("SoftmaxCrossEntropyLoss", n.name, ins(n), outs(n));
      set_string(p, "reduction",
                 a.reduction == Reduction::mean  ? "mean"
                 : a.reduction == Reduction::sum ? "sum"
                                                 : "none");
      if (a.ignore_index) set_int(p, "ignore_index", *a.ignore_index);
      return;
    }
    default:
      break;
  }
  fail(n, cat("no ONNX export for op ", op_name(n.op)));
}

// rms_norm(x, scale?) over dims [axis, rank), computed in the statistics dtype
// (f32, or f64 for f64 x) as our kernel does:
//   inv_rms = 1 / sqrt(mean(x*x) + eps),  y = cast(x * inv_rms * scale).
void Exporter::export_rms_norm(const Node& n) {
  const auto& a = std::get<NormAttrs>(n.attrs);
  const TensorType& x = in_type(n, 0);
  if (a.y_dtype ||
      (n.inputs.size() > 1 && n.inputs[1] != kNoValue && in_type(n, 1).dtype != x.dtype))
    fail(n,
         "the mixed-dtype form (fold_norm_casts: an inference graph after its passes) "
         "has no ONNX node; export the graph before compiling it");
  const DType stats = g_.value(n.outputs.at(1)).type.dtype;
  auto to_stats = [&](const std::string& v, const std::string& what) {
    if (x.dtype == stats) return v;
    NodeProto* p;
    std::string c = step(n, "Cast", what, {v}, &p);
    set_int(p, "to", dtype_to_onnx(stats));
    return c;
  };
  std::string xs = to_stats(in(n, 0), "x_stats");
  std::string sq = step(n, "Mul", "square", {xs, xs});
  NodeProto* mean_node;
  std::vector<int64_t> axes;
  for (int64_t d = a.axis; d < int64_t(x.shape.size()); ++d) axes.push_back(d);
  std::string ms = step(n, "ReduceMean", "mean_square", {sq}, &mean_node);
  set_ints(mean_node, "axes", axes);
  set_int(mean_node, "keepdims", 1);
  std::string ve = step(n, "Add", "plus_eps", {ms, scalar_initializer(n, "eps", stats, a.epsilon)});
  std::string rt = step(n, "Sqrt", "rms", {ve});
  add("Reciprocal", fresh_node(n.name + "/inv_rms"), {rt}, {out(n, 1)});
  // The last of normalise, scale and cast-back writes y.
  const bool scaled = !in(n, 1).empty(), cast_back = x.dtype != stats;
  auto last_or_step = [&](bool last, const char* op, const char* what,
                          const std::vector<std::string>& inputs) {
    if (!last) return step(n, op, what, inputs);
    add(op, n.name, inputs, {out(n, 0)});
    return out(n, 0);
  };
  std::string y = last_or_step(!scaled && !cast_back, "Mul", "normalised", {xs, out(n, 1)});
  if (scaled) y = last_or_step(!cast_back, "Mul", "scaled", {y, to_stats(in(n, 1), "scale_stats")});
  if (cast_back) {
    NodeProto* p = add("Cast", n.name, {y}, {out(n, 0)});
    set_int(p, "to", dtype_to_onnx(x.dtype));
  }
}

// gelu, exact:  0.5 * x * (1 + erf(x / sqrt(2)))
//       tanh:   0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
void Exporter::export_gelu(const Node& n) {
  export_gelu_of(n, in(n, 0), out(n, 0), in_type(n, 0).dtype,
                 std::get<GeluAttrs>(n.attrs).tanh_approximation, n.name);
}

void Exporter::export_gelu_of(const Node& n, const std::string& x, const std::string& y, DType dt,
                              bool tanh_approximation, const std::string& node_name) {
  const std::string one = scalar_initializer(n, "one", dt, 1.0);
  const std::string half = scalar_initializer(n, "half", dt, 0.5);
  std::string inner;
  if (tanh_approximation) {
    std::string x2 = step(n, "Mul", "x2", {x, x});
    std::string x3 = step(n, "Mul", "x3", {x2, x});
    std::string cx3 = step(n, "Mul", "cx3", {x3, scalar_initializer(n, "c", dt, 0.044715)});
    std::string sum = step(n, "Add", "poly", {x, cx3});
    std::string arg = step(
        n, "Mul", "arg", {sum, scalar_initializer(n, "k", dt, std::sqrt(2.0 / std::numbers::pi))});
    inner = step(n, "Tanh", "tanh", {arg});
  } else {
    std::string arg =
        step(n, "Mul", "arg", {x, scalar_initializer(n, "k", dt, 1.0 / std::numbers::sqrt2)});
    inner = step(n, "Erf", "erf", {arg});
  }
  std::string onep = step(n, "Add", "one_plus", {inner, one});
  std::string xm = step(n, "Mul", "x_times", {x, onep});
  add("Mul", node_name, {xm, half}, {y});
}

void Exporter::export_activation(const Node& n, const FusedActivation& a, const std::string& x,
                                 const std::string& y, DType dt) {
  const std::string name = fresh_node(cat(n.name, "/", activation_name(a.kind)));
  switch (a.kind) {
    case Activation::none:
      add("Identity", name, {x}, {y});
      return;
    case Activation::relu:
      add("Relu", name, {x}, {y});
      return;
    case Activation::gelu:
    case Activation::gelu_tanh:
      return export_gelu_of(n, x, y, dt, a.kind == Activation::gelu_tanh, name);
    case Activation::silu:
      add("Mul", name, {x, step(n, "Sigmoid", "sigmoid", {x})}, {y});
      return;
    case Activation::sigmoid:
      add("Sigmoid", name, {x}, {y});
      return;
    case Activation::tanh:
      add("Tanh", name, {x}, {y});
      return;
    case Activation::clip:
      add("Clip", name,
          {x, scalar_initializer(n, "clip_min", dt, a.min),
           scalar_initializer(n, "clip_max", dt, a.max)},
          {y});
      return;
  }
}

}  // namespace

std::string export_onnx_bytes(const Graph& g) {
  onnx::ModelProto model = Exporter(g).run();
  std::string bytes;
  FUSEBOX_CHECK(model.SerializeToString(&bytes), "onnx export: graph " + g.name(),
                "protobuf serialisation failed (is the model over 2 GiB?)");
  return bytes;
}

void export_onnx_file(const Graph& g, const std::string& path) {
  write_file_atomic(path, export_onnx_bytes(g));
}

}  // namespace fusebox
