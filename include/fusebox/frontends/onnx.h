// ONNX import (opsets 11-17) and export.
#pragma once

#include <map>
#include <string>

#include "fusebox/ir/graph.h"

namespace fusebox {

struct OnnxImportOptions {
  // Graph inputs to freeze to these values at import: for inputs that decide
  // shapes (a Reshape's shape, Slice's starts, ...) when the model feeds them
  // as graph inputs rather than initializers. A frozen input becomes a constant.
  std::map<std::string, Tensor> constant_inputs;
  // Concrete shapes for inputs whose ONNX shape has symbolic or unknown dims.
  std::map<std::string, Shape> input_shapes;
};

// Errors name the file, the node (name and op_type) and the attribute at fault.
Graph import_onnx_file(const std::string& path, const OnnxImportOptions& opts = {});
Graph import_onnx_bytes(const std::string& bytes, const std::string& where,
                        const OnnxImportOptions& opts = {});

// Writes `g` as an ONNX model (opset 17, ir_version 8) that any ONNX runtime runs.
void export_onnx_file(const Graph& g, const std::string& path);
std::string export_onnx_bytes(const Graph& g);

}  // namespace fusebox
