// Tensor files: numpy .npy / .npz and ONNX TensorProto .pb.
// Every reader validates what it reads (magic, header, sizes against the file's
// length) and throws an Error naming the file and the problem; never a crash.
#pragma once

#include <map>
#include <string>

#include "fusebox/core/tensor.h"

namespace fusebox {

// .npy, format versions 1.0-3.0; little- or big-endian; C or Fortran order
// (Fortran order is transposed into our row-major layout). dtypes: f8 f4 f2 i8 i4
// b1 (bool), and bfloat16 stored as numpy's '<V2' is NOT accepted: bf16 tensors
// are written as f4 (a warning-free, lossless widening) .
Tensor read_npy(const std::string& path);
Tensor parse_npy(const std::string& bytes, const std::string& where);
void write_npy(const std::string& path, const Tensor& t);
std::string serialize_npy(const Tensor& t);

// .npz: a zip archive of .npy members (stored or deflated, zip64 accepted).
std::map<std::string, Tensor> read_npz(const std::string& path);
void write_npz(const std::string& path, const std::map<std::string, Tensor>& arrays,
               bool compress = false);

// A serialized onnx.TensorProto (the ONNX test data's input_N.pb / output_N.pb).
// Returns the tensor and, through `name`, the proto's name.
Tensor read_tensor_pb(const std::string& path, std::string* name = nullptr);
void write_tensor_pb(const std::string& path, const Tensor& t, const std::string& name);

// Writes `bytes` to `path` atomically: a temporary file beside it, fsync, rename.
void write_file_atomic(const std::string& path, const std::string& bytes);
std::string read_file(const std::string& path);

}  // namespace fusebox
