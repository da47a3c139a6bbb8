// Image folders and WebDataset tar shards (train/data.h) and the decoders under
// them (io/image.h): PNGs written here (zlib, by hand), a JPEG made once with libjpeg-turbo
// (16x8, one colour, quality 100), a truncated file of each, files that are no image; labels
// from the sorted class folders, pixels resized, cropped and normalised; errors that name the
// path for a missing folder, one without class folders, an empty class folder, and (with
// strict) an image that does not decode.
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>

#include "fusebox/io/image.h"
#include "fusebox/train/data.h"
#include "fusebox/train/image_stream.h"
#include "testing.h"
#include "train_test_util.h"

namespace fusebox::testing {
namespace {

namespace fs = std::filesystem;

// 16 x 8 pixels of RGB (200, 40, 90), as libjpeg-turbo wrote it (tests/unit/train: see above).
const std::vector<uint8_t> kJpeg = {
    0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10, 0x4a, 0x46, 0x49, 0x46, 0x00, 0x01, 0x01, 0x00, 0x00, 0x01,
    0x00, 0x01, 0x00, 0x00, 0xff, 0xdb, 0x00, 0x43, 0x00, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01,
    0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01,
    0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01,
    0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01,
    0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0xff, 0xdb, 0x00, 0x43, 0x01, 0x01, 0x01,
    0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01,
    0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01,
    0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01,
    0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0xff, 0xc0,
    0x00, 0x11, 0x08, 0x00, 0x08, 0x00, 0x10, 0x03, 0x01, 0x22, 0x00, 0x02, 0x11, 0x01, 0x03, 0x11,
    0x01, 0xff, 0xc4, 0x00, 0x1f, 0x00, 0x00, 0x01, 0x05, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09,
    0x0a, 0x0b, 0xff, 0xc4, 0x00, 0xb5, 0x10, 0x00, 0x02, 0x01, 0x03, 0x03, 0x02, 0x04, 0x03, 0x05,
    0x05, 0x04, 0x04, 0x00, 0x00, 0x01, 0x7d, 0x01, 0x02, 0x03, 0x00, 0x04, 0x11, 0x05, 0x12, 0x21,
    0x31, 0x41, 0x06, 0x13, 0x51, 0x61, 0x07, 0x22, 0x71, 0x14, 0x32, 0x81, 0x91, 0xa1, 0x08, 0x23,
    0x42, 0xb1, 0xc1, 0x15, 0x52, 0xd1, 0xf0, 0x24, 0x33, 0x62, 0x72, 0x82, 0x09, 0x0a, 0x16, 0x17,
    0x18, 0x19, 0x1a, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2a, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3a,
    0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0x4a, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5a,
    0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79, 0x7a,
    0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8a, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99,
    0x9a, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7,
    0xb8, 0xb9, 0xba, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9, 0xca, 0xd2, 0xd3, 0xd4, 0xd5,
    0xd6, 0xd7, 0xd8, 0xd9, 0xda, 0xe1, 0xe2, 0xe3, 0xe4, 0xe5, 0xe6, 0xe7, 0xe8, 0xe9, 0xea, 0xf1,
    0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8, 0xf9, 0xfa, 0xff, 0xc4, 0x00, 0x1f, 0x01, 0x00, 0x03,
    0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
    0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0xff, 0xc4, 0x00, 0xb5, 0x11, 0x00,
    0x02, 0x01, 0x02, 0x04, 0x04, 0x03, 0x04, 0x07, 0x05, 0x04, 0x04, 0x00, 0x01, 0x02, 0x77, 0x00,
    0x01, 0x02, 0x03, 0x11, 0x04, 0x05, 0x21, 0x31, 0x06, 0x12, 0x41, 0x51, 0x07, 0x61, 0x71, 0x13,
    0x22, 0x32, 0x81, 0x08, 0x14, 0x42, 0x91, 0xa1, 0xb1, 0xc1, 0x09, 0x23, 0x33, 0x52, 0xf0, 0x15,
    0x62, 0x72, 0xd1, 0x0a, 0x16, 0x24, 0x34, 0xe1, 0x25, 0xf1, 0x17, 0x18, 0x19, 0x1a, 0x26, 0x27,
    0x28, 0x29, 0x2a, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3a, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49,
    0x4a, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5a, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69,
    0x6a, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79, 0x7a, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88,
    0x89, 0x8a, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9a, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6,
    0xa7, 0xa8, 0xa9, 0xaa, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8, 0xb9, 0xba, 0xc2, 0xc3, 0xc4,
    0xc5, 0xc6, 0xc7, 0xc8, 0xc9, 0xca, 0xd2, 0xd3, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8, 0xd9, 0xda, 0xe2,
    0xe3, 0xe4, 0xe5, 0xe6, 0xe7, 0xe8, 0xe9, 0xea, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8, 0xf9,
    0xfa, 0xff, 0xda, 0x00, 0x0c, 0x03, 0x01, 0x00, 0x02, 0x11, 0x03, 0x11, 0x00, 0x3f, 0x00, 0xfc,
    0xef, 0xa2, 0x8a, 0x2b, 0xcf, 0x3f, 0xe9, 0x80, 0xff, 0xd9};

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(uint8_t(v >> shift));
}

// A PNG of 8-bit RGB, w x h, pixel (x, y) = rgb(x, y) (IHDR, one zlib IDAT of filter-0 rows,
// IEND).
std::vector<uint8_t> png_pattern(int w, int h,
                                 const std::function<std::array<uint8_t, 3>(int, int)>& rgb) {
  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  auto chunk = [&](const char* type, const std::vector<uint8_t>& data) {
    put_u32(out, uint32_t(data.size()));
    std::vector<uint8_t> typed(type, type + 4);
    typed.insert(typed.end(), data.begin(), data.end());
    out.insert(out.end(), typed.begin(), typed.end());
    put_u32(out, uint32_t(crc32(0, typed.data(), uInt(typed.size()))));
  };
  std::vector<uint8_t> ihdr;
  put_u32(ihdr, uint32_t(w));
  put_u32(ihdr, uint32_t(h));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // 8 bits, RGB, deflate, filter 0, no interlace
  chunk("IHDR", ihdr);
  std::vector<uint8_t> raw;
  for (int y = 0; y < h; ++y) {
    raw.push_back(0);
    for (int x = 0; x < w; ++x) {
      const std::array<uint8_t, 3> p = rgb(x, y);
      raw.insert(raw.end(), p.begin(), p.end());
    }
  }
  uLongf size = compressBound(uLong(raw.size()));
  std::vector<uint8_t> z(size);
  EXPECT_EQ(compress(z.data(), &size, raw.data(), uLong(raw.size())), Z_OK);
  z.resize(size);
  chunk("IDAT", z);
  chunk("IEND", {});
  return out;
}

// A PNG of one colour.
std::vector<uint8_t> png_of(int w, int h, uint8_t r, uint8_t g, uint8_t b) {
  return png_pattern(w, h, [&](int, int) { return std::array<uint8_t, 3>{r, g, b}; });
}

void write(const fs::path& path, const std::vector<uint8_t>& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// The value decode_image_folder gives channel c of an image of colour v.
float normalised(int c, double v) {
  const double mean[3] = {0.485, 0.456, 0.406}, stdev[3] = {0.229, 0.224, 0.225};
  return float((v / 255 - mean[c]) / stdev[c]);
}

class ImageFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (image_decoding() != "PNG and JPEG")
      GTEST_SKIP() << "this build decodes " << image_decoding();
    root_ = fs::temp_directory_path() / cat("fusebox_image_folder_", ::getpid());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
};

TEST_F(ImageFolderTest, DecodersReadPngAndJpegAndRefuseTheRest) {
  const DecodedImage png = decode_image(png_of(5, 3, 10, 20, 30), "a.png");
  EXPECT_EQ(png.height, 3);
  EXPECT_EQ(png.width, 5);
  ASSERT_EQ(png.rgb.size(), 45u);
  EXPECT_EQ(png.rgb[0], 10);
  EXPECT_EQ(png.rgb[44], 30);
  const DecodedImage jpeg = decode_image(kJpeg, "a.jpg");
  EXPECT_EQ(jpeg.height, 8);
  EXPECT_EQ(jpeg.width, 16);
  const int colour[3] = {200, 40, 90};
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(jpeg.rgb[size_t(c)], colour[c], 3);
  std::vector<uint8_t> short_png = png_of(5, 3, 1, 2, 3);
  short_png.resize(short_png.size() - 30);
  std::vector<uint8_t> short_jpeg(kJpeg.begin(), kJpeg.begin() + 300);
  for (const auto& [bytes, what] :
       {std::pair{short_png, "truncated.png"}, std::pair{short_jpeg, "truncated.jpg"},
        std::pair{std::vector<uint8_t>{'h', 'i'}, "text.png"},
        std::pair{std::vector<uint8_t>{}, "empty.jpg"}}) {
    SCOPED_TRACE(what);
    const std::string message = error_message([&] { decode_image(bytes, what); });
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }
  EXPECT_TRUE(is_image_path("x/Y.JPEG") && is_image_path("a.png") && !is_image_path("a.txt") &&
              !is_image_path("dir.png/readme"));
}

TEST_F(ImageFolderTest, ClassesFromFoldersImagesDecodedAndBadOnesSkipped) {
  write(root_ / "dog" / "b.png", png_of(12, 6, 0, 255, 0));  // resized to 8x4, cropped
  write(root_ / "cat" / "a.png", png_of(6, 6, 255, 0, 0));
  write(root_ / "dog" / "c.jpg", kJpeg);
  std::vector<uint8_t> broken = png_of(6, 6, 1, 1, 1);
  broken.resize(40);
  write(root_ / "dog" / "broken.png", broken);
  write(root_ / "dog" / "readme.txt", {'h', 'i'});
  const ImageFolder folder = scan_image_folder(root_.string());
  EXPECT_EQ(folder.classes, (std::vector<std::string>{"cat", "dog"}));
  ASSERT_EQ(folder.files.size(), 4u);  // a.png; b.png, broken.png, c.jpg
  EXPECT_EQ(folder.ignored, 1);
  const DecodedFolder decoded = decode_image_folder(folder, 4, /*strict=*/false);
  EXPECT_EQ(decoded.skipped, 1);
  EXPECT_NE(decoded.first_skipped.find("broken.png"), std::string::npos) << decoded.first_skipped;
  ASSERT_EQ(decoded.data.x.shape(), (Shape{3, 3, 4, 4}));
  EXPECT_EQ(decoded.data.y.values<int64_t>()[0], 0);
  EXPECT_EQ(decoded.data.y.values<int64_t>()[1], 1);
  EXPECT_EQ(decoded.data.y.values<int64_t>()[2], 1);
  const std::span<const float> x = decoded.data.x.values<float>();
  const double colours[3][3] = {{255, 0, 0}, {0, 255, 0}, {200, 40, 90}};
  for (int image = 0; image < 3; ++image)
    for (int c = 0; c < 3; ++c)
      for (int p = 0; p < 16; ++p)
        EXPECT_NEAR(x[size_t((image * 3 + c) * 16 + p)], normalised(c, colours[image][c]),
                    image == 2 ? 0.06 : 1e-5)
            << "image " << image << " channel " << c;
  const std::string strict =
      error_message([&] { decode_image_folder(folder, 4, /*strict=*/true); });
  EXPECT_NE(strict.find("broken.png"), std::string::npos) << strict;
}

TEST_F(ImageFolderTest, BadFoldersAreErrorsNamingThePath) {
  const std::string missing = error_message([&] { scan_image_folder((root_ / "nope").string()); });
  EXPECT_NE(missing.find("nope"), std::string::npos) << missing;
  write(root_ / "flat" / "a.png", png_of(2, 2, 1, 2, 3));
  const std::string flat = error_message([&] { scan_image_folder((root_ / "flat").string()); });
  EXPECT_NE(flat.find("no class folders"), std::string::npos) << flat;
  write(root_ / "set" / "cat" / "a.png", png_of(2, 2, 1, 2, 3));
  write(root_ / "set" / "dog" / "notes.txt", {'x'});
  const std::string empty = error_message([&] { scan_image_folder((root_ / "set").string()); });
  EXPECT_NE(empty.find("'dog' holds no image"), std::string::npos) << empty;
}

// A ustar archive of `members` (name, bytes), as tar and WebDataset's writers lay it out.
std::string tar_of(const std::vector<std::pair<std::string, std::string>>& members) {
  std::string out;
  for (const auto& [name, bytes] : members) {
    std::string header(512, '\0');
    header.replace(0, name.size(), name);
    auto octal = [&](size_t offset, size_t width, uint64_t value) {
      char digits[32];
      std::snprintf(digits, sizeof digits, "%0*llo", int(width - 1), (unsigned long long)value);
      header.replace(offset, width - 1, digits);
    };
    octal(100, 8, 0644);
    octal(124, 12, bytes.size());
    header[156] = '0';
    header.replace(257, 6, std::string("ustar\0", 6));
    header.replace(263, 2, "00");
    header.replace(148, 8, "        ");
    uint64_t sum = 0;
    for (char c : header) sum += static_cast<unsigned char>(c);
    octal(148, 7, sum);
    out += header + bytes + std::string((512 - bytes.size() % 512) % 512, '\0');
  }
  return out + std::string(1024, '\0');
}

std::string as_string(const std::vector<uint8_t>& bytes) {
  return {bytes.begin(), bytes.end()};
}

TEST_F(ImageFolderTest, TarShardsAsWebDatasetWritesThem) {
  fs::create_directories(root_);
  const std::string red = as_string(png_of(6, 6, 255, 0, 0)),
                    green = as_string(png_of(8, 6, 0, 255, 0));
  std::string broken = red.substr(0, 40);
  auto shard = [&](const std::string& name, const std::string& bytes) {
    std::ofstream((root_ / name).string(), std::ios::binary) << bytes;
  };
  shard("s-00.tar", tar_of({{"a/0001.png", red},
                            {"a/0001.cls", "1\n"},
                            {"a/0002.json", "{}"},  // a sample without an image
                            {"a/0003.png", broken},
                            {"a/0003.cls", "0"}}));
  shard("s-01.tar", tar_of({{"0004.cls", " 0 "}, {"0004.PNG", green}}));
  const ImageShards shards = read_image_shards((root_ / "s-{00..01}.tar").string());
  ASSERT_EQ(shards.shards.size(), 2u);
  ASSERT_EQ(shards.samples.size(), 3u);
  EXPECT_EQ(shards.ignored, 1);
  EXPECT_EQ(shards.classes, 2);
  EXPECT_EQ(shards.samples[2].label, 0);
  const DecodedFolder decoded = decode_image_shards(shards, 4, /*strict=*/false);
  EXPECT_EQ(decoded.skipped, 1);
  EXPECT_NE(decoded.first_skipped.find("s-00.tar:a/0003.png"), std::string::npos)
      << decoded.first_skipped;
  ASSERT_EQ(decoded.data.x.shape(), (Shape{2, 3, 4, 4}));
  EXPECT_EQ(decoded.data.y.values<int64_t>()[0], 1);
  EXPECT_NEAR(decoded.data.x.values<float>()[16], normalised(1, 0), 1e-5);  // red: no green
  // What is wrong names the shard (and the sample).
  auto error_of = [&](const std::string& pattern) {
    return error_message([&] { read_image_shards((root_ / pattern).string()); });
  };
  EXPECT_NE(error_of("s-{00..02}.tar").find("s-02.tar"), std::string::npos);
  shard("nolabel.tar", tar_of({{"k.png", red}}));
  EXPECT_NE(error_of("nolabel.tar").find("sample 'k' of"), std::string::npos);
  shard("badlabel.tar", tar_of({{"k.png", red}, {"k.cls", "cat"}}));
  EXPECT_NE(error_of("badlabel.tar").find("not a class number"), std::string::npos);
  std::string corrupt = tar_of({{"k.png", red}, {"k.cls", "1"}});
  corrupt[10] ^= 0x20;  // the name changes, the checksum does not
  shard("corrupt.tar", corrupt);
  EXPECT_NE(error_of("corrupt.tar").find("checksum"), std::string::npos);
  shard("short.tar", tar_of({{"k.png", red}, {"k.cls", "1"}}).substr(0, 700));
  EXPECT_NE(error_of("short.tar").find("truncated"), std::string::npos);
  EXPECT_NE(error_of("s-{03..01}.tar").find("first <= last"), std::string::npos);
}

// A scan reads the tars' headers and labels; each image is read from its shard when asked for:
// bytes written into the shard after the scan are what comes back, and a shard cut short
// after it is an Error naming the sample.
TEST_F(ImageFolderTest, ShardImagesAreReadWhenAskedFor) {
  fs::create_directories(root_);
  const fs::path path = root_ / "s.tar";
  auto write = [&](const std::string& first, const std::string& second) {
    std::ofstream(path.string(), std::ios::binary | std::ios::trunc)
        << tar_of({{"k1.jpg", first}, {"k1.cls", "3"}, {"k2.png", second}, {"k2.cls", "1"}});
  };
  write(std::string(700, 'a'), std::string(20, 'b'));
  const ImageShards shards = read_image_shards(path.string());
  ASSERT_EQ(shards.samples.size(), 2u);
  EXPECT_EQ(shards.samples[0].size, 700u);
  EXPECT_EQ(shards.samples[0].offset, 512u);
  EXPECT_EQ(shards.classes, 4);
  write(std::string(700, 'x'), std::string(20, 'y'));  // the same layout, other bytes
  const LabelledImage first = shard_image(shards, 0), second = shard_image(shards, 1);
  EXPECT_EQ(std::string(first.bytes.begin(), first.bytes.end()), std::string(700, 'x'));
  EXPECT_EQ(first.label, 3);
  EXPECT_EQ(std::string(second.bytes.begin(), second.bytes.end()), std::string(20, 'y'));
  EXPECT_EQ(second.name, path.string() + ":k2.png");
  fs::resize_file(path, 600);
  const std::string error = error_message([&] { shard_image(shards, 0); });
  EXPECT_NE(error.find(path.string() + ":k1.jpg"), std::string::npos) << error;
  EXPECT_NE(error.find("changed since it was scanned"), std::string::npos) << error;
  EXPECT_THROW(shard_image(shards, 2), std::out_of_range);
}

// Truncated and bit-flipped PNGs, JPEGs and tar shards (a small fuzz of the parsers users'
// files reach): each decodes or is a fusebox::Error, nothing else.
TEST_F(ImageFolderTest, MutatedFilesDecodeOrAreErrors) {
  fs::create_directories(root_);
  const std::vector<uint8_t> png = png_of(9, 7, 10, 200, 30);
  const std::string tar = tar_of({{"k.png", as_string(png)}, {"k.cls", "1"}});
  uint64_t state = 99;
  auto next = [&](uint64_t bound) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % bound;
  };
  auto mutate = [&](std::string bytes) {
    if (next(2) == 0) bytes.resize(next(bytes.size() + 1));
    for (uint64_t flips = next(8); flips > 0 && !bytes.empty(); --flips)
      bytes[next(bytes.size())] ^= char(1 + next(255));
    return bytes;
  };
  int errors = 0;
  for (int i = 0; i < 1500; ++i) {
    const int kind = i % 3;
    const std::string source = kind == 0 ? as_string(png) : kind == 1 ? as_string(kJpeg) : tar;
    const std::string bytes = mutate(source);
    SCOPED_TRACE(cat("case ", i, " kind ", kind, " bytes ", bytes.size()));
    try {
      if (kind < 2) {
        decode_image({bytes.begin(), bytes.end()}, "mutated");
      } else {
        const fs::path shard = root_ / "m.tar";
        std::ofstream(shard.string(), std::ios::binary) << bytes;
        decode_image_shards(read_image_shards(shard.string()), 4, /*strict=*/true);
      }
    } catch (const Error&) {
      ++errors;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a fusebox::Error: " << e.what();
    }
  }
  EXPECT_GT(errors, 300);  // the mutations do break files
}

// The CPU path end to end: `fusebox train small_cnn --data DIR` learns two classes of PNGs
// (each image its class's colour with noise), naming the classes and what it skipped.
TEST_F(ImageFolderTest, TrainLearnsAFolderOfPngs) {
  uint64_t state = 7;
  auto noise = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return int(state >> 59);  // 0..31
  };
  for (int i = 0; i < 8; ++i) {
    write(root_ / "red" / cat("r", i, ".png"), png_of(20, 16, uint8_t(200 + noise()), 30, 30));
    write(root_ / "blue" / cat("b", i, ".png"), png_of(16, 20, 30, 30, uint8_t(200 + noise())));
  }
  write(root_ / "blue" / "bad.jpg", {0xff, 0xd8, 0xff, 0x00});
  // `fusebox train small_cnn --data <data>`'s output; its loss falls.
  auto train_on = [&](const std::string& data, const std::string& more = "") {
    const fs::path out = root_ / "stdout.txt";
    const std::string command =
        cat("'", FUSEBOX_TOOL_PATH, "' train small_cnn --data '", data,
            "' --image-size 16 --batch-size 8 --shuffle --steps 16 --log-every 4 ", more, " > '",
            out.string(), "' 2>&1");
    const int status = std::system(command.c_str());
    std::stringstream text;
    text << std::ifstream(out).rdbuf();
    const std::string log = text.str();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
    std::vector<double> losses;
    const std::regex line(R"(step +\d+/\d+ +loss ([0-9.]+))");
    for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
         ++it)
      losses.push_back(std::stod((*it)[1]));
    EXPECT_EQ(losses.size(), 4u) << log;
    if (!losses.empty()) EXPECT_LT(losses.back(), losses.front() * 0.7) << log;
    return log;
  };
  // Decoded as the run draws them: the bad file is found then, counted and named at the end.
  const std::string log = train_on(root_.string());
  EXPECT_NE(log.find("17 images of 2 classes, decoded as drawn to 3x16x16 (4 batches ahead), "
                     "resize and centre crop"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("--data: 1 image skipped (does not decode; the first: ["), std::string::npos)
      << log;
  EXPECT_NE(log.find("bad.jpg]"), std::string::npos) << log;
  EXPECT_NE(log.find("classes: 0=blue 1=red"), std::string::npos) << log;
  // With the training augmentations (crops of one colour are that colour) it learns too.
  const std::string augmented =
      train_on(root_.string(), "--augment --read-ahead 2 --data-threads 1");
  EXPECT_NE(augmented.find("(2 batches ahead), random-resized-crop and flip"), std::string::npos)
      << augmented;

  // The same kind of images as two tar shards (key.png + key.cls) train the same way.
  std::vector<std::pair<std::string, std::string>> members[2];
  for (int i = 0; i < 16; ++i) {
    const bool is_red = i % 2 == 1;
    const std::string key = cat("k", i);
    const std::vector<uint8_t> png = is_red ? png_of(20, 16, uint8_t(200 + noise()), 30, 30)
                                            : png_of(16, 20, 30, 30, uint8_t(200 + noise()));
    members[i / 8].push_back({key + ".png", as_string(png)});
    members[i / 8].push_back({key + ".cls", is_red ? "1" : "0"});
  }
  for (int k = 0; k < 2; ++k)
    std::ofstream((root_ / cat("shard-", k, ".tar")).string(), std::ios::binary)
        << tar_of(members[k]);
  const std::string shards_log = train_on((root_ / "shard-{0..1}.tar").string());
  EXPECT_NE(shards_log.find("16 images of 2 classes, decoded as drawn to 3x16x16"),
            std::string::npos)
      << shards_log;
}

// A folder of patterned PNGs of several sizes (2 classes), for the streams below.
std::shared_ptr<const ImageFolder> patterned_folder(const fs::path& root) {
  const int sizes[][2] = {{12, 9}, {9, 12}, {10, 10}, {16, 7}, {7, 16}, {11, 13}};
  for (int i = 0; i < 6; ++i) {
    const auto [w, h] = sizes[i];
    write(root / (i % 2 ? "dog" : "cat") / cat("img", i, ".png"),
          png_pattern(w, h, [&, w = w, h = h](int x, int y) {
            return std::array<uint8_t, 3>{uint8_t(x * 255 / (w - 1)), uint8_t(y * 255 / (h - 1)),
                                          uint8_t(40 * i)};
          }));
  }
  return std::make_shared<const ImageFolder>(scan_image_folder(root.string()));
}

// Without augmentation a stream's batches are the decoded folder's BatchSampler's, bit for bit,
// whichever batch is asked first.
TEST_F(ImageFolderTest, StreamWithoutAugmentationIsTheDecodedFoldersBatches) {
  const auto folder = patterned_folder(root_);
  const Dataset all = decode_image_folder(*folder, 8, true).data;
  const BatchSampler sampler(all, 4, true, 5);
  ImageStream stream(int64_t(folder->files.size()), folder_images(folder), 4, {.size = 8}, true, 5,
                     true, 2, 2, "test");
  for (int64_t i : {0, 1, 2, 5, 3, 9}) {  // 3 after 5: asked again after being dropped
    const auto [x, y] = stream.batch(i);
    const auto [want_x, want_y] = sampler.batch(i);
    EXPECT_TRUE(same_bits(x, want_x)) << "batch " << i;
    EXPECT_TRUE(same_bits(y, want_y)) << "batch " << i;
  }
  EXPECT_EQ(stream.skipped(), 0);
}

// Augmented batches are a function of (index, seed): one thread reading one batch ahead and
// three threads reading four ahead, asked in other orders, give the same bytes; another seed
// other ones.
TEST_F(ImageFolderTest, AugmentedStreamDependsOnlyOnIndexAndSeed) {
  const auto folder = patterned_folder(root_);
  const int64_t n = int64_t(folder->files.size());
  const ImageTransform augment{.size = 8, .augment = true};
  ImageStream one(n, folder_images(folder), 3, augment, true, 7, true, 1, 1, "one");
  ImageStream three(n, folder_images(folder), 3, augment, true, 7, true, 4, 3, "three");
  ImageStream other_seed(n, folder_images(folder), 3, augment, true, 8, true, 1, 1, "other");
  ImageStream plain(n, folder_images(folder), 3, {.size = 8}, true, 7, true, 1, 1, "plain");
  std::map<int64_t, Tensor> first;
  for (int64_t i = 0; i < 6; ++i) first[i] = one.batch(i).first;
  for (int64_t i : {4, 0, 5, 1, 2, 3}) {
    const auto [x, y] = three.batch(i);
    EXPECT_TRUE(same_bits(x, first[i])) << "batch " << i;
  }
  EXPECT_FALSE(same_bits(other_seed.batch(0).first, first[0]));
  EXPECT_FALSE(same_bits(plain.batch(0).first, first[0]));
  for (int64_t i = 0; i < 6; ++i)  // normalised values of 0..255
    for (int64_t k = 0; k < first[i].numel(); ++k)
      ASSERT_TRUE(first[i].get(k) >= -2.2 && first[i].get(k) <= 2.7) << first[i].get(k);
}

// With the whole image as the box (scale 1, the image's own ratio), an augmented sample is the
// image itself or its mirror, both of which occur.
TEST_F(ImageFolderTest, AugmentedStreamFlipsHalfTheImages) {
  const int w = 8;
  write(root_ / "a" / "x.png", png_pattern(w, w, [](int x, int y) {
          return std::array<uint8_t, 3>{uint8_t(30 * x), uint8_t(20 * y), 7};
        }));
  const auto folder = std::make_shared<const ImageFolder>(scan_image_folder(root_.string()));
  const ImageTransform whole{
      .size = w, .augment = true, .scale_min = 1.0, .ratio_min = 1.0, .ratio_max = 1.0};
  ImageStream stream(1, folder_images(folder), 16, whole, false, 3, true, 1, 1, "flip");
  const Tensor x = stream.batch(0).first;
  int flipped = 0, kept = 0;
  for (int64_t b = 0; b < 16; ++b) {
    bool same = true, mirror = true;
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < w; ++y)
        for (int col = 0; col < w; ++col) {
          const double v = x.get(((b * 3 + c) * w + y) * w + col);
          const int xs[2] = {col, w - 1 - col};
          for (int m = 0; m < 2; ++m) {
            const double pixel = c == 0 ? 30 * xs[m] : c == 1 ? 20 * y : 7;
            if (std::abs(v - normalised(c, pixel)) > 1e-5) (m ? mirror : same) = false;
          }
        }
    ASSERT_TRUE(same || mirror) << "sample " << b;
    flipped += mirror && !same, kept += same;
  }
  EXPECT_GT(flipped, 0);
  EXPECT_GT(kept, 0);
}

// An image that does not decode is counted once, named, and replaced by the stream's next one
// (every batch full); with strict it is the batch's Error, naming the file.
TEST_F(ImageFolderTest, StreamSkipsAnImageThatDoesNotDecode) {
  write(root_ / "a" / "0.png", png_of(9, 9, 10, 20, 30));
  std::vector<uint8_t> truncated = png_of(9, 9, 1, 2, 3);
  truncated.resize(truncated.size() / 2);
  write(root_ / "a" / "1.png", truncated);
  write(root_ / "b" / "2.png", png_of(9, 9, 200, 100, 0));
  const auto folder = std::make_shared<const ImageFolder>(scan_image_folder(root_.string()));
  ImageStream stream(3, folder_images(folder), 3, {.size = 4}, false, 0, false, 2, 2, "skip");
  for (int64_t i = 0; i < 3; ++i) {
    const auto [x, y] = stream.batch(i);
    for (int64_t b = 0; b < 3; ++b)  // image 1 is image 2 (class b) in every batch
      EXPECT_EQ(y.get(b), b == 0 ? 0 : 1) << "batch " << i << " sample " << b;
  }
  EXPECT_EQ(stream.skipped(), 1);
  EXPECT_NE(stream.first_skipped().find("1.png"), std::string::npos) << stream.first_skipped();
  ImageStream strict(3, folder_images(folder), 3, {.size = 4}, false, 0, true, 1, 1, "strict");
  try {
    strict.batch(0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--strict-data"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1.png"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fusebox::testing
