// onnx.TensorProto <-> Tensor: raw and typed fields, external data, validation errors,
// and the .pb files of the ONNX backend test data.
#include "io/tensor_proto.h"

#include <filesystem>

#include "fusebox/io/tensor_file.h"
#include "io_test_util.h"
#include "testing.h"

namespace fusebox {
namespace {

namespace fs = std::filesystem;
using iotest::same_tensor;

// Where the ONNX node test data is (tests/CMakeLists.txt: FUSEBOX_ONNX_TESTDATA).
const std::string kOnnxNodeData = FUSEBOX_ONNX_TESTDATA;

onnx::TensorProto proto(onnx::TensorProto::DataType type, const Shape& dims,
                        const std::string& name = "w") {
  onnx::TensorProto p;
  p.set_name(name);
  p.set_data_type(type);
  for (int64_t d : dims) p.add_dims(d);
  return p;
}

TEST(TensorProto, RoundTripsEveryDtypeAndRank) {
  uint64_t seed = 1;
  int checked = 0;
  for (DType dtype : iotest::kAllDTypes) {
    for (const Shape& shape : iotest::round_trip_shapes()) {
      SCOPED_TRACE(cat(dtype_name(dtype), " ", shape_str(shape)));
      const Tensor t = testing::random_tensor(dtype, shape, seed++, -100, 100);
      onnx::TensorProto p;
      p.add_float_data(1);  // cleared by tensor_to_proto
      tensor_to_proto(t, "x", &p);
      EXPECT_EQ(p.name(), "x");
      EXPECT_EQ(p.data_type(), dtype_to_onnx(dtype));
      EXPECT_EQ(p.raw_data().size(), t.nbytes());
      EXPECT_EQ(p.float_data_size(), 0);
      onnx::TensorProto parsed;
      ASSERT_TRUE(parsed.ParseFromString(p.SerializeAsString()));
      EXPECT_TRUE(same_tensor(tensor_from_proto(parsed, "t"), t));
      ++checked;
    }
  }
  EXPECT_EQ(checked, 70);
}

// take_tensor_from_proto: the tensor tensor_from_proto makes, over raw_data's own bytes (not a
// copy; the proto is left without them), bools made 0 / 1; typed fields are copied as before.
TEST(TensorProto, TakingRawDataGivesTheSameTensorWithoutACopy) {
  uint64_t seed = 100;
  for (DType dtype : iotest::kAllDTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    // 51 elements: past a short string's inline bytes, so the data has an address to keep.
    const Tensor t = testing::random_tensor(dtype, {3, 17}, seed++, -100, 100);
    onnx::TensorProto p;
    tensor_to_proto(t, "x", &p);
    if (dtype == DType::boolean) (*p.mutable_raw_data())[4] = char(7);  // true, not as 1
    const Tensor want = tensor_from_proto(p, "t");
    const void* raw = p.raw_data().data();
    const Tensor took = take_tensor_from_proto(p, "t");
    EXPECT_TRUE(same_tensor(took, want));
    EXPECT_EQ(took.raw(), raw);
    EXPECT_TRUE(p.raw_data().empty());
  }
  onnx::TensorProto typed = proto(onnx::TensorProto::FLOAT, {2});
  typed.add_float_data(1.5f);
  typed.add_float_data(-2);
  EXPECT_TRUE(
      same_tensor(take_tensor_from_proto(typed, "t"), Tensor::from_vector<float>({2}, {1.5f, -2})));
  EXPECT_EQ(typed.float_data_size(), 2);
}

TEST(TensorProto, MapsDataTypes) {
  for (DType dtype : iotest::kAllDTypes) {
    DType back;
    ASSERT_TRUE(dtype_from_onnx(dtype_to_onnx(dtype), &back));
    EXPECT_EQ(back, dtype);
  }
  EXPECT_EQ(dtype_to_onnx(DType::f32), onnx::TensorProto::FLOAT);
  EXPECT_EQ(dtype_to_onnx(DType::bf16), onnx::TensorProto::BFLOAT16);
  EXPECT_EQ(dtype_to_onnx(DType::boolean), onnx::TensorProto::BOOL);
  DType unused;
  for (int t : {0, 2, 3, 4, 5, 8, 12, 13, 14, 15, 17, 99, -1}) {
    EXPECT_FALSE(dtype_from_onnx(t, &unused)) << t;
  }
  EXPECT_STREQ(onnx_type_name(onnx::TensorProto::UINT8), "UINT8");
  EXPECT_STREQ(onnx_type_name(onnx::TensorProto::STRING), "STRING");
  EXPECT_STREQ(onnx_type_name(onnx::TensorProto::BFLOAT16), "BFLOAT16");
  EXPECT_STREQ(onnx_type_name(onnx::TensorProto::FLOAT), "FLOAT");
  EXPECT_STREQ(onnx_type_name(0), "UNDEFINED");
  EXPECT_STREQ(onnx_type_name(-1), "UNKNOWN");
  EXPECT_STREQ(onnx_type_name(1000), "UNKNOWN");
}

TEST(TensorProto, ReadsTypedFields) {
  auto p = proto(onnx::TensorProto::FLOAT, {2});
  p.add_float_data(1.5f);
  p.add_float_data(-2);
  EXPECT_TRUE(same_tensor(tensor_from_proto(p, "t"), Tensor::from_vector<float>({2}, {1.5f, -2})));

  p = proto(onnx::TensorProto::DOUBLE, {});
  p.add_double_data(1e300);
  EXPECT_TRUE(same_tensor(tensor_from_proto(p, "t"), Tensor::from_vector<double>({}, {1e300})));

  p = proto(onnx::TensorProto::INT32, {1, 3});
  for (int32_t v : {-7, 0, 1 << 30}) p.add_int32_data(v);
  EXPECT_TRUE(same_tensor(tensor_from_proto(p, "t"),
                          Tensor::from_vector<int32_t>({1, 3}, {-7, 0, 1 << 30})));

  p = proto(onnx::TensorProto::INT64, {2});
  p.add_int64_data(int64_t(1) << 40);
  p.add_int64_data(-1);
  EXPECT_TRUE(same_tensor(tensor_from_proto(p, "t"),
                          Tensor::from_vector<int64_t>({2}, {int64_t(1) << 40, -1})));

  // Half and bfloat16 bits, one per int32 (sign-extended values are accepted too).
  p = proto(onnx::TensorProto::FLOAT16, {3});
  for (int32_t v : {0x3e00, 0xc000, -16384}) p.add_int32_data(v);
  EXPECT_TRUE(same_tensor(tensor_from_proto(p, "t"),
                          Tensor::from_vector<Half>({3}, {Half(1.5f), Half(-2.0f), Half(-2.0f)})));

  p = proto(onnx::TensorProto::BFLOAT16, {2});
  for (int32_t v : {0x3fc0, 0xc000}) p.add_int32_data(v);
  EXPECT_TRUE(same_tensor(tensor_from_proto(p, "t"),
                          Tensor::from_vector<BFloat16>({2}, {BFloat16(1.5f), BFloat16(-2.0f)})));

  p = proto(onnx::TensorProto::BOOL, {3});
  for (int32_t v : {1, 0, 5}) p.add_int32_data(v);
  EXPECT_TRUE(
      same_tensor(tensor_from_proto(p, "t"), Tensor::from_doubles(DType::boolean, {3}, {1, 0, 1})));

  // Raw bool bytes other than 0 and 1 read as true.
  p = proto(onnx::TensorProto::BOOL, {2});
  p.set_raw_data(std::string("\0\x07", 2));
  const Tensor b = tensor_from_proto(p, "t");
  EXPECT_EQ(static_cast<const uint8_t*>(b.raw())[1], 1);

  // Zero-size tensors need no data at all.
  EXPECT_TRUE(same_tensor(tensor_from_proto(proto(onnx::TensorProto::FLOAT, {0, 4}), "t"),
                          Tensor::zeros(DType::f32, {0, 4})));
}

TEST(TensorProto, RejectsWhatItCannotRepresent) {
  for (auto [type, name] : {std::pair{onnx::TensorProto::UINT8, "UINT8 (2)"},
                            std::pair{onnx::TensorProto::INT8, "INT8 (3)"},
                            std::pair{onnx::TensorProto::UINT16, "UINT16 (4)"},
                            std::pair{onnx::TensorProto::INT16, "INT16 (5)"},
                            std::pair{onnx::TensorProto::UINT32, "UINT32 (12)"},
                            std::pair{onnx::TensorProto::UINT64, "UINT64 (13)"},
                            std::pair{onnx::TensorProto::STRING, "STRING (8)"},
                            std::pair{onnx::TensorProto::COMPLEX64, "COMPLEX64 (14)"},
                            std::pair{onnx::TensorProto::UNDEFINED, "UNDEFINED (0)"}}) {
    auto p = proto(type, {1});
    p.set_raw_data("x");
    EXPECT_IO_ERROR(tensor_from_proto(p, "onnx import: m.onnx"),
                    cat("[onnx import: m.onnx] tensor 'w': data type ", name, " is not supported"));
  }
  auto p = proto(onnx::TensorProto::FLOAT, {2});
  p.set_data_type(77);
  EXPECT_IO_ERROR(tensor_from_proto(p, "t"), "data type UNKNOWN (77)");
}

TEST(TensorProto, ValidatesShapeAndData) {
  auto p = proto(onnx::TensorProto::FLOAT, {2, -1});
  EXPECT_IO_ERROR(tensor_from_proto(p, "t"), "tensor 'w': negative extent in dims [2, -1]");

  p = proto(onnx::TensorProto::FLOAT, {int64_t(1) << 40, int64_t(1) << 40});
  p.set_raw_data("abcd");
  EXPECT_IO_ERROR(tensor_from_proto(p, "t"), "impossibly large");

  p = proto(onnx::TensorProto::FLOAT, {2, 3});
  p.set_raw_data(std::string(20, '\0'));
  EXPECT_IO_ERROR(tensor_from_proto(p, "t"),
                  "tensor 'w': raw_data has 20 bytes, f32 of shape [2, 3] needs 24");

  p = proto(onnx::TensorProto::FLOAT, {2, 3});
  for (int i = 0; i < 5; ++i) p.add_float_data(1);
  EXPECT_IO_ERROR(tensor_from_proto(p, "t"),
                  "float_data has 5 values, f32 of shape [2, 3] needs 6");

  p = proto(onnx::TensorProto::FLOAT, {2});
  p.add_int64_data(1);
  p.add_int64_data(2);
  EXPECT_IO_ERROR(tensor_from_proto(p, "t"),
                  "float_data has 0 values, f32 of shape [2] needs 2 (data present in int64_data)");

  p = proto(onnx::TensorProto::FLOAT, {1});
  p.set_raw_data("abcd");
  p.add_float_data(1);
  EXPECT_IO_ERROR(tensor_from_proto(p, "t"), "data in more than one place: raw_data, float_data");

  p = proto(onnx::TensorProto::INT64, {3});
  EXPECT_IO_ERROR(tensor_from_proto(p, "t"), "has no data; i64 of shape [3] needs 3 elements");

  p = proto(onnx::TensorProto::FLOAT16, {1});
  p.add_int32_data(70000);
  EXPECT_IO_ERROR(tensor_from_proto(p, "t"), "int32_data value 70000 is not 16-bit");

  p = proto(onnx::TensorProto::FLOAT, {1});
  p.set_raw_data("abcd");
  p.mutable_segment()->set_begin(0);
  EXPECT_IO_ERROR(tensor_from_proto(p, "t"), "segmented tensors are not supported");

  EXPECT_IO_ERROR(tensor_to_proto(Tensor(), "x", &p), "undefined tensor");
}

class ExternalData : public ::testing::Test {
 protected:
  void SetUp() override {
    // 8 bytes of something else, then four floats.
    const std::vector<float> values = {1, 2, 3, 4};
    write_file_atomic(dir.file("weights.bin"),
                      "prefix.." + std::string(reinterpret_cast<const char*>(values.data()), 16));
    fs::create_directories(dir.path() / "sub");
    write_file_atomic(dir.file("sub/w.bin"),
                      std::string(reinterpret_cast<const char*>(values.data()), 16));
  }
  onnx::TensorProto external(const std::string& location, const std::string& offset,
                             const std::string& length) const {
    auto p = proto(onnx::TensorProto::FLOAT, {2, 2});
    p.set_data_location(onnx::TensorProto::EXTERNAL);
    auto add = [&](const char* key, const std::string& value) {
      auto* e = p.add_external_data();
      e->set_key(key);
      e->set_value(value);
    };
    if (!location.empty()) add("location", location);
    if (!offset.empty()) add("offset", offset);
    if (!length.empty()) add("length", length);
    return p;
  }
  Tensor read(const onnx::TensorProto& p) const {
    return tensor_from_proto(p, "t", dir.path().string());
  }

  iotest::ScratchDir dir;
  const Tensor expected = Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4});
};

TEST_F(ExternalData, Reads) {
  EXPECT_TRUE(same_tensor(read(external("weights.bin", "8", "16")), expected));
  EXPECT_TRUE(same_tensor(read(external("weights.bin", "8", "")), expected));  // to the end
  EXPECT_TRUE(same_tensor(read(external("sub/w.bin", "", "")), expected));
  EXPECT_TRUE(same_tensor(read(external("sub/../sub/./w.bin", "0", "16")), expected));
  // The checksum key and unknown keys are ignored.
  auto p = external("weights.bin", "8", "16");
  auto* e = p.add_external_data();
  e->set_key("checksum");
  e->set_value("abc");
  EXPECT_TRUE(same_tensor(read(p), expected));
  // base_dir with a trailing slash.
  EXPECT_TRUE(same_tensor(
      tensor_from_proto(external("sub/w.bin", "", ""), "t", dir.path().string() + "/"), expected));
}

TEST_F(ExternalData, RefusesPathsOutsideTheBaseDir) {
  EXPECT_IO_ERROR(read(external("../weights.bin", "", "")), "is not inside the model's directory");
  EXPECT_IO_ERROR(read(external("sub/../../x.bin", "", "")), "is not inside the model's directory");
  EXPECT_IO_ERROR(read(external(dir.file("weights.bin"), "8", "")),
                  "is not inside the model's directory");
  EXPECT_IO_ERROR(read(external("/etc/passwd", "", "")), "is not inside the model's directory");
  // A symbolic link inside the directory that points outside it.
  iotest::ScratchDir outside;
  write_file_atomic(outside.file("secret.bin"), std::string(16, 'x'));
  fs::create_symlink(outside.file("secret.bin"), dir.file("link.bin"));
  EXPECT_IO_ERROR(read(external("link.bin", "", "")), "resolves outside");
}

TEST_F(ExternalData, ValidatesRanges) {
  EXPECT_IO_ERROR(read(external("weights.bin", "0", "")),
                  "tensor 'w': external data has 24 bytes, the shape and type need 16");
  EXPECT_NO_THROW(read(external("weights.bin", "4", "16")));  // any in-range offset will do
  EXPECT_IO_ERROR(read(external("weights.bin", "16", "16")), "runs past the end");
  EXPECT_IO_ERROR(read(external("weights.bin", "100", "")), "offset 100 is past the end");
  EXPECT_IO_ERROR(read(external("weights.bin", "8", "12")), "external data has 12 bytes");
  EXPECT_IO_ERROR(read(external("weights.bin", "8x", "")), "offset '8x' is not a non-negative");
  EXPECT_IO_ERROR(read(external("weights.bin", "-8", "")), "offset '-8' is not a non-negative");
  EXPECT_IO_ERROR(read(external("weights.bin", "", "99999999999999999999")), "length '9999");
  EXPECT_IO_ERROR(read(external("missing.bin", "", "")), "external data file");
  EXPECT_IO_ERROR(read(external("", "8", "16")), "external data without a location");
  EXPECT_IO_ERROR(tensor_from_proto(external("weights.bin", "8", "16"), "t"), "no base directory");
  auto p = external("weights.bin", "8", "16");
  p.set_raw_data(std::string(16, '\0'));
  EXPECT_IO_ERROR(read(p), "data in more than one place: raw_data, external data");
  p = external("weights.bin", "8", "16");
  auto* e = p.add_external_data();
  e->set_key("offset");
  e->set_value("8");
  EXPECT_IO_ERROR(read(p), "external_data has two 'offset' entries");
}

TEST(TensorPb, ReadsOnnxTestData) {
  const std::string path =
      kOnnxNodeData + "/test_conv_with_strides_padding/test_data_set_0/input_0.pb";
  std::string name;
  const Tensor t = read_tensor_pb(path, &name);
  EXPECT_EQ(name, "x");
  ASSERT_EQ(t.dtype(), DType::f32);
  ASSERT_EQ(t.shape(), (Shape{1, 1, 7, 5}));
  // The ONNX test's input is 0, 1, ..., 34.
  for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.get(i), double(i));
}

TEST(TensorPb, EveryOnnxTestFileReadsOrFailsCleanly) {
  // Each .pb either converts or throws an Error (types we lack, sequence/optional protos).
  int converted = 0, refused = 0;
  for (const auto& test : fs::directory_iterator(kOnnxNodeData)) {
    const fs::path data_set = test.path() / "test_data_set_0";
    if (!fs::is_directory(data_set)) continue;
    for (const auto& file : fs::directory_iterator(data_set)) {
      if (file.path().extension() != ".pb") continue;
      const std::string message = iotest::error_message([&] { read_tensor_pb(file.path()); });
      if (message == "<no error>") {
        ++converted;
      } else {
        ASSERT_EQ(message.rfind("[tensor pb: ", 0), 0u) << message;
        ++refused;
      }
    }
  }
  std::printf("ONNX node test .pb files: %d converted, %d refused\n", converted, refused);
  EXPECT_GT(converted, 2000);
  EXPECT_GT(refused, 10);
}

TEST(TensorPb, FileRoundTrip) {
  iotest::ScratchDir dir;
  for (DType dtype : iotest::kAllDTypes) {
    const Tensor t = testing::random_tensor(dtype, {2, 3}, 5, -9, 9);
    write_tensor_pb(dir.file("t.pb"), t, "named");
    std::string name;
    EXPECT_TRUE(same_tensor(read_tensor_pb(dir.file("t.pb"), &name), t));
    EXPECT_EQ(name, "named");
  }
}

TEST(TensorPb, CorruptFiles) {
  iotest::ScratchDir dir;
  write_file_atomic(dir.file("junk.pb"), "\xff\xff\xff\xff");
  EXPECT_IO_ERROR(read_tensor_pb(dir.file("junk.pb")),
                  cat("[tensor pb: ", dir.file("junk.pb"),
                      "] not a serialized onnx.TensorProto (protobuf parsing failed)"));
  // Cut inside raw_data: the length-delimited field overruns.
  write_tensor_pb(dir.file("good.pb"), Tensor::zeros(DType::f32, {16}), "x");
  const std::string good = read_file(dir.file("good.pb"));
  write_file_atomic(dir.file("cut.pb"), good.substr(0, good.size() - 5));
  EXPECT_IO_ERROR(read_tensor_pb(dir.file("cut.pb")), "protobuf parsing failed");
  // An empty file is an empty (valid) proto with no data type.
  write_file_atomic(dir.file("empty.pb"), "");
  EXPECT_IO_ERROR(read_tensor_pb(dir.file("empty.pb")), "data type UNDEFINED (0) is not supported");
  EXPECT_IO_ERROR(read_tensor_pb(dir.file("missing.pb")), "cannot open");
}

TEST(TensorPb, ExternalDataIsRelativeToThePbFile) {
  iotest::ScratchDir dir;
  const std::vector<int64_t> values = {3, 1, 4};
  write_file_atomic(dir.file("data.bin"),
                    std::string(reinterpret_cast<const char*>(values.data()), 24));
  auto p = proto(onnx::TensorProto::INT64, {3}, "e");
  p.set_data_location(onnx::TensorProto::EXTERNAL);
  auto* e = p.add_external_data();
  e->set_key("location");
  e->set_value("data.bin");
  write_file_atomic(dir.file("e.pb"), p.SerializeAsString());
  EXPECT_TRUE(
      same_tensor(read_tensor_pb(dir.file("e.pb")), Tensor::from_vector<int64_t>({3}, values)));
}

}  // namespace
}  // namespace fusebox
