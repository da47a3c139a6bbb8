// .npy reading and writing: round trips, numpy's own files, hand-built big-endian and
// Fortran-order files, header parsing (tolerated variants and every broken field).
#include <algorithm>
#include <cstring>

#include "fusebox/io/tensor_file.h"
#include "io_test_util.h"
#include "testing.h"

namespace fusebox {
namespace {

using iotest::same_tensor;

// A .npy file: magic, version, header padded with spaces and '\n' to 64 bytes, data.
std::string npy_file(const std::string& header, const std::string& data, int major = 1) {
  std::string out("\x93NUMPY", 6);
  out += char(major);
  out += char(0);
  const size_t prefix = major == 1 ? 10 : 12;
  std::string padded = header;
  while ((prefix + padded.size() + 1) % 64 != 0) padded += ' ';
  padded += '\n';
  const uint32_t len = uint32_t(padded.size());
  out.append(reinterpret_cast<const char*>(&len), major == 1 ? 2 : 4);
  return out + padded + data;
}

template <class T>
std::string le_bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

template <class T>
std::string be_bytes(const std::vector<T>& values) {
  std::string s = le_bytes(values);
  for (size_t i = 0; i < s.size(); i += sizeof(T))
    std::reverse(s.begin() + i, s.begin() + i + sizeof(T));
  return s;
}

Tensor sample(DType dtype, const Shape& shape, uint64_t seed) {
  return testing::random_tensor(dtype, shape, seed, -100.0, 100.0);
}

TEST(Npy, RoundTripsEveryDtypeAndRank) {
  uint64_t seed = 1;
  int checked = 0;
  for (DType dtype : iotest::kAllDTypes) {
    for (const Shape& shape : iotest::round_trip_shapes()) {
      SCOPED_TRACE(cat(dtype_name(dtype), " ", shape_str(shape)));
      const Tensor t = sample(dtype, shape, seed++);
      const std::string bytes = serialize_npy(t);
      // numpy's layout: version 1.0, the data starting at a multiple of 64 after a '\n'.
      ASSERT_GE(bytes.size(), t.nbytes() + 64);
      const size_t data_offset =
          bytes.size() - (dtype == DType::bf16 ? t.nbytes() * 2 : t.nbytes());
      EXPECT_EQ(data_offset % 64, 0u);
      EXPECT_EQ(bytes[data_offset - 1], '\n');
      EXPECT_EQ(bytes[6], 1);
      const Tensor back = parse_npy(bytes, "test");
      // numpy has no bfloat16: bf16 comes back as the (exactly equal) f32 values.
      EXPECT_TRUE(same_tensor(back, dtype == DType::bf16 ? t.cast(DType::f32) : t));
      ++checked;
    }
  }
  EXPECT_EQ(checked, 70);
}

TEST(Npy, FileRoundTrip) {
  iotest::ScratchDir dir;
  const Tensor t = sample(DType::f32, {3, 4}, 7);
  write_npy(dir.file("t.npy"), t);
  EXPECT_TRUE(same_tensor(read_npy(dir.file("t.npy")), t));
  // Overwriting replaces the file.
  const Tensor u = sample(DType::i64, {2}, 8);
  write_npy(dir.file("t.npy"), u);
  EXPECT_TRUE(same_tensor(read_npy(dir.file("t.npy")), u));
}

TEST(Npy, WritesWhatNumpyWrites) {
  const Tensor expected =
      Tensor::from_vector<float>({2, 3}, {-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f});
  EXPECT_EQ(serialize_npy(expected), read_file(iotest::fixture("f32_2x3.npy")));
}

TEST(Npy, ReadsNumpyFiles) {
  EXPECT_TRUE(same_tensor(read_npy(iotest::fixture("f32_2x3.npy")),
                          Tensor::from_vector<float>({2, 3}, {-1, -0.5, 0, 0.5, 1, 1.5})));
  std::vector<double> iota(12);
  for (int i = 0; i < 12; ++i) iota[size_t(i)] = i;
  EXPECT_TRUE(same_tensor(read_npy(iotest::fixture("f64_fortran_2x3x2.npy")),
                          Tensor::from_vector<double>({2, 3, 2}, iota)));
  EXPECT_TRUE(same_tensor(read_npy(iotest::fixture("i8_big_endian.npy")),
                          Tensor::from_vector<int64_t>({3}, {1, -2, int64_t(3) << 40})));
  EXPECT_TRUE(same_tensor(read_npy(iotest::fixture("bool_2x2.npy")),
                          Tensor::from_doubles(DType::boolean, {2, 2}, {1, 0, 0, 1})));
  EXPECT_TRUE(same_tensor(read_npy(iotest::fixture("f16_scalar.npy")),
                          Tensor::from_vector<Half>({}, {Half(1.5f)})));
  EXPECT_TRUE(same_tensor(read_npy(iotest::fixture("i4_zero_size.npy")),
                          Tensor::zeros(DType::i32, {0, 3})));
}

TEST(Npy, ReadsBigEndian) {
  const std::string header_end = "', 'fortran_order': False, 'shape': (3,), }";
  EXPECT_TRUE(same_tensor(
      parse_npy(npy_file("{'descr': '>f8" + header_end, be_bytes<double>({1.5, -2, 1e300})), "t"),
      Tensor::from_vector<double>({3}, {1.5, -2, 1e300})));
  EXPECT_TRUE(same_tensor(
      parse_npy(npy_file("{'descr': '>f4" + header_end, be_bytes<float>({1.5f, -2, 3e30f})), "t"),
      Tensor::from_vector<float>({3}, {1.5f, -2, 3e30f})));
  EXPECT_TRUE(same_tensor(
      parse_npy(
          npy_file("{'descr': '>f2" + header_end, be_bytes<uint16_t>({0x3e00, 0xc000, 0x7bff})),
          "t"),
      Tensor::from_vector<Half>({3}, {Half(1.5f), Half(-2.0f), Half(65504.0f)})));
  EXPECT_TRUE(same_tensor(
      parse_npy(npy_file("{'descr': '>i8" + header_end, be_bytes<int64_t>({1, -2, 1ll << 50})),
                "t"),
      Tensor::from_vector<int64_t>({3}, {1, -2, 1ll << 50})));
  EXPECT_TRUE(same_tensor(
      parse_npy(npy_file("{'descr': '>i4" + header_end, be_bytes<int32_t>({1, -2, 1 << 30})), "t"),
      Tensor::from_vector<int32_t>({3}, {1, -2, 1 << 30})));
  // One-byte types have no byte order; any marker is accepted.
  EXPECT_TRUE(
      same_tensor(parse_npy(npy_file("{'descr': '>b1" + header_end, std::string("\1\0\1", 3)), "t"),
                  Tensor::from_doubles(DType::boolean, {3}, {1, 0, 1})));
}

TEST(Npy, ReadsFortranOrder) {
  // Element (i, j, k) of a 2x3x4 array sits at i + 2j + 6k in Fortran order.
  std::vector<int32_t> column_major(24), row_major(24);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) {
        column_major[size_t(i + 2 * j + 6 * k)] = 100 * i + 10 * j + k;
        row_major[size_t(12 * i + 4 * j + k)] = 100 * i + 10 * j + k;
      }
    }
  }
  const Tensor expected = Tensor::from_vector<int32_t>({2, 3, 4}, row_major);
  EXPECT_TRUE(same_tensor(
      parse_npy(npy_file("{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3, 4), }",
                         le_bytes(column_major)),
                "t"),
      expected));
  // Big-endian and Fortran order together.
  EXPECT_TRUE(same_tensor(
      parse_npy(npy_file("{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3, 4), }",
                         be_bytes(column_major)),
                "t"),
      expected));
  // Rank 0 and 1 read the same in either order; zero-size too.
  EXPECT_TRUE(
      same_tensor(parse_npy(npy_file("{'descr': '<i4', 'fortran_order': True, 'shape': (3,), }",
                                     le_bytes<int32_t>({4, 5, 6})),
                            "t"),
                  Tensor::from_vector<int32_t>({3}, {4, 5, 6})));
  EXPECT_TRUE(
      same_tensor(parse_npy(npy_file("{'descr': '<i4', 'fortran_order': True, 'shape': (), }",
                                     le_bytes<int32_t>({9})),
                            "t"),
                  Tensor::from_vector<int32_t>({}, {9})));
  EXPECT_TRUE(same_tensor(
      parse_npy(npy_file("{'descr': '<i4', 'fortran_order': True, 'shape': (2, 0), }", ""), "t"),
      Tensor::zeros(DType::i32, {2, 0})));
}

// Bytes ('|u1', numpy's uint8 images) widen to i32, the IR having no u8; Fortran order too.
TEST(Npy, ReadsBytesAsI32) {
  const std::string bytes = {char(0), char(7), char(128), char(255), char(1), char(2)};
  EXPECT_TRUE(same_tensor(
      parse_npy(npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }", bytes),
                "t"),
      Tensor::from_vector<int32_t>({2, 3}, {0, 7, 128, 255, 1, 2})));
  EXPECT_TRUE(same_tensor(
      parse_npy(npy_file("{'descr': '|u1', 'fortran_order': True, 'shape': (2, 3), }", bytes), "t"),
      Tensor::from_vector<int32_t>({2, 3}, {0, 128, 1, 7, 255, 2})));
}

TEST(Npy, ToleratesHeaderVariants) {
  const Tensor expected = Tensor::from_vector<int32_t>({2, 1}, {7, -7});
  const std::string data = le_bytes<int32_t>({7, -7});
  for (const char* header : {
           "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 1), }",
           "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 1)}",
           "{\"descr\": \"<i4\", \"fortran_order\": False, \"shape\": (2, 1)}",
           "{'shape': (2, 1), 'fortran_order': False, 'descr': '<i4'}",
           "  {\t'descr' :'<i4' ,\n'fortran_order':False,'shape':( 2 , 1 , ) , }  ",
           "{'descr': '=i4', 'fortran_order': False, 'shape': (2L, 1L), }",
       }) {
    SCOPED_TRACE(header);
    EXPECT_TRUE(same_tensor(parse_npy(npy_file(header, data), "t"), expected));
  }
  // A bool marked '<' (numpy writes '|').
  EXPECT_TRUE(
      same_tensor(parse_npy(npy_file("{'descr': '<b1', 'fortran_order': False, 'shape': (2,), }",
                                     std::string("\0\1", 2)),
                            "t"),
                  Tensor::from_doubles(DType::boolean, {2}, {0, 1})));
  // Any nonzero byte is True, and reads back as a proper bool.
  const Tensor b = parse_npy(
      npy_file("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", "\x02\xff"), "t");
  EXPECT_EQ(static_cast<const uint8_t*>(b.raw())[0], 1);
  EXPECT_EQ(static_cast<const uint8_t*>(b.raw())[1], 1);
}

TEST(Npy, ReadsVersions2And3) {
  const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  const Tensor expected = Tensor::from_vector<float>({2}, {0.25f, 8});
  for (int major : {2, 3}) {
    const std::string bytes = npy_file(header, le_bytes<float>({0.25f, 8}), major);
    EXPECT_EQ((bytes.size() - 8) % 64, 0u);
    EXPECT_TRUE(same_tensor(parse_npy(bytes, "t"), expected));
  }
}

TEST(Npy, WritesVersion2WhenTheHeaderIsLong) {
  // 22000 unit extents make a shape tuple longer than a 1.0 header's u16 length allows.
  const Tensor t = Tensor::full(DType::f32, Shape(22000, 1), 3.0);
  const std::string bytes = serialize_npy(t);
  EXPECT_EQ(bytes[6], 2);
  uint32_t header_len;
  std::memcpy(&header_len, bytes.data() + 8, 4);
  EXPECT_GT(header_len, 65535u);
  EXPECT_EQ((12 + header_len) % 64, 0u);
  EXPECT_TRUE(same_tensor(parse_npy(bytes, "t"), t));
}

TEST(Npy, RejectsBrokenHeaders) {
  const std::string data = le_bytes<float>({1, 2});
  const struct {
    const char* header;
    const char* error;
  } cases[] = {
      {"", "header ends early"},
      {"['descr']", "expected the header to start with '{'"},
      {"{'descr': '<f4', 'fortran_order': False}", "missing 'shape'"},
      {"{'descr': '<f4', 'shape': (2,)}", "missing 'fortran_order'"},
      {"{'fortran_order': False, 'shape': (2,)}", "missing 'descr'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",
       "duplicate key 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}",
       "unexpected key 'extra'"},
      {"{descr: '<f4', 'fortran_order': False, 'shape': (2,)}", "expected a key"},
      {"{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}", "expected ':'"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", "expected ',' or '}'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", "header ends early"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", "unexpected text after"},
      {"{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", "unsupported dtype '<f4, '"},
      {"{'descr': '<f4\\'', 'fortran_order': False, 'shape': (2,)}", "escapes"},
      {"{'descr': 3, 'fortran_order': False, 'shape': (2,)}", "expected 'descr' as a quoted"},
      {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", "structured dtypes"},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (2,)}", "unsupported dtype '<u2'"},
      {"{'descr': '<i2', 'fortran_order': False, 'shape': (2,)}", "unsupported dtype '<i2'"},
      {"{'descr': '<c8', 'fortran_order': False, 'shape': (2,)}", "unsupported dtype '<c8'"},
      {"{'descr': '|f4', 'fortran_order': False, 'shape': (2,)}", "unsupported dtype '|f4'"},
      {"{'descr': 'f4', 'fortran_order': False, 'shape': (2,)}", "unsupported dtype 'f4'"},
      {"{'descr': '', 'fortran_order': False, 'shape': (2,)}", "unsupported dtype ''"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", "expected True or False"},
      {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2,)}", "expected ',' or '}'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': 2}", "expected a tuple for 'shape'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", "expected a tuple for 'shape'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", "needs a trailing comma"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", "non-negative integer"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (,)}", "non-negative integer"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 1)}", "expected ',' or ')'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2.0,)}", "expected ',' or ')'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
       "extent too large"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.header);
    EXPECT_IO_ERROR(parse_npy(npy_file(c.header, data), "npy: bad.npy"), c.error);
    EXPECT_IO_ERROR(parse_npy(npy_file(c.header, data), "npy: bad.npy"), "[npy: bad.npy] ");
  }
}

TEST(Npy, RejectsBrokenPreambles) {
  const std::string good = npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                                    le_bytes<float>({1, 2}));
  EXPECT_IO_ERROR(parse_npy("", "t"), "not a .npy file");
  EXPECT_IO_ERROR(parse_npy(good.substr(0, 9), "t"), "not a .npy file");
  std::string bad = good;
  bad[1] = 'M';
  EXPECT_IO_ERROR(parse_npy(bad, "t"), "not a .npy file");
  bad = good;
  bad[6] = 4;
  EXPECT_IO_ERROR(parse_npy(bad, "t"), "unsupported .npy format version 4.0");
  bad = good;
  bad[7] = 1;
  EXPECT_IO_ERROR(parse_npy(bad, "t"), "unsupported .npy format version 1.1");
  // A header length past the end of the file.
  bad = good;
  iotest::set_u16(&bad, 8, 0xfff0);
  EXPECT_IO_ERROR(parse_npy(bad, "t"), "header (65520 bytes at offset 10) runs past the end");
  // Version 2's u32 length, absurdly large.
  bad = npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                 le_bytes<float>({1, 2}), 2);
  iotest::set_u32(&bad, 8, 0xfffffff0u);
  EXPECT_IO_ERROR(parse_npy(bad, "t"), "implausibly large");
}

TEST(Npy, ChecksTheDataSize) {
  const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  const std::string data = le_bytes<float>({1, 2, 3, 4, 5, 6});
  EXPECT_IO_ERROR(parse_npy(npy_file(header, data.substr(0, 20)), "t"),
                  "expected 24 bytes of data (shape [2, 3] of f32), file has 20");
  EXPECT_IO_ERROR(parse_npy(npy_file(header, ""), "t"), "expected 24 bytes of data");
  EXPECT_IO_ERROR(parse_npy(npy_file(header, data + "x"), "t"), "file has 25");
  // Sizes that overflow are refused before anything is allocated; so are sizes the file
  // does not have.
  EXPECT_IO_ERROR(
      parse_npy(npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, "
                         "4294967296, 4294967296), }",
                         data),
                "t"),
      "shape [4294967296, 4294967296, 4294967296] of f64 is impossibly large");
  EXPECT_IO_ERROR(
      parse_npy(
          npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (100000000000,), }", data),
          "t"),
      "expected 800000000000 bytes of data (shape [100000000000] of f64), file has 24");
  // A zero extent beside huge ones: zero bytes, but the extents must not overflow later.
  EXPECT_IO_ERROR(
      parse_npy(npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (0, 4294967296, "
                         "4294967296), }",
                         ""),
                "t"),
      "impossibly large");
}

TEST(Npy, FileErrorsNameTheFile) {
  iotest::ScratchDir dir;
  const std::string good = serialize_npy(Tensor::zeros(DType::f32, {4}));
  write_file_atomic(dir.file("cut.npy"), good.substr(0, good.size() - 3));
  EXPECT_IO_ERROR(read_npy(dir.file("cut.npy")),
                  cat("[npy: ", dir.file("cut.npy"), "] expected 16 bytes of data"));
  EXPECT_IO_ERROR(read_npy(dir.file("missing.npy")),
                  cat("[read: ", dir.file("missing.npy"), "] cannot open: No such file"));
  EXPECT_IO_ERROR(serialize_npy(Tensor()), "undefined tensor");
}

}  // namespace
}  // namespace fusebox
