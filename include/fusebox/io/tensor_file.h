// Tensor files: numpy .npy / .npz and ONNX TensorProto .pb.
// Every reader validates what it reads (magic, header, sizes against the file's
// length) and throws an Error naming the file and the problem; never a crash.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "fusebox/core/tensor.h"

namespace fusebox {

// .npy, format versions 1.0-3.0; little- or big-endian; C or Fortran order
// (Fortran order is transposed into our row-major layout). dtypes: f8 f4 f2 i8 i4
// b1 (bool); anything else (u1, i2, c8, '<V2', structured dtypes...) is an error.
// numpy has no bfloat16, so bf16 tensors are written as '<f4' (a lossless widening)
// and read back as f32. Writing uses version 1.0 (2.0 when the header needs it), C order,
// little-endian, the header padded to 64 bytes as numpy does. `where` names the source in
// errors ("npy: x.npy").
Tensor read_npy(const std::string& path);
Tensor parse_npy(const std::string& bytes, const std::string& where);
void write_npy(const std::string& path, const Tensor& t);
std::string serialize_npy(const Tensor& t);

// .npz: a zip archive of .npy members (stored or deflated, zip64 accepted), member
// "x.npy" holding array "x". Members are CRC-checked; a member that is not a .npy file is
// an error. parse_npz / serialize_npz do the same in memory.
std::map<std::string, Tensor> read_npz(const std::string& path);
std::map<std::string, Tensor> parse_npz(const std::string& bytes, const std::string& where);
void write_npz(const std::string& path, const std::map<std::string, Tensor>& arrays,
               bool compress = false);
std::string serialize_npz(const std::map<std::string, Tensor>& arrays, bool compress = false);

// A serialized onnx.TensorProto (the ONNX test data's input_N.pb / output_N.pb).
// Returns the tensor and, through `name`, the proto's name. External data is looked up
// relative to the .pb file's directory. Written with raw_data (see src/io/tensor_proto.h).
Tensor read_tensor_pb(const std::string& path, std::string* name = nullptr);
void write_tensor_pb(const std::string& path, const Tensor& t, const std::string& name);

// Writes `bytes` to `path` atomically: a temporary file beside it ("<path>.tmp.<pid>.<n>"),
// fsync, rename; on failure the temporary file is removed and the Error carries the errno
// text. A process killed while writing leaves its temporary file (remove_stale_temporaries).
void write_file_atomic(const std::string& path, const std::string& bytes);
// That write_file_atomic(path, ...) can succeed, asked before work whose result it will
// write: the folder exists and takes a new file (one is made and removed), and `path` is not
// a folder. An Error from `where` saying which, otherwise.
void check_writable(const std::string& path, const std::string& where);
// Removes write_file_atomic's temporary files for `path` ("<path>.tmp.<pid>.<n>", nothing
// else) whose process is gone: those of killed writers. Returns their paths. A temporary file
// of a running process (kill(pid, 0)) is its write in progress and stays. The pids are this
// machine's: two machines writing one path of a shared filesystem are not told apart (they
// would replace each other's file anyway).
std::vector<std::string> remove_stale_temporaries(const std::string& path);
// The whole file; an Error naming the path and the errno text on failure.
std::string read_file(const std::string& path);

}  // namespace fusebox
