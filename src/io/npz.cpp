// numpy .npz files: a zip archive whose members "<key>.npy" are .npy files (numpy.savez
// stores them, numpy.savez_compressed deflates them).
#include "fusebox/io/tensor_file.h"
#include "io/zip.h"

namespace fusebox {

namespace {
constexpr std::string_view kSuffix = ".npy";
}

std::map<std::string, Tensor> parse_npz(const std::string& bytes, const std::string& where) {
  std::map<std::string, Tensor> arrays;
  for (const io::ZipMember& m : io::read_zip(bytes, where)) {
    FUSEBOX_CHECK(m.name.size() > kSuffix.size() && m.name.ends_with(kSuffix), where, "member '",
                  m.name, "' is not a .npy file");
    const std::string key = m.name.substr(0, m.name.size() - kSuffix.size());
    // Keys are unique: the zip reader refuses duplicate member names.
    arrays.emplace(key, parse_npy(m.data, cat(where, " member '", m.name, "'")));
  }
  return arrays;
}

std::map<std::string, Tensor> read_npz(const std::string& path) {
  return parse_npz(read_file(path), "npz: " + path);
}

std::string serialize_npz(const std::map<std::string, Tensor>& arrays, bool compress) {
  std::vector<io::ZipMember> members;
  for (const auto& [key, tensor] : arrays) {
    FUSEBOX_CHECK(!key.empty(), "npz", "array keys must not be empty");
    members.push_back({key + std::string(kSuffix), serialize_npy(tensor)});
  }
  return io::write_zip(members, {.compress = compress});
}

void write_npz(const std::string& path, const std::map<std::string, Tensor>& arrays,
               bool compress) {
  write_file_atomic(path, serialize_npz(arrays, compress));
}

}  // namespace fusebox
