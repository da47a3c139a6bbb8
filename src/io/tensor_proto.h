// onnx.TensorProto <-> Tensor conversion, shared by the .pb reader and the ONNX importer.
#pragma once

#include <onnx/onnx_pb.h>  // ONNX_NAMESPACE=onnx ONNX_ML=1 come from the onnx_proto target

#include <string>

#include "fusebox/core/tensor.h"

namespace fusebox {

// Converts an onnx TensorProto to a Tensor.
//   data: raw_data (little-endian) or the typed fields: float_data, double_data,
//     int32_data (also carries f16/bf16 bits and bools, one per element), int64_data.
//   data_type: FLOAT DOUBLE FLOAT16 BFLOAT16 INT64 INT32 BOOL. Any other type (INT8, UINT8,
//     INT16, UINT16, UINT32, UINT64, STRING, COMPLEX...) is refused with an Error naming the
//     tensor and the type's name: our DType set has no 8/16-bit or unsigned integers.
//   external data (data_location EXTERNAL): keys "location", "offset", "length"; the file is
//     resolved relative to `base_dir`; absolute paths and paths escaping base_dir are refused.
// Validates: dims non-negative, element count equal to the data's size exactly.
// Errors read "[where] tensor 'name': ...".
Tensor tensor_from_proto(const onnx::TensorProto& p, const std::string& where,
                         const std::string& base_dir = "");
// The same tensor, made without copying raw_data: the tensor takes p's raw_data bytes (p is
// left without them). For an importer done with the proto (a model's weights are copied once
// less: GPT-2's 0.5 GB).
Tensor take_tensor_from_proto(onnx::TensorProto& p, const std::string& where,
                              const std::string& base_dir = "");

// Fills `p` (cleared first) with name, dims, data_type and little-endian raw_data.
void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto* p);

// ONNX TensorProto::DataType <-> DType. dtype_from_onnx returns false for types we lack.
bool dtype_from_onnx(int onnx_type, DType* out);
int dtype_to_onnx(DType t);
// The enum name of an ONNX data type for messages: "FLOAT", "UINT8", "STRING", ...;
// "UNKNOWN" for a value the enum lacks.
const char* onnx_type_name(int onnx_type);

}  // namespace fusebox
