// Arrays between Python and fusebox (docs/python.md, "Zero copy"): any object nanobind imports
// as an ndarray (numpy through the buffer protocol, torch, cupy, jax and the rest through
// __dlpack__) in; numpy arrays (CPU) or DLPack-capable ndarrays (CUDA) out.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>
#include <string>

#include "fusebox/core/tensor.h"
#include "fusebox/runtime/executable.h"

namespace fusebox::python {

namespace nb = nanobind;

// Read-only: an input is never written, and read-only numpy arrays are accepted.
using InputArray = nb::ndarray<nb::ro>;

// One input or output of a model or executable, as Python sees it (fusebox.TensorSpec).
struct TensorSpec {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
};

// `obj` as an array; an Error naming `input` and what it is when nanobind cannot import it.
InputArray import_array(nb::handle obj, const std::string& input, const std::string& where);

// The fusebox dtype of a DLPack dtype; nullopt for one fusebox has not (u8, complex, ...).
std::optional<DType> fusebox_dtype(nb::dlpack::dtype d);
nb::dlpack::dtype dlpack_dtype(DType d);
// "f32[2, 3]", or the DLPack dtype spelled out ("uint8[2, 3]") where fusebox has none.
std::string array_type_str(const InputArray& a);
Shape array_shape(const InputArray& a);
// Row-major and dense (dims of extent 1 may have any stride, as torch gives them).
bool is_c_contiguous(const InputArray& a);

// Checks dtype and shape against `spec`: an Error "input 'x' expects f32[1, 3] but was given
// f64[1, 3]" otherwise.
void check_type(const InputArray& a, const TensorSpec& spec, const std::string& where);

// Checks that `a` is where something running on `device` reads it: host memory for the CPU;
// for CUDA, this process's GPU and C-contiguous. An Error naming `input` and how to move it
// otherwise (nothing is copied between devices behind the caller's back).
void check_device(const InputArray& a, const std::string& input, Device device,
                  const std::string& where);

// A host tensor of a CPU array: over the array's own memory when it is C-contiguous (the tensor
// keeps the array alive, releasing it under the GIL), else a contiguous copy. Callable without
// the GIL held (it takes it where it must).
Tensor host_tensor(const InputArray& a, DType dtype);

// `t` as a numpy array over the tensor's own memory (shared ownership; bf16, which numpy does not
// have, becomes an f32 copy). Needs the GIL.
nb::object to_numpy(const Tensor& t);

// ---- CUDA (cuda_arrays.cpp) -----------------------------------------------------------------

// A device array holding a copy of a CUDA array's contents (C-contiguous, on this process's
// GPU: checked by the caller), after all work queued on the GPU so far. Without the GIL.
DeviceArray cuda_feed(const InputArray& a, DType dtype);
// Outputs handed to Python: a copy (device to device, dense, row-major) of each of the
// executable's output arrays, which its next run overwrites. Without the GIL; returns once
// the copies are done.
std::vector<DeviceArray> own_copies(const std::vector<DeviceArray>& outputs);
// A DLPack-capable ndarray (nanobind's array_api object: __dlpack__, __dlpack_device__) over `a`'s
// device memory (no copy; keeps `a` alive). Needs the GIL.
nb::object to_dlpack(const DeviceArray& a);

}  // namespace fusebox::python
