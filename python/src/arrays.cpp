#include "arrays.h"

#include <nanobind/stl/string.h>

#include <cstring>
#include <vector>

#include "fusebox/runtime/executor.h"

namespace fusebox::python {

namespace {

using nb::dlpack::dtype_code;

const char* dlpack_code_name(uint8_t code) {
  switch (dtype_code(code)) {
    case dtype_code::Int:
      return "int";
    case dtype_code::UInt:
      return "uint";
    case dtype_code::Float:
      return "float";
    case dtype_code::Bfloat:
      return "bfloat";
    case dtype_code::Complex:
      return "complex";
    case dtype_code::Bool:
      return "bool";
    default:
      return "dlpack-code-";
  }
}

// Copies a strided array (strides in elements, any sign) into dense row-major `dst`.
void gather_strided(const std::byte* src, const int64_t* strides, const Shape& shape, size_t item,
                    std::byte* dst) {
  const int64_t n = numel(shape);
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t offset = 0;
    for (size_t d = 0; d < shape.size(); ++d) offset += index[d] * strides[d];
    std::memcpy(dst + size_t(i) * item, src + offset * int64_t(item), item);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

// The DLPack device types fusebox meets, as a message names them.
std::string device_str(int type, int id) {
  switch (type) {
    case nb::device::cpu::value:
      return "the cpu";
    case nb::device::cuda::value:
      return cat("cuda:", id);
    case nb::device::cuda_host::value:
      return "the cpu (pinned)";
    case nb::device::cuda_managed::value:
      return cat("cuda:", id, " (managed memory)");
    case nb::device::rocm::value:
      return cat("rocm:", id);
    case nb::device::metal::value:
      return "metal";
    default:
      return cat("DLPack device type ", type);
  }
}

bool host_readable(int type) {
  return type == nb::device::cpu::value || type == nb::device::cuda_host::value;
}

}  // namespace

void check_device(const InputArray& a, const std::string& input, Device device,
                  const std::string& where) {
  const int type = a.device_type();
  if (device == Device::cpu) {
    FUSEBOX_CHECK(host_readable(type), where, "input '", input, "' is on ",
                  device_str(type, a.device_id()),
                  " but it runs on the cpu: move it to the host first (torch: x.cpu()); fusebox "
                  "does not copy between devices behind your back");
    return;
  }
  FUSEBOX_CHECK(type == nb::device::cuda::value && a.device_id() == cuda_device(), where, "input '",
                input, "' is on ", device_str(type, a.device_id()),
                " but it runs on cuda:", cuda_device(),
                ": move it there first (torch: x.cuda(), cupy: cupy.asarray(x)); fusebox does not "
                "copy between devices behind your back");
  FUSEBOX_CHECK(is_c_contiguous(a), where, "input '", input,
                "' on cuda is not contiguous (row-major): make it so first (torch: "
                "x.contiguous(), cupy: cupy.ascontiguousarray(x))");
}

InputArray import_array(nb::handle obj, const std::string& input, const std::string& where) {
  InputArray a;
  if (nb::try_cast(obj, a)) return a;
  throw Error(where, cat("input '", input, "' is a ",
                         nb::cast<std::string>(nb::getattr(obj.type(), "__qualname__")),
                         ", not an array (a numpy array, or a tensor with __dlpack__: torch, "
                         "cupy, jax)"));
}

std::optional<DType> fusebox_dtype(nb::dlpack::dtype d) {
  if (d.lanes != 1) return std::nullopt;
  switch (dtype_code(d.code)) {
    case dtype_code::Float:
      if (d.bits == 64) return DType::f64;
      if (d.bits == 32) return DType::f32;
      if (d.bits == 16) return DType::f16;
      return std::nullopt;
    case dtype_code::Bfloat:
      if (d.bits == 16) return DType::bf16;
      return std::nullopt;
    case dtype_code::Int:
      if (d.bits == 64) return DType::i64;
      if (d.bits == 32) return DType::i32;
      return std::nullopt;
    case dtype_code::Bool:
      if (d.bits == 8) return DType::boolean;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

nb::dlpack::dtype dlpack_dtype(DType d) {
  auto make = [](dtype_code code, int bits) {
    return nb::dlpack::dtype{uint8_t(code), uint8_t(bits), 1};
  };
  switch (d) {
    case DType::f64:
      return make(dtype_code::Float, 64);
    case DType::f32:
      return make(dtype_code::Float, 32);
    case DType::f16:
      return make(dtype_code::Float, 16);
    case DType::bf16:
      return make(dtype_code::Bfloat, 16);
    case DType::i64:
      return make(dtype_code::Int, 64);
    case DType::i32:
      return make(dtype_code::Int, 32);
    case DType::boolean:
      return make(dtype_code::Bool, 8);
  }
  return make(dtype_code::Float, 32);
}

Shape array_shape(const InputArray& a) {
  return Shape(a.shape_ptr(), a.shape_ptr() + a.ndim());
}

std::string array_type_str(const InputArray& a) {
  const std::string shape = shape_str(array_shape(a));
  if (auto d = fusebox_dtype(a.dtype())) return dtype_name(*d) + shape;
  const nb::dlpack::dtype d = a.dtype();
  std::string name = cat(dlpack_code_name(d.code), int(d.bits));
  if (d.lanes != 1) name += cat("x", d.lanes);
  return name + shape;
}

bool is_c_contiguous(const InputArray& a) {
  if (a.stride_ptr() == nullptr) return true;
  int64_t expected = 1;
  for (size_t d = a.ndim(); d-- > 0;) {
    const int64_t extent = a.shape_ptr()[d];
    if (extent == 0) return true;  // no element: any strides
    if (extent != 1 && a.stride(d) != expected) return false;
    expected *= extent;
  }
  return true;
}

void check_type(const InputArray& a, const TensorSpec& spec, const std::string& where) {
  const std::optional<DType> dtype = fusebox_dtype(a.dtype());
  FUSEBOX_CHECK(dtype == spec.dtype && array_shape(a) == spec.shape, where, "input '", spec.name,
                "' expects ", dtype_name(spec.dtype), shape_str(spec.shape), " but was given ",
                array_type_str(a));
}

Tensor host_tensor(const InputArray& a, DType dtype) {
  const Shape shape = array_shape(a);
  const auto* data = static_cast<const std::byte*>(a.data());
  if (numel(shape) == 0) return Tensor::empty(dtype, shape);
  if (!is_c_contiguous(a)) {
    Tensor t = Tensor::empty(dtype, shape);
    gather_strided(data, a.stride_ptr(), shape, dtype_size(dtype),
                   static_cast<std::byte*>(t.raw()));
    return t;
  }
  // The tensor holds a handle of the array; the last tensor handle releases it, on whichever
  // thread that is (a later run drops the previous feed), so it takes the GIL to do so.
  auto* keep = new InputArray(a);
  std::shared_ptr<std::byte[]> bytes(const_cast<std::byte*>(data), [keep](std::byte*) {
    nb::gil_scoped_acquire gil;
    delete keep;
  });
  return Tensor::adopt(dtype, shape, std::move(bytes));
}

nb::object to_numpy(const Tensor& tensor) {
  // numpy has no bf16: such an output comes back as f32 (exact).
  auto* keep = new Tensor(tensor.dtype() == DType::bf16 ? tensor.cast(DType::f32) : tensor);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  const std::vector<size_t> shape(keep->shape().begin(), keep->shape().end());
  return nb::ndarray<nb::numpy>(keep->raw(), shape.size(), shape.data(), owner, nullptr,
                                dlpack_dtype(keep->dtype()), nb::device::cpu::value)
      .cast();
}

}  // namespace fusebox::python
