// A minimal zip archive reader and writer for .npz files: whole archives in memory,
// members stored (method 0) or deflated (method 8), zip64 sizes and offsets, CRC-32 checked.
// No encryption, no multi-disk archives.
#pragma once

#include <string>
#include <vector>

namespace fusebox::io {

struct ZipMember {
  std::string name;
  std::string data;  // uncompressed
};

// Reads every member of the archive `bytes`, in central-directory order. Every offset and
// length read from the archive is bounds-checked; a corrupt archive (bad signature,
// truncation, CRC mismatch, unsupported method, encryption, duplicate names) throws an
// Error with `where` that names the member at fault.
std::vector<ZipMember> read_zip(const std::string& bytes, const std::string& where);

struct ZipWriteOptions {
  bool compress = false;     // deflate members (method 8) instead of storing them
  bool force_zip64 = false;  // zip64 records even when sizes fit 32 bits (for tests)
};

// Builds an archive of `members` (names must be unique and non-empty). Zip64 records are
// added where sizes, offsets or the member count need them.
std::string write_zip(const std::vector<ZipMember>& members, const ZipWriteOptions& options);

}  // namespace fusebox::io
