// ONNX import (opsets 11-22) and export (opset 17).
//
// Import keeps ONNX value names: graph inputs, graph outputs and node outputs are
// found in the Graph (and in run_graph's results) by their ONNX names; fusebox
// nodes take the ONNX node names ("<op_type>_<index>" for unnamed nodes). Nodes
// whose inputs are all known at import (initializers, Constant nodes, Shape/Size
// of static shapes, ...) are evaluated at import and become constants.
//
// Errors are fusebox::Error with where() == "onnx import: <file>" and a message
// naming the node, its op_type and the attribute or input at fault. Errors about
// something fusebox does not support (an op, an attribute value, a dtype, an opset,
// an input that would have to be known at import) start with "unsupported: ";
// onnx_error_is_unsupported tells them apart from malformed models.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "fusebox/ir/graph.h"

namespace fusebox {

// What an import did with the model's nodes (OnnxImportOptions::report).
struct OnnxImportReport {
  int64_t onnx_nodes = 0;  // nodes in the model's graph
  // Nodes evaluated at import (their outputs are known tensors: inputs all known, or
  // static-shape ops like Shape): none of them reaches the graph. Per op type too.
  int64_t folded = 0;
  std::map<std::string, int64_t> folded_by_op;
};

struct OnnxImportOptions {
  // Graph inputs to freeze to these values at import: for inputs that decide
  // shapes (a Reshape's shape, Slice's starts, ...) when the model feeds them
  // as graph inputs rather than initializers. A frozen input becomes a constant.
  std::map<std::string, Tensor> constant_inputs;
  // Concrete shapes for inputs whose ONNX shape has symbolic or unknown dims.
  std::map<std::string, Shape> input_shapes;
  // The extent of a symbolic or unknown dim 0 (the batch) of an input input_shapes does not
  // give (`fusebox train --batch-size`); nullopt: such a dim needs input_shapes.
  std::optional<int64_t> batch;
  // For training: a Transpose, Reshape, Flatten, Squeeze, Unsqueeze, Cast, Identity, Gather or
  // Slice whose data input is a float initializer stays a node reading that initializer,
  // instead of being evaluated at import into a new constant. Folded, an exporter's transposed
  // Linear weight (PyTorch writes MatMul(x, Transpose(W))) would be trained as a parameter named
  // after the Transpose's output, a position embedding gathered at constant positions as the
  // rows gathered, and a weight read through two paths (GPT-2's embedding and its tied LM head)
  // as two untied parameters; kept, each parameter is its initializer, under its own name.
  bool keep_parameter_transforms = false;
  // When set, filled with what the import folded (`fusebox inspect` prints it).
  OnnxImportReport* report = nullptr;
};

// Errors name the file, the node (name and op_type) and the attribute at fault.
// import_onnx_bytes: `where` names the model in errors ("onnx import: <where>"); tensors
// stored as external data are refused (no directory to resolve them against).
Graph import_onnx_file(const std::string& path, const OnnxImportOptions& opts = {});
Graph import_onnx_bytes(const std::string& bytes, const std::string& where,
                        const OnnxImportOptions& opts = {});

// A graph input as the file declares it, before any import: its dtype and extents, nullopt
// where the file has a symbolic (`dim_params` holds the symbol) or unknown ("") extent, or
// `has_shape` false where it declares no shape at all. Inputs that are initializers too (old
// exporters list them) are not inputs. What a caller needs to pick input_shapes per call:
// the Python package's per-shape executables, `fusebox train --batch-size` on a symbolic
// batch. Errors as import_onnx_file's (the file unreadable, not a model, an unsupported
// element type naming the input).
struct OnnxInputSpec {
  std::string name;
  DType dtype = DType::f32;
  bool has_shape = true;
  std::vector<std::optional<int64_t>> dims;
  std::vector<std::string> dim_params;
};
std::vector<OnnxInputSpec> onnx_input_specs(const std::string& path);

// True when `e` (thrown by an import) is about something fusebox does not support
// rather than about a malformed or inconsistent model.
bool onnx_error_is_unsupported(const Error& e);

// Writes `g` as an ONNX model (opset 17, ir_version 8, producer "fusebox") that any
// ONNX runtime runs: constants become initializers, ops without an ONNX counterpart
// are decomposed (rms_norm, gelu, silu, rsqrt). An op with no ONNX form at all
// (conv_backward_filter, batch_norm training with its saved statistics used) is an
// Error naming the node.
void export_onnx_file(const Graph& g, const std::string& path);
std::string export_onnx_bytes(const Graph& g);

}  // namespace fusebox
