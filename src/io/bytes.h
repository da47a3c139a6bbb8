// Little-endian byte helpers for the file formats in src/io: a bounds-checked reader
// over an in-memory file, appenders, byte swapping and overflow-checked sizes.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "fusebox/core/error.h"
#include "fusebox/core/shape.h"

namespace fusebox::io {

// Tensor buffers are copied to and from little-endian files with memcpy.
static_assert(std::endian::native == std::endian::little,
              "fusebox io assumes a little-endian host");

// Reads fixed-size little-endian fields at absolute offsets; every read is checked
// against the end of the data, so offsets taken from a corrupt file cannot overrun.
class ByteReader {
 public:
  ByteReader(std::string_view data, std::string where) : data_(data), where_(std::move(where)) {}

  size_t size() const { return data_.size(); }
  const std::string& where() const { return where_; }

  // True when [offset, offset + length) lies inside the data (no overflow).
  bool contains(uint64_t offset, uint64_t length) const {
    return offset <= data_.size() && length <= data_.size() - offset;
  }
  // The bytes [offset, offset + length); `what` names the field for the error.
  std::string_view bytes(uint64_t offset, uint64_t length, const char* what) const {
    FUSEBOX_CHECK(contains(offset, length), where_, what, " (", length, " bytes at offset ", offset,
                  ") runs past the end of the file (", data_.size(), " bytes)");
    return data_.substr(size_t(offset), size_t(length));
  }
  uint16_t u16(uint64_t offset, const char* what) const { return load<uint16_t>(offset, what); }
  uint32_t u32(uint64_t offset, const char* what) const { return load<uint32_t>(offset, what); }
  uint64_t u64(uint64_t offset, const char* what) const { return load<uint64_t>(offset, what); }

 private:
  template <class T>
  T load(uint64_t offset, const char* what) const {
    T v;
    std::memcpy(&v, bytes(offset, sizeof(T), what).data(), sizeof(T));
    return v;
  }
  std::string_view data_;
  std::string where_;
};

inline void put_u16(std::string* out, uint16_t v) {
  out->append(reinterpret_cast<char*>(&v), 2);
}
inline void put_u32(std::string* out, uint32_t v) {
  out->append(reinterpret_cast<char*>(&v), 4);
}
inline void put_u64(std::string* out, uint64_t v) {
  out->append(reinterpret_cast<char*>(&v), 8);
}

// Reverses the bytes of each `elem_size`-byte element in place (big-endian -> native).
inline void byteswap_elements(void* data, size_t count, size_t elem_size) {
  auto* p = static_cast<unsigned char*>(data);
  for (size_t i = 0; i < count; ++i, p += elem_size) {
    for (size_t a = 0, b = elem_size - 1; a < b; ++a, --b) std::swap(p[a], p[b]);
  }
}

}  // namespace fusebox::io
