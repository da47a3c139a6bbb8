// libFuzzer target for the image files `fusebox train --data` reads (issue 42's folders and
// shards): the bytes are decoded as a PNG or JPEG (io/image.h) and, written to a file, read
// as a WebDataset tar shard and its images decoded (train/data.h).
//
// The property: a decoded image has height x width x 3 bytes, a decoded shard set matches its
// samples, or the input is refused with a fusebox::Error. Anything else aborts and is a bug:
// another exception type, a crash, or an ASan/UBSan report. The normal build replays
// tests/data/fuzz_images through it under ctest (replay_main.cpp).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "fusebox/core/error.h"
#include "fusebox/io/image.h"
#include "fusebox/train/data.h"

namespace {

[[noreturn]] void bug(const std::string& what) {
  std::fprintf(stderr, "fuzz_image_files: BUG: %s\n", what.c_str());
  std::abort();
}

template <class F>
void refused_or_ok(const char* what, F&& f) {
  try {
    f();
  } catch (const fusebox::Error&) {
  } catch (const std::exception& e) {
    bug(std::string(what) + ": not a fusebox::Error: " + e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> bytes(data, data + size);
  refused_or_ok("decode_image", [&] {
    const fusebox::DecodedImage image = fusebox::decode_image(bytes, "input");
    if (image.height <= 0 || image.width <= 0 ||
        image.rgb.size() != size_t(image.height) * size_t(image.width) * 3)
      bug("decode_image: an image whose size does not match its bytes");
  });
  static const std::string shard = (std::filesystem::temp_directory_path() /
                                    ("fuzz_image_files_" + std::to_string(::getpid()) + ".tar"))
                                       .string();
  std::ofstream(shard, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), std::streamsize(size));
  refused_or_ok("read_image_shards", [&] {
    const fusebox::ImageShards shards = fusebox::read_image_shards(shard);
    const fusebox::DecodedFolder decoded = fusebox::decode_image_shards(shards, 8, false);
    if (decoded.data.size() + decoded.skipped != int64_t(shards.samples.size()))
      bug("decode_image_shards: samples lost");
  });
  return 0;
}
