// onnx.TensorProto <-> Tensor, and the .pb tensor files of the ONNX test data.
//
// A TensorProto holds its elements in exactly one of: raw_data (little-endian bytes),
// a typed repeated field (which one depends on data_type), or an external file
// (data_location EXTERNAL, described by key/value pairs in external_data).
#include "io/tensor_proto.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "fusebox/core/memory.h"
#include "fusebox/io/tensor_file.h"
#include "io/bytes.h"

namespace fusebox {

namespace fs = std::filesystem;

namespace {

// An error about tensor `name`, raised at `where`.
struct TensorContext {
  const std::string& where;
  const std::string& name;
  template <class... Args>
  [[noreturn]] void fail(Args&&... args) const {
    throw Error(where, cat("tensor '", name, "': ", std::forward<Args>(args)...));
  }
};

// A non-negative decimal integer, as external_data writes offsets and lengths.
bool parse_size(const std::string& text, uint64_t* out) {
  if (text.empty() || text.size() > 18) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + uint64_t(c - '0');
  }
  *out = v;
  return true;
}

// True when `inner` is `outer` or lies beneath it (both canonical).
bool is_within(const fs::path& inner, const fs::path& outer) {
  auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return o == outer.end();
}

// Reads the `nbytes` of external data that `p` points to. The location must be a relative
// path that stays inside base_dir (after resolving "..", and symbolic links).
std::string read_external(const onnx::TensorProto& p, const std::string& base_dir, uint64_t nbytes,
                          const TensorContext& ctx) {
  std::string location;
  uint64_t offset = 0, length = 0;
  bool has_location = false, has_offset = false, has_length = false;
  for (const auto& entry : p.external_data()) {
    const std::string& key = entry.key();
    bool* seen = key == "location" ? &has_location
                 : key == "offset" ? &has_offset
                 : key == "length" ? &has_length
                                   : nullptr;
    if (!seen) continue;  // "checksum" and future keys carry nothing we need
    if (*seen) ctx.fail("external_data has two '", key, "' entries");
    *seen = true;
    if (key == "location")
      location = entry.value();
    else if (!parse_size(entry.value(), key == "offset" ? &offset : &length))
      ctx.fail("external_data ", key, " '", entry.value(), "' is not a non-negative integer");
  }
  if (!has_location || location.empty()) ctx.fail("external data without a location");
  if (base_dir.empty()) ctx.fail("has external data '", location, "' but no base directory");
  const fs::path relative = fs::path(location).lexically_normal();
  if (relative.is_absolute() || relative.has_root_name() || relative.has_root_directory() ||
      relative.empty() || *relative.begin() == "..") {
    ctx.fail("external data location '", location, "' is not inside the model's directory");
  }
  std::error_code ec;
  fs::path base = fs::weakly_canonical(base_dir, ec);
  if (!base.has_filename()) base = base.parent_path();  // "dir/" -> "dir"
  const fs::path file = fs::weakly_canonical(base / relative, ec);
  if (ec || !is_within(file, base)) {
    ctx.fail("external data location '", location, "' resolves outside '", base_dir, "'");
  }
  const uint64_t file_size = fs::file_size(file, ec);
  if (ec) ctx.fail("external data file '", file.string(), "': ", ec.message());
  if (offset > file_size) {
    ctx.fail("external data offset ", offset, " is past the end of '", file.string(), "' (",
             file_size, " bytes)");
  }
  if (!has_length) length = file_size - offset;
  if (length != nbytes) {
    ctx.fail("external data has ", length, " bytes, the shape and type need ", nbytes);
  }
  if (length > file_size - offset) {
    ctx.fail("external data (", length, " bytes at offset ", offset, ") runs past the end of '",
             file.string(), "' (", file_size, " bytes)");
  }
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(file.c_str(), "rb"), &std::fclose);
  if (!f) ctx.fail("cannot open external data '", file.string(), "': ", std::strerror(errno));
  std::string bytes(nbytes, '\0');
  if (::fseeko(f.get(), off_t(offset), SEEK_SET) != 0 ||
      std::fread(bytes.data(), 1, nbytes, f.get()) != nbytes) {
    ctx.fail("cannot read external data '", file.string(), "': ", std::strerror(errno));
  }
  return bytes;
}

// Converts the typed repeated field `values` (already checked to hold t->numel() values)
// into `t`, element by element.
template <class T, class Field, class Convert>
void copy_field(const Field& values, Tensor* t, Convert convert) {
  T* out = static_cast<T*>(t->raw());
  for (int i = 0; i < values.size(); ++i) out[i] = convert(values.Get(i));
}

}  // namespace

bool dtype_from_onnx(int onnx_type, DType* out) {
  switch (onnx_type) {
    case onnx::TensorProto::FLOAT:
      *out = DType::f32;
      return true;
    case onnx::TensorProto::DOUBLE:
      *out = DType::f64;
      return true;
    case onnx::TensorProto::FLOAT16:
      *out = DType::f16;
      return true;
    case onnx::TensorProto::BFLOAT16:
      *out = DType::bf16;
      return true;
    case onnx::TensorProto::INT64:
      *out = DType::i64;
      return true;
    case onnx::TensorProto::INT32:
      *out = DType::i32;
      return true;
    case onnx::TensorProto::BOOL:
      *out = DType::boolean;
      return true;
    default:
      return false;
  }
}

int dtype_to_onnx(DType t) {
  switch (t) {
    case DType::f32:
      return onnx::TensorProto::FLOAT;
    case DType::f64:
      return onnx::TensorProto::DOUBLE;
    case DType::f16:
      return onnx::TensorProto::FLOAT16;
    case DType::bf16:
      return onnx::TensorProto::BFLOAT16;
    case DType::i64:
      return onnx::TensorProto::INT64;
    case DType::i32:
      return onnx::TensorProto::INT32;
    case DType::boolean:
      return onnx::TensorProto::BOOL;
  }
  return onnx::TensorProto::UNDEFINED;
}

const char* onnx_type_name(int onnx_type) {
  // TensorProto.DataType in onnx.proto; 17 and up postdate Debian's onnx headers.
  static const char* const kNames[] = {
      "UNDEFINED",      "FLOAT",      "UINT8",          "INT8",       "UINT16",   "INT16",
      "INT32",          "INT64",      "STRING",         "BOOL",       "FLOAT16",  "DOUBLE",
      "UINT32",         "UINT64",     "COMPLEX64",      "COMPLEX128", "BFLOAT16", "FLOAT8E4M3FN",
      "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4",      "INT4",     "FLOAT4E2M1"};
  constexpr int kCount = int(sizeof(kNames) / sizeof(kNames[0]));
  return onnx_type >= 0 && onnx_type < kCount ? kNames[onnx_type] : "UNKNOWN";
}

namespace {

// tensor_from_proto, or take_tensor_from_proto where `take` is &p (its raw_data may be taken).
Tensor tensor_from_proto_or_take(const onnx::TensorProto& p, const std::string& where,
                                 const std::string& base_dir, onnx::TensorProto* take) {
  const TensorContext ctx{where, p.name()};
  DType dtype;
  if (!dtype_from_onnx(p.data_type(), &dtype)) {
    ctx.fail("data type ", onnx_type_name(p.data_type()), " (", p.data_type(),
             ") is not supported (supported: FLOAT DOUBLE FLOAT16 BFLOAT16 INT64 INT32 BOOL)");
  }
  if (p.has_segment()) ctx.fail("segmented tensors are not supported");
  Shape shape(p.dims().begin(), p.dims().end());
  for (int64_t d : shape) {
    if (d < 0) ctx.fail("negative extent in dims ", shape_str(shape));
  }
  const std::optional<TensorSize> size = checked_tensor_size(shape, dtype_size(dtype));
  if (!size) {
    ctx.fail("dims ", shape_str(shape), " describe an impossibly large tensor (more than ",
             format_bytes(kMaxTensorBytes), ")");
  }
  const uint64_t nbytes = size->bytes;

  // Exactly one place may hold the elements: name every non-empty one.
  const bool external = p.data_location() == onnx::TensorProto::EXTERNAL;
  const struct {
    const char* name;
    bool used;
  } sources[] = {{"raw_data", p.has_raw_data()},
                 {"external data", external},
                 {"float_data", p.float_data_size() > 0},
                 {"double_data", p.double_data_size() > 0},
                 {"int32_data", p.int32_data_size() > 0},
                 {"int64_data", p.int64_data_size() > 0},
                 {"uint64_data", p.uint64_data_size() > 0},
                 {"string_data", p.string_data_size() > 0}};
  std::string used;
  int used_count = 0;
  for (const auto& s : sources) {
    if (s.used) used += cat(used_count++ ? ", " : "", s.name);
  }
  if (used_count > 1) ctx.fail("data in more than one place: ", used);

  const int64_t numel = nbytes / dtype_size(dtype);
  if (used_count == 0 && numel > 0) {
    ctx.fail("has no data; ", dtype_name(dtype), " of shape ", shape_str(shape), " needs ", numel,
             " elements");
  }

  if (p.has_raw_data() || external) {
    const std::string external_bytes =
        external ? read_external(p, base_dir, nbytes, ctx) : std::string();
    const std::string& bytes = external ? external_bytes : p.raw_data();
    if (bytes.size() != nbytes) {
      ctx.fail("raw_data has ", bytes.size(), " bytes, ", dtype_name(dtype), " of shape ",
               shape_str(shape), " needs ", nbytes);
    }
    if (take != nullptr && !external && nbytes > 0) {
      std::string owned;
      take->mutable_raw_data()->swap(owned);  // `bytes` is now empty: not read again
      if (dtype == DType::boolean)
        for (char& c : owned) c = char(c != 0);  // a C++ bool must hold 0 or 1
      return Tensor::adopt(
          dtype, shape,
          adopt_host_bytes(std::move(owned), cat(dtype_name(dtype), shape_str(shape))));
    }
    Tensor t = Tensor::empty(dtype, shape);
    auto* dst = static_cast<unsigned char*>(t.raw());
    if (nbytes > 0) std::memcpy(dst, bytes.data(), nbytes);
    // A C++ bool must hold 0 or 1.
    if (dtype == DType::boolean) {
      for (int64_t i = 0; i < numel; ++i) dst[i] = dst[i] != 0;
    }
    return t;
  }

  // Typed fields: which one depends on the type; f16, bf16 and bool elements travel one
  // per int32_data value. The count is checked before anything is allocated.
  struct TypedField {
    const char* name;
    int64_t count;
  };
  const TypedField field = dtype == DType::f32   ? TypedField{"float_data", p.float_data_size()}
                           : dtype == DType::f64 ? TypedField{"double_data", p.double_data_size()}
                           : dtype == DType::i64 ? TypedField{"int64_data", p.int64_data_size()}
                                                 : TypedField{"int32_data", p.int32_data_size()};
  if (field.count != numel) {
    ctx.fail(field.name, " has ", field.count, " values, ", dtype_name(dtype), " of shape ",
             shape_str(shape), " needs ", numel, " (data present in ", used, ")");
  }
  Tensor t = Tensor::empty(dtype, shape);
  auto half_bits = [&](int32_t v) {
    if (v < -32768 || v > 65535) ctx.fail("int32_data value ", v, " is not 16-bit");
    return uint16_t(v);
  };
  switch (dtype) {
    case DType::f32:
      copy_field<float>(p.float_data(), &t, [](float v) { return v; });
      break;
    case DType::f64:
      copy_field<double>(p.double_data(), &t, [](double v) { return v; });
      break;
    case DType::i32:
      copy_field<int32_t>(p.int32_data(), &t, [](int32_t v) { return v; });
      break;
    case DType::i64:
      copy_field<int64_t>(p.int64_data(), &t, [](int64_t v) { return v; });
      break;
    case DType::f16:
      copy_field<Half>(p.int32_data(), &t,
                       [&](int32_t v) { return Half::from_bits(half_bits(v)); });
      break;
    case DType::bf16:
      copy_field<BFloat16>(p.int32_data(), &t,
                           [&](int32_t v) { return BFloat16::from_bits(half_bits(v)); });
      break;
    case DType::boolean:
      copy_field<bool>(p.int32_data(), &t, [](int32_t v) { return v != 0; });
      break;
  }
  return t;
}

}  // namespace

Tensor tensor_from_proto(const onnx::TensorProto& p, const std::string& where,
                         const std::string& base_dir) {
  return tensor_from_proto_or_take(p, where, base_dir, nullptr);
}

Tensor take_tensor_from_proto(onnx::TensorProto& p, const std::string& where,
                              const std::string& base_dir) {
  return tensor_from_proto_or_take(p, where, base_dir, &p);
}

void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto* p) {
  FUSEBOX_CHECK(t.defined(), "tensor '" + name + "'", "cannot convert an undefined tensor");
  p->Clear();
  p->set_name(name);
  for (int64_t d : t.shape()) p->add_dims(d);
  p->set_data_type(dtype_to_onnx(t.dtype()));
  p->set_raw_data(static_cast<const char*>(t.raw()), t.nbytes());
}

Tensor read_tensor_pb(const std::string& path, std::string* name) {
  const std::string where = "tensor pb: " + path;
  const std::string bytes = read_file(path);
  onnx::TensorProto p;
  FUSEBOX_CHECK(p.ParseFromString(bytes), where,
                "not a serialized onnx.TensorProto (protobuf parsing failed)");
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  Tensor t = tensor_from_proto(p, where, dir);
  if (name) *name = p.name();
  return t;
}

void write_tensor_pb(const std::string& path, const Tensor& t, const std::string& name) {
  onnx::TensorProto p;
  tensor_to_proto(t, name, &p);
  std::string bytes;
  FUSEBOX_CHECK(p.SerializeToString(&bytes), "tensor pb: " + path,
                "protobuf serialization failed (tensors over 2 GiB do not fit a .pb)");
  write_file_atomic(path, bytes);
}

}  // namespace fusebox
