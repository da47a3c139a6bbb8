// Zip archives (PKWARE APPNOTE.TXT), just enough for .npz:
//
//   [local header, name, extra, data]...  [central directory entry]...
//   [zip64 end-of-central-directory record, zip64 locator]  end-of-central-directory record
//
// Reading trusts the central directory (sizes, CRC, local header offset), found through the
// end record at the back of the file; the local header only locates the data (its sizes may
// be zero when a data descriptor follows). Fields that do not fit 32 bits hold 0xffffffff
// and the real value sits in the zip64 extra field (id 1) or the zip64 end record.
#include "io/zip.h"

#include <zlib.h>

#include <algorithm>
#include <set>

#include "io/bytes.h"

namespace fusebox::io {

namespace {

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr size_t kLocalSize = 30, kCentralSize = 46, kEndSize = 22;
constexpr size_t kZip64EndSize = 56, kZip64LocatorSize = 20;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint32_t kMax32 = 0xffffffff;
constexpr uint16_t kMax16 = 0xffff;
constexpr uint16_t kMethodStored = 0, kMethodDeflate = 8;
constexpr uint16_t kFlagEncrypted = 1 << 0, kFlagStrongEncryption = 1 << 6, kFlagUtf8 = 1 << 11;
// Deflate cannot expand data by more than ~1032x; a larger declared size is a lie that
// would otherwise make us allocate without bound.
constexpr uint64_t kMaxDeflateRatio = 1032;
// zlib counts in 32-bit uInt; larger buffers go through in pieces.
constexpr size_t kZlibChunk = size_t(1) << 30;

struct Entry {
  std::string name;
  uint16_t flags = 0, method = 0;
  uint32_t crc = 0;
  uint64_t compressed_size = 0, size = 0, local_offset = 0;
};

struct Directory {
  uint64_t entries = 0, size = 0, offset = 0;
  uint64_t end = 0;  // where the central directory must end (the first end record)
};

// Finds the end-of-central-directory record (and the zip64 one when present).
Directory find_directory(const ByteReader& in) {
  const std::string& where = in.where();
  FUSEBOX_CHECK(in.size() >= kEndSize, where, "not a zip archive (", in.size(), " bytes)");
  // The end record is the last thing in the file, followed only by its comment (< 64 KiB).
  uint64_t end_pos = 0;
  bool found = false;
  const uint64_t lowest = in.size() >= kEndSize + kMax16 ? in.size() - kEndSize - kMax16 : 0;
  for (uint64_t pos = in.size() - kEndSize + 1; pos-- > lowest;) {
    if (in.u32(pos, "end record") == kEndSig &&
        pos + kEndSize + in.u16(pos + 20, "comment length") == in.size()) {
      end_pos = pos;
      found = true;
      break;
    }
  }
  FUSEBOX_CHECK(found, where, "not a zip archive (no end-of-central-directory record)");

  Directory dir;
  const uint16_t disk = in.u16(end_pos + 4, "disk number");
  const uint16_t dir_disk = in.u16(end_pos + 6, "central directory disk");
  const uint16_t disk_entries = in.u16(end_pos + 8, "entry count");
  dir.entries = in.u16(end_pos + 10, "entry count");
  dir.size = in.u32(end_pos + 12, "central directory size");
  dir.offset = in.u32(end_pos + 16, "central directory offset");
  dir.end = end_pos;

  const bool has_locator = end_pos >= kZip64LocatorSize &&
                           in.u32(end_pos - kZip64LocatorSize, "zip64 locator") == kZip64LocatorSig;
  if (has_locator) {
    const uint64_t locator = end_pos - kZip64LocatorSize;
    const uint64_t record = in.u64(locator + 8, "zip64 end record offset");
    FUSEBOX_CHECK(record <= locator && locator - record >= kZip64EndSize &&
                      in.u32(record, "zip64 end record") == kZip64EndSig,
                  where, "bad zip64 end-of-central-directory record at offset ", record);
    FUSEBOX_CHECK(in.u32(record + 16, "disk number") == 0 &&
                      in.u32(record + 20, "central directory disk") == 0,
                  where, "multi-disk zip archives are not supported");
    dir.entries = in.u64(record + 32, "entry count");
    dir.size = in.u64(record + 40, "central directory size");
    dir.offset = in.u64(record + 48, "central directory offset");
    dir.end = record;
  } else {
    FUSEBOX_CHECK(disk == 0 && dir_disk == 0 && disk_entries == dir.entries, where,
                  "multi-disk zip archives are not supported");
    FUSEBOX_CHECK(dir.entries != kMax16 && dir.size != kMax32 && dir.offset != kMax32, where,
                  "zip64 end-of-central-directory locator missing");
  }
  FUSEBOX_CHECK(dir.offset <= dir.end && dir.size == dir.end - dir.offset, where,
                "central directory (", dir.size, " bytes at offset ", dir.offset,
                ") does not end where the end record starts (offset ", dir.end, ")");
  FUSEBOX_CHECK(dir.entries <= dir.size / kCentralSize, where, "central directory of ", dir.size,
                " bytes cannot hold ", dir.entries, " entries");
  return dir;
}

// Applies the zip64 extra field (id 1): the 64-bit values of the fields that hold 0xffffffff,
// in the order uncompressed size, compressed size, local header offset.
void apply_zip64_extra(std::string_view extra, Entry* e, const std::string& where) {
  const ByteReader in(extra, where);
  uint64_t pos = 0;
  while (pos + 4 <= extra.size()) {
    const uint16_t id = in.u16(pos, "extra field id");
    const uint16_t len = in.u16(pos + 2, "extra field length");
    FUSEBOX_CHECK(in.contains(pos + 4, len), where, "member '", e->name,
                  "': extra field runs past its end");
    if (id == kZip64ExtraId) {
      uint64_t field = pos + 4;
      for (uint64_t* value : {&e->size, &e->compressed_size, &e->local_offset}) {
        if (*value != kMax32) continue;
        FUSEBOX_CHECK(field + 8 <= pos + 4 + len, where, "member '", e->name,
                      "': zip64 extra field too short");
        *value = in.u64(field, "zip64 extra field");
        field += 8;
      }
    }
    pos += 4 + uint64_t(len);
  }
}

std::string inflate_member(std::string_view compressed, uint64_t size, const std::string& where,
                           const std::string& name) {
  FUSEBOX_CHECK(size <= compressed.size() * kMaxDeflateRatio + 1024, where, "member '", name,
                "': declared size ", size, " is impossible for ", compressed.size(),
                " bytes of deflate data");
  std::string out(size, '\0');
  z_stream zs{};
  FUSEBOX_CHECK(inflateInit2(&zs, -MAX_WBITS) == Z_OK, where, "zlib inflateInit2 failed");
  struct Guard {
    z_stream* zs;
    ~Guard() { inflateEnd(zs); }
  } guard{&zs};
  size_t in_done = 0, out_done = 0;
  for (;;) {
    const size_t in_chunk = std::min(compressed.size() - in_done, kZlibChunk);
    const size_t out_chunk = std::min(out.size() - out_done, kZlibChunk);
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data() + in_done));
    zs.avail_in = uInt(in_chunk);
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + out_done);
    zs.avail_out = uInt(out_chunk);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    in_done += in_chunk - zs.avail_in;
    out_done += out_chunk - zs.avail_out;
    if (rc == Z_STREAM_END) break;
    FUSEBOX_CHECK(rc != Z_DATA_ERROR, where, "member '", name, "': corrupt deflate data (",
                  zs.msg ? zs.msg : "?", ")");
    FUSEBOX_CHECK(rc == Z_OK || rc == Z_BUF_ERROR, where, "member '", name,
                  "': inflate failed (zlib error ", rc, ")");
    // No progress is possible: the input ran out, or (input left over) the output is full.
    FUSEBOX_CHECK(rc == Z_OK, where, "member '", name, "': ",
                  in_done == compressed.size() ? "deflate data is truncated"
                                               : "data inflates to more than the declared size");
  }
  FUSEBOX_CHECK(out_done == size, where, "member '", name, "': inflates to ", out_done,
                " bytes, the directory says ", size);
  return out;
}

std::string deflate_member(const std::string& data) {
  z_stream zs{};
  FUSEBOX_CHECK(deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -MAX_WBITS, 8,
                             Z_DEFAULT_STRATEGY) == Z_OK,
                "zip", "zlib deflateInit2 failed");
  struct Guard {
    z_stream* zs;
    ~Guard() { deflateEnd(zs); }
  } guard{&zs};
  std::string out(deflateBound(&zs, uLong(data.size())), '\0');
  size_t in_done = 0, out_done = 0;
  for (;;) {
    const size_t in_chunk = std::min(data.size() - in_done, kZlibChunk);
    const size_t out_chunk = std::min(out.size() - out_done, kZlibChunk);
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data() + in_done));
    zs.avail_in = uInt(in_chunk);
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + out_done);
    zs.avail_out = uInt(out_chunk);
    const bool last = in_done + in_chunk == data.size();
    const int rc = deflate(&zs, last ? Z_FINISH : Z_NO_FLUSH);
    in_done += in_chunk - zs.avail_in;
    out_done += out_chunk - zs.avail_out;
    if (rc == Z_STREAM_END) break;
    FUSEBOX_CHECK(rc == Z_OK || rc == Z_BUF_ERROR, "zip", "deflate failed (zlib error ", rc, ")");
  }
  out.resize(out_done);
  return out;
}

uint32_t crc32_of(std::string_view data) {
  return uint32_t(
      crc32_z(crc32(0, nullptr, 0), reinterpret_cast<const Bytef*>(data.data()), data.size()));
}

}  // namespace

std::vector<ZipMember> read_zip(const std::string& bytes, const std::string& where) {
  const ByteReader in(bytes, where);
  const Directory dir = find_directory(in);
  std::vector<ZipMember> members;
  std::set<std::string> names;
  uint64_t pos = dir.offset;
  for (uint64_t i = 0; i < dir.entries; ++i) {
    FUSEBOX_CHECK(pos + kCentralSize <= dir.end && in.u32(pos, "central entry") == kCentralSig,
                  where, "bad central directory entry ", i, " at offset ", pos);
    Entry e;
    e.flags = in.u16(pos + 8, "flags");
    e.method = in.u16(pos + 10, "method");
    e.crc = in.u32(pos + 16, "crc");
    e.compressed_size = in.u32(pos + 20, "compressed size");
    e.size = in.u32(pos + 24, "size");
    const uint16_t name_len = in.u16(pos + 28, "name length");
    const uint16_t extra_len = in.u16(pos + 30, "extra length");
    const uint16_t comment_len = in.u16(pos + 32, "comment length");
    e.local_offset = in.u32(pos + 42, "local header offset");
    const uint64_t entry_end = pos + kCentralSize + name_len + extra_len + comment_len;
    FUSEBOX_CHECK(entry_end <= dir.end, where, "central directory entry ", i,
                  " runs past the directory's end");
    e.name = std::string(in.bytes(pos + kCentralSize, name_len, "name"));
    apply_zip64_extra(in.bytes(pos + kCentralSize + name_len, extra_len, "extra"), &e, where);
    pos = entry_end;

    const std::string member = cat("member '", e.name, "': ");
    FUSEBOX_CHECK(names.insert(e.name).second, where, member, "duplicate name");
    FUSEBOX_CHECK(!(e.flags & (kFlagEncrypted | kFlagStrongEncryption)), where, member,
                  "encrypted members are not supported");
    FUSEBOX_CHECK(e.method == kMethodStored || e.method == kMethodDeflate, where, member,
                  "unsupported compression method ", e.method, " (supported: 0 stored, 8 deflate)");

    // The local header only tells where the data starts.
    FUSEBOX_CHECK(in.contains(e.local_offset, kLocalSize) &&
                      in.u32(e.local_offset, "local header") == kLocalSig,
                  where, member, "bad local header at offset ", e.local_offset);
    const uint64_t data_offset = e.local_offset + kLocalSize +
                                 in.u16(e.local_offset + 26, "name length") +
                                 in.u16(e.local_offset + 28, "extra length");
    FUSEBOX_CHECK(data_offset <= dir.offset && dir.offset - data_offset >= e.compressed_size, where,
                  member, e.compressed_size, " bytes of data at offset ", data_offset,
                  " run past the start of the central directory (offset ", dir.offset, ")");
    const std::string_view stored = in.bytes(data_offset, e.compressed_size, "member data");

    ZipMember m{e.name, {}};
    if (e.method == kMethodStored) {
      FUSEBOX_CHECK(e.compressed_size == e.size, where, member,
                    "stored member has compressed size ", e.compressed_size, " but size ", e.size);
      m.data = std::string(stored);
    } else {
      m.data = inflate_member(stored, e.size, where, e.name);
    }
    const uint32_t crc = crc32_of(m.data);
    FUSEBOX_CHECK(crc == e.crc, where, member, "CRC-32 mismatch (computed ", crc,
                  ", the directory says ", e.crc, ")");
    members.push_back(std::move(m));
  }
  return members;
}

std::string write_zip(const std::vector<ZipMember>& members, const ZipWriteOptions& options) {
  struct Written {
    const ZipMember* member;
    uint16_t flags, method;
    uint32_t crc;
    uint64_t compressed_size, local_offset;
    bool zip64;
  };
  std::vector<Written> written;
  std::set<std::string> names;
  std::string out;
  // A fixed timestamp (1980-01-01 00:00, the DOS epoch) keeps archives reproducible.
  const uint16_t dos_time = 0, dos_date = (1 << 5) | 1;
  for (const ZipMember& m : members) {
    FUSEBOX_CHECK(!m.name.empty() && m.name.size() <= kMax16, "zip",
                  "member names must have 1 to 65535 bytes");
    FUSEBOX_CHECK(names.insert(m.name).second, "zip", "duplicate member name '", m.name, "'");
    const bool non_ascii = std::any_of(
        m.name.begin(), m.name.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; });
    Written w{&m,
              uint16_t(non_ascii ? kFlagUtf8 : 0),
              options.compress ? kMethodDeflate : kMethodStored,
              crc32_of(m.data),
              0,
              out.size(),
              false};
    const std::string compressed = options.compress ? deflate_member(m.data) : std::string();
    const std::string& payload = options.compress ? compressed : m.data;
    w.compressed_size = payload.size();
    w.zip64 = options.force_zip64 || m.data.size() >= kMax32 || payload.size() >= kMax32 ||
              w.local_offset >= kMax32;

    put_u32(&out, kLocalSig);
    put_u16(&out, w.zip64 ? 45 : 20);  // version needed: 4.5 for zip64, 2.0 for deflate
    put_u16(&out, w.flags);
    put_u16(&out, w.method);
    put_u16(&out, dos_time);
    put_u16(&out, dos_date);
    put_u32(&out, w.crc);
    put_u32(&out, w.zip64 ? kMax32 : uint32_t(w.compressed_size));
    put_u32(&out, w.zip64 ? kMax32 : uint32_t(m.data.size()));
    put_u16(&out, uint16_t(m.name.size()));
    put_u16(&out, w.zip64 ? 20 : 0);
    out += m.name;
    if (w.zip64) {
      put_u16(&out, kZip64ExtraId);
      put_u16(&out, 16);
      put_u64(&out, m.data.size());
      put_u64(&out, w.compressed_size);
    }
    out += payload;
    written.push_back(w);
  }

  const uint64_t dir_offset = out.size();
  for (const Written& w : written) {
    put_u32(&out, kCentralSig);
    put_u16(&out, w.zip64 ? 45 : 20);  // version made by
    put_u16(&out, w.zip64 ? 45 : 20);  // version needed
    put_u16(&out, w.flags);
    put_u16(&out, w.method);
    put_u16(&out, dos_time);
    put_u16(&out, dos_date);
    put_u32(&out, w.crc);
    put_u32(&out, w.zip64 ? kMax32 : uint32_t(w.compressed_size));
    put_u32(&out, w.zip64 ? kMax32 : uint32_t(w.member->data.size()));
    put_u16(&out, uint16_t(w.member->name.size()));
    put_u16(&out, w.zip64 ? 28 : 0);
    put_u16(&out, 0);  // comment length
    put_u16(&out, 0);  // disk number
    put_u16(&out, 0);  // internal attributes
    put_u32(&out, 0);  // external attributes
    put_u32(&out, w.zip64 ? kMax32 : uint32_t(w.local_offset));
    out += w.member->name;
    if (w.zip64) {
      put_u16(&out, kZip64ExtraId);
      put_u16(&out, 24);
      put_u64(&out, w.member->data.size());
      put_u64(&out, w.compressed_size);
      put_u64(&out, w.local_offset);
    }
  }
  const uint64_t dir_size = out.size() - dir_offset;
  const uint64_t count = written.size();
  const bool zip64 = options.force_zip64 || count >= kMax16 || dir_size >= kMax32 ||
                     dir_offset >= kMax32 ||
                     std::any_of(written.begin(), written.end(), [](auto& w) { return w.zip64; });
  if (zip64) {
    const uint64_t record = out.size();
    put_u32(&out, kZip64EndSig);
    put_u64(&out, kZip64EndSize - 12);  // size of the rest of the record
    put_u16(&out, 45);
    put_u16(&out, 45);
    put_u32(&out, 0);  // this disk
    put_u32(&out, 0);  // central directory disk
    put_u64(&out, count);
    put_u64(&out, count);
    put_u64(&out, dir_size);
    put_u64(&out, dir_offset);
    put_u32(&out, kZip64LocatorSig);
    put_u32(&out, 0);
    put_u64(&out, record);
    put_u32(&out, 1);  // total disks
  }
  put_u32(&out, kEndSig);
  put_u16(&out, 0);
  put_u16(&out, 0);
  put_u16(&out, zip64 ? kMax16 : uint16_t(count));
  put_u16(&out, zip64 ? kMax16 : uint16_t(count));
  put_u32(&out, zip64 ? kMax32 : uint32_t(dir_size));
  put_u32(&out, zip64 ? kMax32 : uint32_t(dir_offset));
  put_u16(&out, 0);  // comment length
  return out;
}

}  // namespace fusebox::io
