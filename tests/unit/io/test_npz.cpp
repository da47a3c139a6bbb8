// .npz (zip) reading and writing: round trips stored / deflated / zip64, numpy's own
// archives, and corrupt archives of every kind.
#include "fusebox/io/tensor_file.h"
#include "io/zip.h"
#include "io_test_util.h"
#include "testing.h"

namespace fusebox {
namespace {

using iotest::same_tensor;
using iotest::set_u16;
using iotest::set_u32;

const std::string kCentralSig("PK\x01\x02", 4);
const std::string kEndSig("PK\x05\x06", 4);
const std::string kZip64EndSig("PK\x06\x06", 4);

// Field offsets inside a central directory entry and the end record.
constexpr size_t kCentralFlags = 8, kCentralMethod = 10, kCentralCompressed = 20, kCentralSize = 24,
                 kCentralNameLen = 28, kCentralLocalOffset = 42;
constexpr size_t kEndDisk = 4, kEndDiskEntries = 8, kEndEntries = 10, kEndDirSize = 12,
                 kEndDirOffset = 16;

std::map<std::string, Tensor> sample_arrays() {
  std::map<std::string, Tensor> arrays;
  uint64_t seed = 100;
  for (DType dtype : iotest::kAllDTypes) {
    for (const Shape& shape : iotest::round_trip_shapes()) {
      arrays[cat(dtype_name(dtype), "_", shape.size(), "_", numel(shape), "_", seed)] =
          testing::random_tensor(dtype, shape, seed, -50, 50);
      ++seed;
    }
  }
  return arrays;
}

// What reading back should give: bf16 arrays come back as f32 (numpy has no bfloat16).
void expect_same_arrays(const std::map<std::string, Tensor>& actual,
                        const std::map<std::string, Tensor>& written) {
  ASSERT_EQ(actual.size(), written.size());
  for (const auto& [key, t] : written) {
    SCOPED_TRACE(key);
    ASSERT_TRUE(actual.count(key));
    EXPECT_TRUE(same_tensor(actual.at(key), t.dtype() == DType::bf16 ? t.cast(DType::f32) : t));
  }
}

TEST(Npz, RoundTripsStoredAndDeflated) {
  const auto arrays = sample_arrays();
  ASSERT_EQ(arrays.size(), 70u);
  const std::string stored = serialize_npz(arrays, false);
  const std::string deflated = serialize_npz(arrays, true);
  EXPECT_LT(deflated.size(), stored.size());
  expect_same_arrays(parse_npz(stored, "t"), arrays);
  expect_same_arrays(parse_npz(deflated, "t"), arrays);
  // No zip64 records unless needed.
  EXPECT_EQ(stored.find(kZip64EndSig), std::string::npos);

  iotest::ScratchDir dir;
  write_npz(dir.file("a.npz"), arrays);
  write_npz(dir.file("b.npz"), arrays, /*compress=*/true);
  expect_same_arrays(read_npz(dir.file("a.npz")), arrays);
  expect_same_arrays(read_npz(dir.file("b.npz")), arrays);
  EXPECT_EQ(read_file(dir.file("a.npz")), stored);  // writing is deterministic

  EXPECT_TRUE(parse_npz(serialize_npz({}), "t").empty());
}

TEST(Npz, RoundTripsZip64) {
  const auto arrays = sample_arrays();
  std::vector<io::ZipMember> members;
  for (const auto& [key, t] : arrays) members.push_back({key + ".npy", serialize_npy(t)});
  for (bool compress : {false, true}) {
    const std::string bytes = io::write_zip(members, {.compress = compress, .force_zip64 = true});
    EXPECT_NE(bytes.find(kZip64EndSig), std::string::npos);
    expect_same_arrays(parse_npz(bytes, "t"), arrays);
  }
}

TEST(Npz, ReadsNumpyArchives) {
  // numpy.savez writes zip64 extra fields into every local header.
  for (const char* name : {"savez.npz", "savez_compressed.npz"}) {
    SCOPED_TRACE(name);
    const auto arrays = read_npz(iotest::fixture(name));
    ASSERT_EQ(arrays.size(), 2u);
    EXPECT_TRUE(same_tensor(arrays.at("a"),
                            Tensor::from_vector<float>({2, 3}, {-1, -0.5, 0, 0.5, 1, 1.5})));
    EXPECT_TRUE(same_tensor(arrays.at("b"), Tensor::from_vector<int64_t>({3}, {7, 8, 9})));
  }
}

TEST(Npz, ZipMembersKeepNamesAndBytes) {
  const std::vector<io::ZipMember> members = {
      {"empty", ""}, {"dir/ü.bin", std::string("\0\1\2", 3)}, {"big", std::string(100000, 'z')}};
  for (bool compress : {false, true}) {
    const auto back = io::read_zip(io::write_zip(members, {.compress = compress}), "t");
    ASSERT_EQ(back.size(), members.size());
    for (size_t i = 0; i < members.size(); ++i) {
      EXPECT_EQ(back[i].name, members[i].name);
      EXPECT_EQ(back[i].data, members[i].data);
    }
  }
  EXPECT_IO_ERROR(io::write_zip({{"a", "1"}, {"a", "2"}}, {}), "duplicate member name 'a'");
  EXPECT_IO_ERROR(io::write_zip({{"", "1"}}, {}), "1 to 65535 bytes");
  EXPECT_IO_ERROR(serialize_npz({{"", Tensor::zeros(DType::f32, {1})}}), "must not be empty");
}

class NpzCorruption : public ::testing::Test {
 protected:
  // Two stored members, "a.npy" and "b.npy".
  std::string archive(bool compress = false) const {
    return serialize_npz({{"a", Tensor::from_vector<float>({4}, {1, 2, 3, 4})},
                          {"b", Tensor::from_vector<int32_t>({2}, {5, 6})}},
                         compress);
  }
  static size_t central(const std::string& zip) { return zip.find(kCentralSig); }
  static size_t end(const std::string& zip) { return zip.rfind(kEndSig); }
  static std::string parse_error(const std::string& bytes) {
    return iotest::error_message([&] { parse_npz(bytes, "npz: t.npz"); });
  }
};

#define EXPECT_NPZ_ERROR(bytes, text) EXPECT_IO_ERROR(parse_npz(bytes, "npz: t.npz"), text)

TEST_F(NpzCorruption, GoodArchiveReads) {
  EXPECT_EQ(parse_npz(archive(), "t").size(), 2u);
  EXPECT_EQ(parse_npz(archive(true), "t").size(), 2u);
}

TEST_F(NpzCorruption, NotAZip) {
  EXPECT_NPZ_ERROR("", "[npz: t.npz] not a zip archive");
  EXPECT_NPZ_ERROR(std::string(1000, 'x'), "no end-of-central-directory record");
  // Truncation anywhere before the end record loses it.
  const std::string zip = archive();
  EXPECT_NPZ_ERROR(zip.substr(0, central(zip) + 10), "no end-of-central-directory record");
  EXPECT_NPZ_ERROR(zip.substr(0, zip.size() - 1), "no end-of-central-directory record");
}

TEST_F(NpzCorruption, CrcMismatch) {
  std::string zip = archive();
  // The last byte of member a's data: its float 4.0 ends in 0x40.
  const size_t b_local = zip.find("PK\x03\x04", 4);
  ASSERT_EQ(zip[b_local - 1], '\x40');
  zip[b_local - 1] ^= 1;
  EXPECT_NPZ_ERROR(zip, "[npz: t.npz] member 'a.npy': CRC-32 mismatch");
}

TEST_F(NpzCorruption, BadSignatures) {
  std::string zip = archive();
  zip[0] = 'X';
  EXPECT_NPZ_ERROR(zip, "member 'a.npy': bad local header at offset 0");
  zip = archive();
  zip[central(zip) + 1] = 'X';
  EXPECT_NPZ_ERROR(zip, "bad central directory entry 0");
}

TEST_F(NpzCorruption, DirectoryFieldsOutOfRange) {
  const std::string good = archive();
  const size_t cd = central(good), eocd = end(good);
  std::string zip = good;
  set_u32(&zip, eocd + kEndDirSize, uint32_t(eocd - cd + 1));
  EXPECT_NPZ_ERROR(zip, "does not end where the end record starts");
  zip = good;
  set_u32(&zip, eocd + kEndDirOffset, 0x7ffffff0);
  EXPECT_NPZ_ERROR(zip, "does not end where the end record starts");
  zip = good;
  set_u16(&zip, eocd + kEndEntries, 7);
  set_u16(&zip, eocd + kEndDiskEntries, 7);
  EXPECT_NPZ_ERROR(zip, "cannot hold 7 entries");
  // One entry with a long name leaves room in the directory for the size of a second.
  zip = serialize_npz({{std::string(60, 'k'), Tensor::zeros(DType::f32, {1})}});
  set_u16(&zip, end(zip) + kEndEntries, 2);
  set_u16(&zip, end(zip) + kEndDiskEntries, 2);
  EXPECT_NPZ_ERROR(zip, "bad central directory entry 1");
  zip = good;
  set_u16(&zip, eocd + kEndDisk, 1);
  EXPECT_NPZ_ERROR(zip, "multi-disk zip archives are not supported");
  zip = good;
  set_u16(&zip, eocd + kEndEntries, 0xffff);
  set_u16(&zip, eocd + kEndDiskEntries, 0xffff);
  EXPECT_NPZ_ERROR(zip, "zip64 end-of-central-directory locator missing");
}

TEST_F(NpzCorruption, EntryFieldsOutOfRange) {
  const std::string good = archive();
  const size_t cd = central(good);
  std::string zip = good;
  set_u32(&zip, cd + kCentralLocalOffset, 0x7fffffff);
  EXPECT_NPZ_ERROR(zip, "member 'a.npy': bad local header at offset 2147483647");
  zip = good;
  set_u32(&zip, cd + kCentralCompressed, 0x7fffffff);
  EXPECT_NPZ_ERROR(zip, "run past the start of the central directory");
  zip = good;
  set_u16(&zip, cd + kCentralNameLen, 0xffff);
  EXPECT_NPZ_ERROR(zip, "central directory entry 0 runs past the directory's end");
  zip = good;
  set_u32(&zip, cd + kCentralSize, 7);
  EXPECT_NPZ_ERROR(zip, "stored member has compressed size");
  // A local header whose extra length points past the data.
  zip = good;
  set_u16(&zip, 28, 0xffff);
  EXPECT_NPZ_ERROR(zip, "run past the start of the central directory");
  // Sentinels without a zip64 extra field.
  zip = good;
  set_u32(&zip, cd + kCentralCompressed, 0xffffffff);
  EXPECT_NPZ_ERROR(zip, "member 'a.npy'");
}

TEST_F(NpzCorruption, MethodsAndFlags) {
  std::string zip = archive();
  set_u16(&zip, central(zip) + kCentralMethod, 12);
  EXPECT_NPZ_ERROR(zip, "member 'a.npy': unsupported compression method 12");
  zip = archive();
  set_u16(&zip, central(zip) + kCentralFlags, 1);
  EXPECT_NPZ_ERROR(zip, "member 'a.npy': encrypted members are not supported");
}

TEST_F(NpzCorruption, BadDeflateData) {
  const std::string good = archive(true);
  const size_t cd = central(good);
  const size_t data = 30 + 5;  // local header + "a.npy", no extra field
  std::string zip = good;
  zip[data] = 0x07;  // final block of the reserved type 3
  EXPECT_NPZ_ERROR(zip, "member 'a.npy': corrupt deflate data");
  uint32_t compressed = iotest::get_u32(good, cd + kCentralCompressed);
  uint32_t size = iotest::get_u32(good, cd + kCentralSize);
  zip = good;
  set_u32(&zip, cd + kCentralCompressed, compressed / 2);
  EXPECT_NPZ_ERROR(zip, "member 'a.npy': deflate data is truncated");
  zip = good;
  set_u32(&zip, cd + kCentralSize, size - 1);
  EXPECT_NPZ_ERROR(zip, "member 'a.npy': data inflates to more than the declared size");
  zip = good;
  set_u32(&zip, cd + kCentralSize, size + 1);
  EXPECT_NPZ_ERROR(
      zip, cat("member 'a.npy': inflates to ", size, " bytes, the directory says ", size + 1));
  zip = good;
  set_u32(&zip, cd + kCentralSize, 0x7fffffff);
  EXPECT_NPZ_ERROR(zip, "declared size 2147483647 is impossible");
}

TEST_F(NpzCorruption, Zip64Records) {
  const std::string good = io::write_zip({{"a.npy", serialize_npy(Tensor::zeros(DType::f32, {2}))}},
                                         {.force_zip64 = true});
  ASSERT_EQ(parse_npz(good, "t").size(), 1u);
  std::string zip = good;
  zip[good.find(kZip64EndSig) + 1] = 'X';
  EXPECT_NPZ_ERROR(zip, "bad zip64 end-of-central-directory record");
  // The zip64 extra field cut short (its length says 8, the entry's extra length still 28).
  zip = good;
  const size_t extra = central(good) + 46 + 5;
  set_u16(&zip, extra + 2, 8);
  EXPECT_NPZ_ERROR(zip, "member 'a.npy'");
  zip = good;
  set_u16(&zip, extra + 2, 0xfff0);
  EXPECT_NPZ_ERROR(zip, "member 'a.npy': extra field runs past its end");
}

TEST_F(NpzCorruption, MembersThatAreNotArrays) {
  EXPECT_NPZ_ERROR(io::write_zip({{"readme.txt", "hi"}}, {}),
                   "member 'readme.txt' is not a .npy file");
  EXPECT_NPZ_ERROR(io::write_zip({{".npy", "hi"}}, {}), "member '.npy' is not a .npy file");
  EXPECT_NPZ_ERROR(io::write_zip({{"x.npy", "garbage"}}, {}),
                   "[npz: t.npz member 'x.npy'] not a .npy file");
  // Two members of the same name: rename "b.npy" to "a.npy" in both of its headers.
  std::string zip = archive();
  for (size_t pos = zip.find("b.npy"); pos != std::string::npos; pos = zip.find("b.npy", pos)) {
    zip[pos] = 'a';
  }
  EXPECT_NPZ_ERROR(zip, "member 'a.npy': duplicate name");
}

TEST_F(NpzCorruption, FileErrorsNameTheFile) {
  iotest::ScratchDir dir;
  std::string zip = archive();
  set_u16(&zip, central(zip) + kCentralMethod, 99);
  write_file_atomic(dir.file("bad.npz"), zip);
  EXPECT_IO_ERROR(read_npz(dir.file("bad.npz")),
                  cat("[npz: ", dir.file("bad.npz"), "] member 'a.npy': unsupported"));
}

}  // namespace
}  // namespace fusebox
