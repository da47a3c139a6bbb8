// The training input pipeline's decoding rate (issue 42): `fusebox train --data`'s stream of
// images (train/image_stream.h: read, decode, crop and resize, normalise, on worker threads) on
// its own, with nothing else running, for each thread count asked. A row: images per second
// over --batches batches after the first (which waits for the threads to start), and the
// milliseconds one image takes a thread. The step a stream must keep up with: a GPU's training
// images per second (an H200's ResNet-50 bf16 batch 256 ~6,100 img/s), or the CPU backend's.
//
//   bench_image_stream --data DIR|SHARDS.tar [--size 224] [--batch 64] [--batches 8]
//                      [--threads 1,2,4] [--augment] [--json FILE]
#include <chrono>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/report.h"
#include "common/table.h"
#include "fusebox/core/error.h"
#include "fusebox/train/image_stream.h"

namespace fb = fusebox;

namespace {

struct Config {
  std::string data, threads = "1,2,4", json;
  int64_t size = 224, batch = 64, batches = 8;
  bool augment = false;
};

std::vector<int> thread_counts(const std::string& list) {
  std::vector<int> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    const int t = std::stoi(item);
    FUSEBOX_CHECK(t >= 1, "--threads", "each count must be >= 1, got ", t);
    out.push_back(t);
  }
  return out;
}

int run(const Config& c) {
  std::function<fb::LabelledImage(int64_t)> images;
  int64_t count = 0;
  const bool tar = c.data.size() >= 4 && c.data.compare(c.data.size() - 4, 4, ".tar") == 0;
  if (tar || c.data.find('{') != std::string::npos) {
    auto shards = std::make_shared<const fb::ImageShards>(fb::read_image_shards(c.data));
    count = int64_t(shards->samples.size());
    images = fb::shard_images(shards);
  } else {
    auto folder = std::make_shared<const fb::ImageFolder>(fb::scan_image_folder(c.data));
    count = int64_t(folder->files.size());
    images = fb::folder_images(folder);
  }
  std::printf("%s: %lld images, batch %lld, %lld x %lld, %s, %lld batches timed\n", c.data.c_str(),
              (long long)count, (long long)c.batch, (long long)c.size, (long long)c.size,
              c.augment ? "random-resized-crop and flip" : "resize and crop", (long long)c.batches);
  fb::bench::Table table({{"threads", 8}, {"img/s", 10}, {"ms/image/thread", 16}});
  table.print_header();
  fb::bench::Json rows = fb::bench::Json::array();
  for (const int threads : thread_counts(c.threads)) {
    fb::ImageStream stream(count, images, c.batch, {.size = c.size, .augment = c.augment}, true, 0,
                           false, threads, threads, "bench");
    stream.batch(0);  // the threads started, the first batches decoding
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 1; i <= c.batches; ++i) stream.batch(i);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double per_second = double(c.batches * c.batch) / seconds;
    const double ms_per_image = 1000.0 * threads / per_second;
    table.print_row({std::to_string(threads), fb::bench::fixed(per_second, 1),
                     fb::bench::fixed(ms_per_image, 2)});
    rows.push(fb::bench::Json::object()
                  .set("threads", threads)
                  .set("images_per_s", per_second)
                  .set("ms_per_image_per_thread", ms_per_image)
                  .set("skipped", stream.skipped()));
  }
  fb::bench::Json report = fb::bench::report("image_stream");
  report.set("data", c.data)
      .set("images", count)
      .set("size", c.size)
      .set("batch", c.batch)
      .set("augment", c.augment)
      .set("rows", rows);
  fb::bench::write_report(c.json, report);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  fb::bench::Cli cli("bench_image_stream", "The training input pipeline's decoding rate", c.json);
  cli.app()
      .add_option("--data", c.data, "A folder of class folders, or WebDataset shards")
      ->required();
  cli.add_count("--size", c.size, "The square the images become");
  cli.add_count("--batch", c.batch, "Images a batch");
  cli.add_count("--batches", c.batches, "Batches timed");
  cli.app()
      .add_option("--threads", c.threads, "Thread counts, comma-separated")
      ->capture_default_str();
  cli.app().add_flag("--augment", c.augment, "Random-resized-crop and flip");
  return cli.run(argc, argv, [&] { return run(c); });
}
