// ONNX ModelProto -> fusebox::Graph.
//
// 1. Parse and validate the model: a graph, an opset of the default domain in 11..22.
// 2. Initializers become known tensors; graph inputs become graph inputs (shapes made
//    concrete through OnnxImportOptions::input_shapes) or, when frozen through
//    OnnxImportOptions::constant_inputs or also listed as initializers, known tensors.
// 3. Nodes in file order: a node whose inputs are all known is folded (evaluated on the
//    CPU backend at import, see const_fold.cpp); any other node is imported by its
//    op's importer (import_ops_*.cpp), which emits fusebox nodes. Known tensors enter
//    the graph as constants only when a node reads them, so a shape computation that
//    folds away leaves nothing behind.
// 4. Graph outputs are marked by their ONNX names.
//
// Every value keeps its ONNX name; every error is an Error whose `where` is
// "onnx import: <file>" and whose message names the node, its op_type and the
// attribute or input at fault. Things we do not support start with "unsupported: ".
#include <filesystem>
#include <map>
#include <set>

#include "frontends/onnx/import_context.h"
#include "fusebox/core/compile_trace.h"
#include "fusebox/core/memory.h"
#include "fusebox/frontends/onnx.h"
#include "fusebox/io/tensor_file.h"
#include "io/bytes.h"
#include "io/tensor_proto.h"

namespace fusebox {

namespace onnx_import {
namespace {

constexpr int kMinOpset = 11;
// Opsets 18-22 changed, of the ops imported: the Reduce ops (axes an input, 18), Split
// (num_outputs, 18), Pad (axes input, 18; wrap, 19), Resize (axes, keep_aspect_ratio_policy,
// antialias, 18; half_pixel_symmetric, 19), AveragePool (dilations, 19), GroupNormalization
// (new in 18; per-channel scale and bias, 21), Gelu (new, 20), Cast (saturate, 19: float8
// only); every other change added element types. PyTorch's torch.export-based exporter (the
// default of torch.onnx.export since 2.9) writes opset 20.
constexpr int kMaxOpset = 22;

// Opsets before 11: a model of one imports only the ops whose import (written for opsets
// 11-17) is exact from `since` on: their inputs, outputs and attributes have not changed
// since then in ONNX's operator changelog (6 dropped the legacy consumed_inputs attribute;
// 7 brought numpy broadcasting to the arithmetic ops; later versions only added types).
// Any other op in such a model is refused by name.
struct LegacyOp {
  const char* op_type;
  int since;
};
constexpr LegacyOp kLegacyOps[] = {
    {"Abs", 6},
    {"Floor", 6},
    {"Ceil", 6},
    {"Neg", 6},
    {"Sqrt", 6},
    {"Reciprocal", 6},
    {"Exp", 6},
    {"Log", 6},
    {"Relu", 6},
    {"Sigmoid", 6},
    {"Tanh", 6},
    {"Elu", 6},
    {"HardSigmoid", 6},
    {"Softplus", 1},
    {"Sin", 7},
    {"Cos", 7},
    {"Add", 7},
    {"Sub", 7},
    {"Mul", 7},
    {"Div", 7},
    {"MatMul", 1},
    {"Identity", 1},
    {"Transpose", 1},
    {"GlobalAveragePool", 1},
    {"GlobalMaxPool", 1},
    {"InstanceNormalization", 6},
    // Logic ops: And/Or/Xor unchanged since 7 (numpy broadcasting), Not since 1;
    // ConstantOfShape since 9 (20 only added types).
    {"And", 7},
    {"Or", 7},
    {"Xor", 7},
    {"Not", 1},
    {"ConstantOfShape", 9},
    // Axes an attribute until 13 (ReduceSum) or 18 (the others), read as such before 13; 11
    // only added negative axes.
    {"ReduceSum", 1},
    {"ReduceMean", 1},
    {"ReduceMax", 1},
    {"ReduceMin", 1},
    {"ReduceSumSquare", 1},
    {"ReduceL1", 1},
    {"ReduceL2", 1},
    {"ReduceLogSum", 1},
    {"ReduceLogSumExp", 1},
    // TopK: k an attribute until 10 (read as such before 10); 11 added largest and sorted,
    // whose defaults are the older behaviour.
    {"TopK", 1},
};

// The opset from which `op_type` imports (kMinOpset unless kLegacyOps names it).
int oldest_opset(const std::string& op_type) {
  for (const LegacyOp& l : kLegacyOps)
    if (op_type == l.op_type) return l.since;
  return kMinOpset;
}

bool is_default_domain(const std::string& d) {
  return d.empty() || d == "ai.onnx";
}

// Where an ONNX value lives.
struct Binding {
  TensorType type;
  Tensor constant;        // defined: known at import
  ValueId id = kNoValue;  // the graph value (for a known tensor: once a node reads it)
  std::string origin;     // for messages: "graph input", "initializer", "node 'n' (Op)"
};

constexpr const char* kInitializer = "an initializer";

class Loader {
 public:
  // The model's initializers' raw bytes become the graph's constants (taken, not copied).
  Loader(onnx::ModelProto& model, std::string where, std::string base_dir,
         const OnnxImportOptions& opts)
      : model_(model),
        where_(std::move(where)),
        base_dir_(std::move(base_dir)),
        opts_(opts),
        graph_(model.graph().name().empty() ? "onnx_model" : model.graph().name()) {}

  Graph run() {
    check_model();
    collect_names();
    {
      const TracePhase trace("onnx import: initializers");
      load_initializers();
    }
    load_inputs();
    const onnx::GraphProto& g = model_.graph();
    for (int i = 0; i < g.node_size(); ++i) {
      const TracePhase trace("onnx import: node ", g.node(i).op_type().c_str());
      import_node(i, g.node(i));
    }
    mark_outputs();
    graph_.verify();
    return std::move(graph_);
  }

 private:
  [[noreturn]] void fail(const std::string& message) const { throw Error(where_, message); }
  template <class... Parts>
  void check(bool cond, Parts&&... parts) const {
    if (!cond) fail(cat(std::forward<Parts>(parts)...));
  }

  void check_model() {
    check(model_.has_graph(), "the model has no graph");
    const onnx::OperatorSetIdProto* def = nullptr;
    for (const auto& o : model_.opset_import()) {
      if (!is_default_domain(o.domain())) continue;
      check(def == nullptr || def->version() == o.version(),
            "the model imports two versions of the default domain (", def ? def->version() : 0,
            " and ", o.version(), ")");
      def = &o;
    }
    if (def == nullptr) {
      std::string others;
      for (const auto& o : model_.opset_import())
        others += cat(others.empty() ? "" : ", ", o.domain(), " ", o.version());
      check(others.empty(), "unsupported: the model imports only other domains (", others,
            "), no opset of the default domain ai.onnx");
      fail("the model imports no opset of the default domain (ai.onnx)");
    }
    check(def->version() >= 1 && def->version() <= kMaxOpset, "unsupported: opset ", def->version(),
          " of the default domain ai.onnx (fusebox imports opsets ", kMinOpset, "-", kMaxOpset,
          ", and a few ops from older ones)");
    opset_ = int(def->version());
    if (model_.graph().sparse_initializer_size() > 0)
      fail(cat("unsupported: sparse initializers (sparse tensor '",
               model_.graph().sparse_initializer(0).values().name(), "')"));
  }

  // Every name the model gives a value: internal helper values must avoid them.
  void collect_names() {
    const onnx::GraphProto& g = model_.graph();
    for (const auto& v : g.input()) reserved_.insert(v.name());
    for (const auto& v : g.output()) reserved_.insert(v.name());
    for (const auto& t : g.initializer()) reserved_.insert(t.name());
    for (const auto& n : g.node()) {
      for (const auto& s : n.input()) reserved_.insert(s);
      for (const auto& s : n.output()) reserved_.insert(s);
      read_.insert(n.input().begin(), n.input().end());
    }
    for (const auto& v : g.output()) read_.insert(v.name());
  }

  void load_initializers() {
    for (onnx::TensorProto& p : *model_.mutable_graph()->mutable_initializer()) {
      check(!p.name().empty(), "an initializer has no name");
      check(!values_.count(p.name()), "initializer '", p.name(), "' is defined twice");
      DType dt;
      check(dtype_from_onnx(p.data_type(), &dt), "unsupported: initializer '", p.name(),
            "' has element type ", onnx_type_name(p.data_type()));
      check(p.data_location() != onnx::TensorProto::EXTERNAL || !base_dir_.empty(), "initializer '",
            p.name(),
            "' is stored as external data, which needs the model's file (use import_onnx_file)");
      Tensor t = take_tensor_from_proto(p, where_, base_dir_);
      values_[p.name()] = Binding{{t.dtype(), t.shape()}, t, kNoValue, kInitializer};
    }
  }

  // How each front end gives an input's shape, for the errors that ask for one.
  static constexpr const char* kGiveShape =
      " (the CLI's --shape NAME=D0,D1,...; OnnxImportOptions::input_shapes in C++)";

  // The input's declared type, with unknown extents taken from opts.input_shapes.
  TensorType input_type(const onnx::ValueInfoProto& v) const {
    const std::string& name = v.name();
    check(v.type().has_tensor_type(), "unsupported: graph input '", name,
          "' is not a tensor (sequence, map and optional inputs are not supported)");
    const onnx::TypeProto::Tensor& tt = v.type().tensor_type();
    TensorType type;
    check(tt.elem_type() != 0, "graph input '", name, "' has no element type");
    check(dtype_from_onnx(tt.elem_type(), &type.dtype), "unsupported: graph input '", name,
          "' has element type ", onnx_type_name(tt.elem_type()));
    auto given = opts_.input_shapes.find(name);
    if (!tt.has_shape()) {
      check(given != opts_.input_shapes.end(), "graph input '", name, "' has no shape; give one",
            kGiveShape);
      type.shape = given->second;
    } else {
      const auto& dims = tt.shape().dim();
      if (given != opts_.input_shapes.end()) {
        check(int(given->second.size()) == dims.size(), "input_shapes gives '", name, "' ",
              shape_str(given->second), " but the model declares rank ", dims.size());
      }
      for (int d = 0; d < dims.size(); ++d) {
        const auto& dim = dims[d];
        if (dim.has_dim_value()) {
          check(dim.dim_value() >= 0, "graph input '", name, "' has a negative extent ",
                dim.dim_value(), " at dim ", d);
          if (given != opts_.input_shapes.end()) {
            check(given->second[size_t(d)] == dim.dim_value(), "input_shapes gives '", name, "' ",
                  shape_str(given->second), " but the model fixes dim ", d, " to ",
                  dim.dim_value());
          }
          type.shape.push_back(dim.dim_value());
          continue;
        }
        if (given == opts_.input_shapes.end() && d == 0 && opts_.batch) {
          type.shape.push_back(*opts_.batch);
          continue;
        }
        std::string what = dim.has_dim_param() ? cat("symbolic dim '", dim.dim_param(), "'")
                                               : std::string("an unknown extent");
        check(given != opts_.input_shapes.end(), "graph input '", name, "' has ", what, " at dim ",
              d, "; give a concrete shape", kGiveShape);
        type.shape.push_back(given->second[size_t(d)]);
      }
    }
    for (int64_t e : type.shape)
      check(e >= 0, "graph input '", name, "' has a negative extent in ", shape_str(type.shape));
    check(checked_tensor_size(type.shape, dtype_size(type.dtype)).has_value(), "graph input '",
          name, "' has the shape ", shape_str(type.shape), ", more than the ",
          format_bytes(kMaxTensorBytes), " one tensor may hold");
    return type;
  }

  void load_inputs() {
    std::set<std::string> inputs;
    for (const onnx::ValueInfoProto& v : model_.graph().input()) {
      const std::string& name = v.name();
      check(!name.empty(), "a graph input has no name");
      check(inputs.insert(name).second, "graph input '", name, "' is listed twice");
      auto frozen = opts_.constant_inputs.find(name);
      if (frozen != opts_.constant_inputs.end()) {
        const Tensor& t = frozen->second;
        check(t.defined(), "constant_inputs gives no data for '", name, "'");
        if (v.type().has_tensor_type() && v.type().tensor_type().elem_type() != 0) {
          int declared = v.type().tensor_type().elem_type();
          check(declared == dtype_to_onnx(t.dtype()), "constant_inputs gives '", name, "' as ",
                dtype_name(t.dtype()), " but the model declares ", onnx_type_name(declared));
          const auto& tt = v.type().tensor_type();
          if (tt.has_shape()) {
            bool ok = tt.shape().dim_size() == int(t.rank());
            for (int d = 0; ok && d < tt.shape().dim_size(); ++d)
              if (tt.shape().dim(d).has_dim_value())
                ok = tt.shape().dim(d).dim_value() == t.shape()[size_t(d)];
            check(ok, "constant_inputs gives '", name, "' the shape ", shape_str(t.shape()),
                  ", which the model's declared shape does not allow");
          }
        }
        values_[name] = Binding{{t.dtype(), t.shape()}, t, kNoValue, "a frozen graph input"};
        continue;
      }
      if (values_.count(name)) continue;  // also an initializer (IR < 4 style): a constant
      TensorType type = input_type(v);
      ValueId id = graph_.add_input(name, type.dtype, type.shape);
      values_[name] = Binding{type, Tensor(), id, "a graph input"};
    }
    for (const auto& [name, shape] : opts_.input_shapes)
      check(inputs.count(name), "input_shapes names '", name, "', which is not a graph input");
    for (const auto& [name, t] : opts_.constant_inputs)
      check(inputs.count(name), "constant_inputs names '", name, "', which is not a graph input");
  }

  ValueId materialize(const std::string& name) {
    Binding& b = values_.at(name);
    if (b.id == kNoValue) b.id = graph_.add_constant(name, b.constant);
    return b.id;
  }

  // Whether `node` is a layout or dtype transform of a float initializer
  // (OnnxImportOptions::keep_parameter_transforms).
  bool transforms_parameter(const onnx::NodeProto& node) const {
    static const std::set<std::string> transforms = {"Transpose", "Reshape",   "Flatten",
                                                     "Squeeze",   "Unsqueeze", "Cast",
                                                     "Identity",  "Gather",    "Slice"};
    if (!node.domain().empty() || !transforms.count(node.op_type()) || node.input_size() == 0)
      return false;
    const auto it = values_.find(node.input(0));
    return it != values_.end() && it->second.origin == kInitializer &&
           is_floating(it->second.type.dtype) && it->second.constant.numel() > 1;
  }

  std::string fresh_name(const std::string& base) const {
    for (int k = 1;; ++k) {
      std::string c = cat(base, "_", k);
      if (!reserved_.count(c) && !graph_.find_value(c)) return c;
    }
  }

  // Counts the node in the report, as folded when every output it bound is a known tensor.
  void count_node(const onnx::NodeProto& node) {
    if (opts_.report == nullptr) return;
    ++opts_.report->onnx_nodes;
    for (const std::string& o : node.output()) {
      if (o.empty()) continue;
      auto it = values_.find(o);
      if (it == values_.end() || !it->second.constant.defined()) return;
    }
    ++opts_.report->folded;
    ++opts_.report->folded_by_op[node.op_type()];
  }

  void import_node(int index, const onnx::NodeProto& node) {
    const std::string name = node.name().empty() ? cat(node.op_type(), "_", index) : node.name();
    const std::string desc = cat("node '", name, "' (", node.op_type(), ")");
    try {
      import_node_checked(node, name, desc);
      count_node(node);
    } catch (const Error& e) {
      if (e.where() == where_) throw;
      throw Error(where_, cat(desc, ": ", e.what()));
    } catch (const std::exception& e) {
      throw Error(where_, cat(desc, ": ", e.what()));
    }
  }

  void import_node_checked(const onnx::NodeProto& node, const std::string& name,
                           const std::string& desc) {
    check(is_default_domain(node.domain()), "unsupported: ", desc, ": operator domain '",
          node.domain(), "' (only the default domain ai.onnx is supported)");
    const OpSpec* spec = find_op(node.op_type());
    check(spec != nullptr, "unsupported: ", desc, ": operator '", node.op_type(),
          "' (domain ai.onnx) is not supported");
    // Before opset 11 kLegacyOps decides (the op table's since_opset counts from 11: an op
    // it says was added in 11 may be older, in a form the importer does not read).
    if (opset_ < kMinOpset) {
      check(opset_ >= oldest_opset(node.op_type()), "unsupported: ", desc, ": opset ", opset_,
            " (fusebox imports ", node.op_type(), " from opset ", oldest_opset(node.op_type()),
            "; models before opset ", kMinOpset, " only with ops unchanged since theirs)");
    } else {
      check(opset_ >= spec->since_opset, desc, ": operator '", node.op_type(),
            "' does not exist in opset ", opset_, " (it was added in opset ", spec->since_opset,
            ")");
    }
    const int n_in = node.input_size();
    check(n_in >= spec->min_inputs && n_in <= spec->max_inputs, desc, ": takes ", spec->min_inputs,
          spec->max_inputs == kVariadic ? std::string(" or more") : cat(" to ", spec->max_inputs),
          " inputs, got ", n_in);
    const int n_out = node.output_size();
    check(n_out >= 1 && n_out <= spec->max_outputs, desc, ": has ", n_out,
          " outputs, expected 1 to ", spec->max_outputs);
    check(!node.output(0).empty(), desc, ": output 0 has no name");

    std::set<std::string> outs;
    for (const std::string& o : node.output()) {
      if (o.empty()) continue;
      check(outs.insert(o).second, desc, ": output name '", o, "' is used twice");
      auto it = values_.find(o);
      check(it == values_.end(), desc, ": duplicate output name '", o,
            "': it is already defined by ", it == values_.end() ? "" : it->second.origin);
    }

    std::vector<NodeInput> inputs(static_cast<size_t>(n_in));
    bool all_known = true;
    for (int i = 0; i < n_in; ++i) {
      const std::string& in = node.input(i);
      if (in.empty()) {
        check(i >= spec->min_inputs, desc, ": input ", i, " is required but has no name");
        continue;
      }
      auto it = values_.find(in);
      check(it != values_.end(), desc, ": input ", i, " '", in,
            "' is not a graph input, an initializer or an output of an earlier node");
      NodeInput& ni = inputs[size_t(i)];
      ni.name = in;
      ni.type = it->second.type;
      ni.constant = it->second.constant.defined() ? &it->second.constant : nullptr;
      ni.id = it->second.id;
      all_known = all_known && ni.constant != nullptr;
    }

    if (all_known && opts_.keep_parameter_transforms && transforms_parameter(node))
      all_known = false;
    if (all_known) {
      std::vector<Tensor> known = fold_node(*spec, node, where_, name, opset_, inputs);
      for (int i = 0; i < n_out; ++i) {
        if (node.output(i).empty()) continue;
        const Tensor& t = known[size_t(i)];
        values_[node.output(i)] = Binding{{t.dtype(), t.shape()}, t, kNoValue, desc};
      }
      return;
    }

    const size_t first_new = graph_.values().size();
    NodeContext ctx(
        graph_, node, where_, name, opset_, inputs,
        [this](const NodeInput& in) { return materialize(in.name); }, &read_);
    spec->import(ctx);
    ctx.attrs().finish();

    // Helper values must not take a name that a later ONNX value needs (known tensors
    // that entered the graph during this import carry their own ONNX names).
    for (size_t v = first_new; v < graph_.values().size(); ++v) {
      const std::string& vname = graph_.values()[v].name;
      if (!reserved_.count(vname)) continue;
      auto bound = values_.find(vname);
      if (bound != values_.end() && bound->second.id == ValueId(v)) continue;
      graph_.rename_value(ValueId(v), fresh_name(vname));
    }
    std::set<ValueId> bound;
    for (int i = 0; i < n_out; ++i) {
      if (node.output(i).empty()) continue;
      const NodeOutput& o = ctx.outputs()[size_t(i)];
      if (o.constant.defined()) {
        values_[node.output(i)] =
            Binding{{o.constant.dtype(), o.constant.shape()}, o.constant, kNoValue, desc};
        continue;
      }
      if (o.id == kNoValue && !ctx.wants_output(i)) continue;  // nothing reads it
      check(o.id != kNoValue, desc, ": internal error: output ", i, " was not produced");
      ValueId id = o.id;
      // Each ONNX output is a value of its own: an importer that passes an input
      // through (or binds one value twice) gets an identity node.
      if (size_t(id) < first_new || bound.count(id))
        id = ctx.emit1(OpKind::identity, {}, {id}, cat("out", i));
      bound.insert(id);
      graph_.rename_value(id, node.output(i));
      values_[node.output(i)] = Binding{graph_.value(id).type, Tensor(), id, desc};
    }
  }

  void mark_outputs() {
    const onnx::GraphProto& g = model_.graph();
    check(g.output_size() > 0, "the graph has no outputs");
    std::set<std::string> seen;
    for (const onnx::ValueInfoProto& v : g.output()) {
      check(!v.name().empty(), "a graph output has no name");
      check(seen.insert(v.name()).second, "graph output '", v.name(), "' is listed twice");
      check(values_.count(v.name()), "graph output '", v.name(),
            "' is not produced by any node, initializer or graph input");
      graph_.mark_output(materialize(v.name()));
    }
  }

  onnx::ModelProto& model_;
  std::string where_;
  std::string base_dir_;
  const OnnxImportOptions& opts_;
  Graph graph_;
  int opset_ = 0;
  std::map<std::string, Binding> values_;
  std::set<std::string> reserved_;
  std::set<std::string> read_;  // read by a node or as a graph output
};

onnx::ModelProto parse_model(const std::string& bytes, const std::string& where) {
  FUSEBOX_CHECK(!bytes.empty(), where, "the file is empty (0 bytes): not an ONNX model");
  // protobuf's parser takes an int size; a model this large needs external data anyway.
  FUSEBOX_CHECK(bytes.size() < (size_t(1) << 31), where, "the file is ", bytes.size(),
                " bytes: over protobuf's 2 GiB limit (store the weights as external data)");
  const TracePhase trace("onnx import: protobuf parse");
  onnx::ModelProto model;
  FUSEBOX_CHECK(model.ParseFromString(bytes), where,
                "not a valid ONNX model (protobuf parse failed)");
  return model;
}

Graph import_model(const std::string& bytes, const std::string& label, const std::string& base_dir,
                   const OnnxImportOptions& opts) {
  const std::string where = "onnx import: " + label;
  onnx::ModelProto model = parse_model(bytes, where);
  return Loader(model, where, base_dir, opts).run();
}

std::string read_model_file(const std::string& path) {
  const TracePhase trace("onnx import: read the file");
  try {
    return read_file(path);
  } catch (const Error& e) {
    throw Error("onnx import: " + path, cat("cannot read the model: ", e.what()));
  }
}

}  // namespace
}  // namespace onnx_import

Graph import_onnx_bytes(const std::string& bytes, const std::string& where,
                        const OnnxImportOptions& opts) {
  return onnx_import::import_model(bytes, where, "", opts);
}

Graph import_onnx_file(const std::string& path, const OnnxImportOptions& opts) {
  const TracePhase trace("onnx import");
  const std::string where = "onnx import: " + path;
  std::string bytes = onnx_import::read_model_file(path);
  onnx::ModelProto model = onnx_import::parse_model(bytes, where);
  // The file's bytes go before the graph is built: the parsed model and the graph's constants
  // hold the weights twice already (ViT-B/16's process peaked at three copies of its 330 MB,
  // 1016 MiB, against onnxruntime's 730).
  std::string().swap(bytes);
  std::string dir = std::filesystem::path(path).parent_path().string();
  return onnx_import::Loader(model, where, dir.empty() ? "." : dir, opts).run();
}

std::vector<OnnxInputSpec> onnx_input_specs(const std::string& path) {
  const std::string where = "onnx import: " + path;
  const onnx::ModelProto model =
      onnx_import::parse_model(onnx_import::read_model_file(path), where);
  std::set<std::string> initializers;
  for (const onnx::TensorProto& t : model.graph().initializer()) initializers.insert(t.name());
  std::vector<OnnxInputSpec> specs;
  for (const onnx::ValueInfoProto& v : model.graph().input()) {
    if (initializers.count(v.name())) continue;
    OnnxInputSpec spec;
    spec.name = v.name();
    const onnx::TypeProto::Tensor& tt = v.type().tensor_type();
    FUSEBOX_CHECK(v.type().has_tensor_type() && dtype_from_onnx(tt.elem_type(), &spec.dtype), where,
                  "unsupported: graph input '", v.name(),
                  "' is not a tensor of a supported "
                  "element type");
    spec.has_shape = tt.has_shape();
    for (const auto& dim : tt.shape().dim()) {
      spec.dims.push_back(dim.has_dim_value() ? std::optional<int64_t>(dim.dim_value())
                                              : std::nullopt);
      spec.dim_params.push_back(dim.has_dim_param() ? dim.dim_param() : std::string());
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

bool onnx_error_is_unsupported(const Error& e) {
  const std::string prefix = "[" + e.where() + "] unsupported: ";
  return std::string_view(e.what()).substr(0, prefix.size()) == prefix;
}

}  // namespace fusebox
